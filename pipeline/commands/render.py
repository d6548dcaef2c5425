"""`graph --out FILE`: the full task graph as JSON, or a per-unit summary picture (SVG/PNG/DOT).

Thousands of tasks do not fit in a picture, so the picture collapses them: one node per shard, one per unit
(labelled with its task count), one for publish; an edge from a shard to each unit that reads from it. The
straddling unit is the one with two incoming shard edges, drawn in red.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import graphviz

from pipeline import cache
from pipeline.jobs.prepare import prepare
from pipeline.jobs.graph import GraphInputs, ancestors, build_graph, dependencies
from tasks.entries.manifest import array_documents
from tasks.entries.names import tmp_name
from tasks.places import InFolder
from tasks.errors import ConfigError


def graph_inputs(opts) -> GraphInputs:
    """What a convert with `opts` would build its graph from. Nothing is converted and no entry is written, but
    `prepare` reads the shard headers and hashes any shard without an HF blob name (remembered in `sources/`)."""

    p = prepare(opts)
    return GraphInputs(plan=p.plan, checkpoint=p.checkpoint, slots=p.slots,
                       place=InFolder(str(cache.entries_dir(p.root) / tmp_name(p.name, 0, "graph")),
                                      str(cache.entries_dir(p.root) / p.name)),
                       expected_identity=dict(p.identity.shards), done={},
                       identity=p.identity, arrays=array_documents(p.plan, p.slots))


def graph_for(opts) -> tuple[dict, str]:
    """The graph a convert with `opts` would run."""
    inputs = graph_inputs(opts)
    return build_graph(inputs), inputs.plan.version


def graph_json(graph: dict) -> dict:
    deps = dependencies(graph)
    return {"tasks": [{"key": list(k), "deps": sorted(list(d) for d in deps[k])} for k in graph]}


def unit_summary(graph: dict) -> dict[str, dict]:
    """Per unit: its task count and the shards its tasks read from."""
    out = {}
    for key in graph:
        if key[0] == "unit":
            up = ancestors(graph, key)
            out[key[1]] = {"tasks": len(up) + 1, "shards": sorted(k[1] for k in up if k[0] == "verify")}
    return dict(sorted(out.items(), key=lambda item: _natural(item[0])))


def _natural(name: str) -> list:
    """Numbers as numbers: blocks.2 before blocks.10."""
    return [int(part) if part.isdecimal() else part for part in re.split(r"(\d+)", name)]


OUT_SUFFIXES = (".svg", ".png", ".pdf", ".dot", ".json")


def write_graph(opts, out: Path, stream=None) -> dict:
    """The graph as a picture, DOT text or the task list as JSON in `out`; `out` "-": the JSON on `stream`."""
    if str(out) == "-":
        graph, _ = graph_for(opts)
        json.dump(graph_json(graph), stream)
        stream.write("\n")
        return {"out": "-", "tasks": len(graph)}
    if out.suffix not in OUT_SUFFIXES:
        raise ConfigError(f"{out}: --out must end in {', '.join(OUT_SUFFIXES)} (a picture, DOT text, or the task list "
                          "as JSON)")
    graph, version = graph_for(opts)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".json":
        out.write_text(json.dumps(graph_json(graph)))
        return {"out": str(out), "tasks": len(graph)}

    units = unit_summary(graph)
    dot = graphviz.Digraph(f"{version} conversion", graph_attr={"rankdir": "LR", "label": f"{version}: {len(graph)} tasks", "fontsize": "20"})
    shards = sorted({s for u in units.values() for s in u["shards"]})
    for s in shards:
        dot.node(s, f"{s}\\nindex -> verify", shape="cylinder", style="filled", fillcolor="lightblue")
    for unit, info in units.items():
        straddles = len(info["shards"]) > 1
        dot.node(unit, f"{unit}\\n{info['tasks']} tasks", shape="box", style="filled",
                 fillcolor="salmon" if straddles else "white", color="red" if straddles else "black")
        for s in info["shards"]:
            dot.edge(s, unit, color="red" if straddles else "gray")
        dot.edge(unit, "publish", color="gray")
    dot.node("publish", "publish\\n(manifest, rename)", shape="doubleoctagon")
    picture = None
    if out.suffix == ".dot" or shutil.which("dot") is None:
        path = out.with_suffix(".dot")
        path.write_text(dot.source)
        if out.suffix != ".dot":  # the picture needs Graphviz's `dot` program, which nothing here installs
            picture = (f"for the {out.suffix.lstrip('.')} picture, install Graphviz (which gives `dot`: "
                       f"https://graphviz.org/download/) and run the command again, or `dot -T{out.suffix.lstrip('.')} "
                       f"{path} -o {out}`")
    else:
        path = Path(dot.render(outfile=str(out), format=out.suffix.lstrip("."), cleanup=True))
    return {"out": str(path), "tasks": len(graph), "units": len(units),
            "straddling": [u for u, i in units.items() if len(i["shards"]) > 1], "picture": picture}
