"""The README's headline table, made from the results files the benchmarks wrote, so that it cannot say what was
not measured: one row per headline figure, with its goal, the machine and date the file records, and the command
that wrote it. `python -m bench.headline` prints the table; `--readme` writes it into README.md between its two
markers. tests/test_headline.py fails when README.md's table is not the one these files give."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from bench.harness import BENCH, median

README = BENCH.parent / "README.md"
BEGIN, END = "<!-- headline table: python -m bench.headline --readme -->", "<!-- end of the headline table -->"


@dataclass(frozen=True)
class Headline:
    what: str
    results: str                      # the file under bench/
    figure: Callable[[dict], float]   # the figure, computed from that file's contents
    goal: float                       # the figure must be at most this
    digits: int = 2


def _metric(name: str) -> Callable[[dict], float]:
    return lambda doc: next(m["ratio"] for m in doc["metrics"] if m["metric"] == name)


def _ratio(ours: str, theirs: str, key: str = "seconds", over: str | None = None) -> Callable[[dict], float]:
    """median(ours[key]) / median(theirs[over or key]), from a `runs` of bench/harness.py's children."""
    return lambda doc: median(doc["runs"][ours], key) / median(doc["runs"][theirs], over or key)


HEADLINES = [
    Headline("the port's model from the cache / the port's own start-up (N1.6, wall in child)", "handoff-results.json",
             _metric("handoff / port start-up (wall in child)"), 0.05, 3),
    Headline("tt-n16 convert / the port's own `load_file` + `from_torch` path", "port-results.json",
             _metric("port: convert / port_path (wall in child)"), 0.6),
    Headline("one-embodiment reload into ttnn / tt-metal's `as_tensor` cache, warm", "port-results.json",
             _metric("port: reload / as_tensor_warm (wall in child)"), 0.5),
    Headline("fine-tune convert after the release / its floor, copying the files it wrote, synced (N1.6, mixed F32)",
             "finetune-results.json", _ratio("fine-tune, release cached", "floor: copying the files it wrote, synced"),
             1.5),
    Headline("fine-tune bytes written / its changed targets' bytes", "finetune-results.json",
             _ratio("fine-tune, release cached", "fine-tune, release cached", "bytes", "changed_bytes"), 1.05, 3),
    Headline("all-F32 N1.7 cold convert, one file / the bf16 release's", "f32-results.json",
             _ratio("F32, one file (LeRobot)", "release (bf16), cold"), 1.2),
    Headline("convert into the bucket through 1% cuts and 1% `503 SlowDown` / without them",
             "network-faults-full-results.json", lambda doc: doc["faults_over_clean"]["convert_wall_s"], 1.3),
    Headline("one-embodiment load from the bucket through the same faults / without them",
             "network-faults-full-results.json", lambda doc: doc["faults_over_clean"]["load_wall_s"], 1.3),
    Headline("a second fine-tune's load from the bucket: bytes fetched / bytes in which the entries differ",
             "bucket-finetune-full-results.json", lambda doc: doc["fine_tune_load_fetched_over_differ"], 1.05),
]


def _recorded(doc: dict) -> tuple[str, str, str]:
    """(date, machine, command) as the file records them: bench/tables.py's `context`, or a flat file's own."""
    ctx = doc.get("context", doc)
    date = str(ctx.get("date") or ctx.get("measured") or "not recorded")[:10]
    machine = ctx.get("machine", "not recorded")
    if "cores" in ctx:
        machine = f"{ctx['cores']} cores, {machine}"
    return date, machine, ctx.get("command") or "not recorded"


def table(bench: Path = BENCH) -> str:
    rows = ["| what | figure | goal | date | machine | command |", "|---|---|---|---|---|---|"]
    for h in HEADLINES:
        doc = json.loads((bench / h.results).read_text())
        figure = h.figure(doc)
        met = "met" if figure <= h.goal else "not met"
        goal = f"≤ {h.goal:g}, {met}"
        date, machine, command = _recorded(doc)
        rows.append(f"| {h.what} | {figure:.{h.digits}f} | {goal} | {date} | {machine} | `{command}` |")
    return "\n".join(rows) + "\n"


def with_table(readme: str, made: str) -> str:
    """`readme` with its headline table replaced by `made`; a README without both markers is an error."""
    head, begin, rest = readme.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise SystemExit(f"{README}: the headline table's markers are missing ({BEGIN!r} ... {END!r}); put them back "
                         "where the table goes")
    return f"{head}{BEGIN}\n{made}{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.headline", description=__doc__.split("\n\n")[0])
    p.add_argument("--readme", action="store_true", help="write the table into README.md between its markers")
    a = p.parse_args(argv)
    made = table()
    if a.readme:
        README.write_text(with_table(README.read_text(), made))
        print(f"wrote the headline table into {README}")
    else:
        sys.stdout.write(made)
    return 0


if __name__ == "__main__":
    sys.exit(main())
