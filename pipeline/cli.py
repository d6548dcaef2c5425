"""`python -m pipeline <command>`: synth, inspect, convert, graph, load, cache, demo.

Every command exits 0 on success and 2 with one sentence on stderr for a known error (a `PipelineError`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from pipeline import cache
from pipeline.layout import straddling_unit
from pipeline.reuse import shared_bytes
from pipeline.snapshot import PROJECT_HF_CACHE, default_hf_cache, resolve_snapshot
from pipeline.versions import SCALES, VERSIONS, load_config
from tasks.errors import PipelineError

DEMO_HF_CACHE = PROJECT_HF_CACHE
LAYOUT_HELP = ("tt-n16 (what tt-metal's GR00T N1.6 port builds; n16's default) or generic (the original unpadded "
               "layout; n15/n17's default)")
PROFILE_HELP = "port (the layout's per-family dtypes; tt-n16's default), bf16 (generic's default) or bfp8"


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def cmd_synth(a: argparse.Namespace) -> dict:
    from pipeline.synth import synthesize

    t0 = time.perf_counter()
    snap = synthesize(a.version, Path(a.hf_cache), a.scale, a.seed)
    if not a.json:
        print(f"wrote a SYNTHETIC {a.version} ({a.scale} scale, seed {a.seed}) to {snap}\n"
              f"  convert it with: python -m pipeline convert --version {a.version} --synthetic {a.scale}"
              f"{'' if Path(a.hf_cache) == DEMO_HF_CACHE else f' --hf-cache {a.hf_cache}'}")
    return {"snapshot": str(snap), "synthetic": True, "seconds": round(time.perf_counter() - t0, 3)}


def inspect_report(version: str, snapshot: Path | None, hf_cache: Path | None, revision: str | None = None,
                   synthetic: str | None = None) -> dict:
    from tasks.checkpoint import Checkpoint

    cfg = load_config(version)
    with Checkpoint(resolve_snapshot(cfg, snapshot, hf_cache, revision, synthetic)) as ck:
        unit = straddling_unit(version)
        straddle = {s: [k[len(unit) + 1:] for k in ck.keys_with_prefix(unit + ".") if ck.shard_of(k) == s]
                    for s in ck.shards_for_prefix(unit + ".")}
        return {"version": version, "snapshot": str(ck.dir), "synthetic": ck.synthetic, "tensors": len(ck), "total_bytes": ck.total_bytes,
                "index_total_size": ck.metadata.get("total_size"), "shards": ck.byte_accounting(),
                "straddling_unit": unit, "straddle": straddle,
                "embodiment_tensors": {k: list(ck.shape(k)) for k in cfg.embodiment_keys},
                "embodiment_tags": dict(cfg.embodiment_ids)}


def print_inspect(r: dict) -> None:
    print(f"{r['version']}: {r['tensors']} tensors, {_mb(r['total_bytes'])} of data in {len(r['shards'])} shards\n  {r['snapshot']}")
    if r["synthetic"]:
        print(f"  SYNTHETIC: {r['synthetic']}")
    print(f"\n  {'shard':36} {'header B':>10} {'tensors':>8} {'data B':>15} {'file B':>15}")
    for name, s in r["shards"].items():
        print(f"  {name:36} {s['header_bytes']:>10,} {s['tensors']:>8} {s['data_bytes']:>15,} {s['file_size']:>15,}")
    print(f"\n  straddling unit {r['straddling_unit']}:")
    for shard, keys in r["straddle"].items():
        print(f"    {shard}: {', '.join(keys)}")
    print("\n  embodiment tensors (slot = leading dim, used as x @ W[e] + b[e]):")
    for k, shape in r["embodiment_tensors"].items():
        print(f"    {k:48} {shape}")
    print("  tags: " + ", ".join(f"{t}={i}" for t, i in r["embodiment_tags"].items()))


def cmd_inspect(a: argparse.Namespace) -> dict:
    report = inspect_report(a.version, a.snapshot, a.hf_cache, a.revision, a.synthetic)
    if not a.json:
        print_inspect(report)
    return report


def _convert_options(a: argparse.Namespace, device=None):
    from pipeline.convert import ConvertOptions

    return ConvertOptions(a.version, a.profile, a.embodiments, a.scheduler, a.snapshot, a.hf_cache, a.cache,
                          a.force, progress=not a.json, check_against_cache=a.check_against_cache, device=device,
                          layout=a.layout, revision=a.revision, synthetic=a.synthetic)


@contextlib.contextmanager
def opened_device(choice: str):
    """`none`: host only; `auto`: every device present (a mesh), else host only; an id: that device or an
    error. The device is closed on every exit path."""
    from tasks import device as tt

    if choice == "none" or (choice == "auto" and not tt.hardware_present()):
        yield None
        return
    if not tt.hardware_present():
        raise PipelineError(f"--device {choice}: no Tenstorrent device on this machine (/dev/tenstorrent is absent); "
                            "use --device none or auto")
    dev = tt.open_device(None if choice == "auto" else int(choice))
    try:
        yield dev
    finally:
        tt.close_device(dev)


def print_convert(s: dict) -> None:
    print(f"\n{s['version']} ({s['layout']}, {s['profile']}): {'cache hit, nothing converted' if s['cache_hit'] else 'converted'}"
          f" in {s['seconds']:.2f} s")
    src = s.get("source", {})
    print(f"  source        {src.get('snapshot')} (revision {src.get('revision') or 'unknown'})")
    if src.get("synthetic"):
        print(f"  SYNTHETIC     {src['synthetic']}")
    print(f"  cache entry   {s['cache_path']}")
    print(f"  targets       {s['targets']} (+{len(s['skipped'])} source keys skipped by recipe), slots {len(s['slots'])}")
    if s["cache_hit"]:
        return
    print(f"  tasks         {s['tasks']} ({s.get('resumed_chunks', 0)} chunks resumed from a killed run)")
    print(f"  bytes         read {_mb(s['bytes_read'])}, written {_mb(s['bytes_written'])}")
    print(f"  peak RSS      {_mb(s['peak_rss_bytes'])}")
    print("  stage seconds (summed over tasks): " + ", ".join(
        f"{k} {v:.2f} ({s['stage_tasks'].get(k, 0)})" for k, v in s["stage_seconds"].items()))
    worst = [n for n in s["numerics"][:5] if n["pcc"] < 1.0 or n["max_abs_err"] > 0]
    if not worst:
        print(f"  numerics      all {len(s['numerics'])} targets exact against the bf16 source")
        return
    print("  numerics, worst first (device dtype vs bf16 source):")
    for n in worst:
        slot = "" if n["slot"] is None else f"[{n['slot']}]"
        print(f"    {n['name'] + slot:64} pcc {n['pcc']:.6f}  max|err| {n['max_abs_err']:.3g}")


def cmd_convert(a: argparse.Namespace) -> dict:
    from pipeline.convert import convert

    with opened_device(a.device) as dev:
        summary = convert(_convert_options(a, dev))
    summary.pop("device_tensors", None)
    if not a.json:
        print_convert(summary)
    else:
        summary = {k: v for k, v in summary.items() if k != "numerics"} | {"numerics_worst": summary.get("numerics", [])[:10]}
    return summary


def cmd_graph(a: argparse.Namespace) -> dict:
    from pipeline.convert import ConvertOptions
    from pipeline.render import write_graph

    opts = ConvertOptions(a.version, a.profile, a.embodiments, snapshot=a.snapshot, hf_cache=a.hf_cache, cache_root=a.cache,
                          layout=a.layout, revision=a.revision, synthetic=a.synthetic)
    result = write_graph(opts, Path(a.out))
    if not a.json:
        extra = f", {result['units']} units, straddling: {', '.join(result['straddling'])}" if "units" in result else ""
        print(f"wrote {result['out']}: {result['tasks']} tasks{extra}")
    return result


def cmd_load(a: argparse.Namespace) -> dict:
    from pipeline.load import load

    with opened_device(a.device) as dev:
        loaded = load(a.version, a.cache, a.embodiment, a.profile, device=dev, layout=a.layout)
    result = {"entry": loaded.entry, "layout": loaded.layout, "slot": loaded.slot, "source": loaded.source, **loaded.stats}
    if not a.json:
        if loaded.source.get("synthetic"):
            print(f"SYNTHETIC weights: {loaded.source['synthetic']}")
        print(f"loaded {result['tensors']} tensors ({_mb(result['bytes_read'])}) from {loaded.entry} "
              f"in {result['seconds']:.3f} s")
    return result


def cmd_cache(a: argparse.Namespace) -> dict:
    from pipeline.store import is_url

    if is_url(a.cache):
        raise PipelineError(f"{a.cache}: `cache {a.action}` works on a local cache; object-store entries are "
                            "checked on every load (each chunk against the manifest)")
    root = cache.cache_root(a.cache)
    if a.action == "gc":
        removed = cache.collect_garbage(root, a.older_than_days, a.max_bytes)
        if not a.json:
            print("\n".join(f"removed {r['entry']} ({r['reason']}, {_mb(r['bytes'])})" for r in removed) or "nothing to remove")
        return {"root": str(root), "removed": removed}
    rows = []
    for path, entry, state in cache.iter_entries(root):
        if a.action == "verify" and entry is not None and (a.entry in (None, path.name)):
            problems = cache.verify_entry(entry)
            state = "verified" if not problems else f"CORRUPT ({len(problems)} chunks): {problems[0]}"
        size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        rows.append({"entry": path.name, "state": state, "bytes": size, "shared_bytes": shared_bytes(path),
                     "version": entry.manifest.get("version") if entry else None,
                     "age_s": round(time.time() - path.stat().st_mtime)})
    if not a.json:
        for r in rows:
            print(f"{r['entry']:48} {_mb(r['bytes']):>12} ({_mb(r['shared_bytes'])} shared with other entries)"
                  f"  {r['age_s']:>8} s old  {r['state']}")
        if not rows:
            print(f"no entries in {cache.entries_dir(root)}")
    if a.action == "verify" and any(r["state"].startswith("CORRUPT") for r in rows):
        raise PipelineError(f"cache {root}: {sum(r['state'].startswith('CORRUPT') for r in rows)} entry(ies) failed verification")
    return {"root": str(root), "entries": rows}


def cmd_demo(a: argparse.Namespace) -> dict:
    from pipeline.convert import ConvertOptions, convert
    from pipeline.load import load
    from pipeline.synth import synthesize

    print(f"1. synthesizing a tiny GR00T N1.7 into {DEMO_HF_CACHE} (real key names, order, counts and shards; small "
          "dims; marked synthetic, under a repo id of its own)")
    synthesize("n17", DEMO_HF_CACHE, "tiny")
    print_inspect(inspect_report("n17", None, DEMO_HF_CACHE, synthetic="tiny"))
    print("\n2. converting it (Dask graph: index -> read/slot -> transform -> convert -> stage -> unit -> publish;"
          " verify hashes each shard alongside and gates its units)")
    opts = ConvertOptions("n17", hf_cache=DEMO_HF_CACHE, synthetic="tiny", cache_root=a.cache)
    summary = convert(opts)
    print_convert(summary)
    print("\n3. converting again: the cache entry is reused")
    print_convert(convert(replace(opts, progress=False)))
    loaded = load("n17", a.cache, embodiment="new_embodiment")
    print(f"\n4. reloaded {loaded.stats['tensors']} tensors for embodiment new_embodiment (slot {loaded.slot}) "
          f"from the cache in {loaded.stats['seconds']:.3f} s, {_mb(loaded.stats['bytes_read'])} read")
    return summary


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pipeline", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    def add(name: str, fn, help_: str, version: bool = True) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_)
        sp.set_defaults(fn=fn)
        if version:
            sp.add_argument("--version", required=True, help=f"one of {', '.join(VERSIONS)}")
        sp.add_argument("--json", action="store_true", help="print one JSON object instead of text")
        sp.add_argument("--cache", help="cache root: a folder, or an s3://bucket/prefix URL (default $GR00T_CACHE or ./cache)")
        return sp

    def source_args(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--snapshot", type=Path, help="a snapshot folder (overrides the HF cache lookup)")
        sp.add_argument("--hf-cache", type=Path, help=f"Hugging Face hub cache (default {default_hf_cache()}; "
                                                      f"with --synthetic, {PROJECT_HF_CACHE})")
        sp.add_argument("--revision", help="the release's revision (default: the one pinned in configs/<version>.toml)")
        sp.add_argument("--synthetic", choices=SCALES, help="convert the project's synthetic stand-in of this scale "
                                                            "(made by `synth`), never the real release")

    sp = add("synth", cmd_synth, "write a synthetic checkpoint into an HF-cache-shaped folder")
    sp.add_argument("--scale", choices=SCALES, default="tiny",
                    help="tiny: every key, small dims; attn: real attention shapes, 1-2 layers per stack; full")
    sp.add_argument("--hf-cache", type=Path, default=DEMO_HF_CACHE)
    sp.add_argument("--seed", type=int, default=0)
    sp = add("inspect", cmd_inspect, "shard framing, straddling unit and embodiment tensors of a snapshot")
    source_args(sp)
    for name, fn, help_ in (("convert", cmd_convert, "convert a snapshot into a cache entry"),
                            ("graph", cmd_graph, "render the conversion graph (SVG/PNG/DOT) or write it as JSON")):
        sp = add(name, fn, help_)
        source_args(sp)
        sp.add_argument("--layout", help=LAYOUT_HELP)
        sp.add_argument("--profile", help=PROFILE_HELP)
        sp.add_argument("--embodiments", default="all", help="'all', or tags/slot ids separated by commas")
        if name == "convert":
            sp.add_argument("--scheduler", default="threads", help="threads | sync | processes | tcp://host:port")
            sp.add_argument("--force", action="store_true", help="convert even if a published entry exists")
            sp.add_argument("--device", default="none", help="none (default) | auto | a device id: upload as staged")
            sp.add_argument("--check-against-cache", action="store_true",
                            help="convert afresh into a scratch entry and compare it byte for byte with the cached one")
        else:
            sp.add_argument("--out", required=True, help="FILE.svg, FILE.png, FILE.dot or FILE.json")
    sp = add("load", cmd_load, "reload converted tensors from the cache and time it")
    sp.add_argument("--layout", help=LAYOUT_HELP)
    sp.add_argument("--profile", help=PROFILE_HELP)
    sp.add_argument("--embodiment", help="a tag or slot id (default: all slots)")
    sp.add_argument("--device", default="none", help="none (default) | auto | a device id")
    sp = add("cache", cmd_cache, "list, verify or clean the cache", version=False)
    sp.add_argument("action", choices=("ls", "verify", "gc"))
    sp.add_argument("entry", nargs="?", help="verify only this entry")
    sp.add_argument("--older-than-days", type=float, help="gc: also remove published entries older than this")
    sp.add_argument("--max-bytes", type=int, help="gc: then remove the oldest entries until the cache fits")
    add("demo", cmd_demo, "synthesize tiny n17, convert it, convert again (cache hit), reload", version=False)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        result = args.fn(args)
    except PipelineError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, indent=1, default=str))
    return 0
