"""`make bench` / `python -m bench`: the harness (bench/harness.py), the children (bench/children.py), the reports
(bench/report.py). Not part of the product: nothing in pipeline/ or tasks/ imports it."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.children import CHILDREN
from tasks.errors import PipelineError
from bench.report import run_all, run_f32, run_finetune, run_handoff, run_port, run_versions, run_zarr


def own_peak_rss_bytes() -> int | None:
    """This process's own peak RSS since its exec (VmHWM of its memory map). Not the rusage `ru_maxrss` the parent
    gets from wait4: Linux carries the forking parent's peak into it, so a child started by a large parent (the
    bench after a full-size synth: 2.79 GB) reported that parent's figure whatever it used itself."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--child")
    p.add_argument("child_args", nargs="?")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--scale", choices=("tiny", "full"), default="full")
    p.add_argument("--cold", action="store_true", help="drop the page cache before every run (needs root)")
    p.add_argument("--port-tree", "--tt-metal", dest="port_tree", type=Path, help="the tt-metal tree whose GR00T N1.6 port the handoff rows run "
                                                  "(default: the pinned copy, ../shared/consumers/tt-metal)")
    p.add_argument("--only", choices=("port", "generic", "zarr", "handoff", "versions", "finetune", "f32", "network"),
                   help="port: only the tt-n16 rows against the port's own path (bench/port-results.*); "
                        "generic: only the generic-layout rows (bench/results.*); "
                        "zarr: zarr-python against our Zarr writer and reader (bench/zarr-results.json); "
                        "handoff: the port's model from the cache against the port's own start-up "
                        "(bench/handoff-results.*); versions: each version's default convert and reload, "
                        "side by side (bench/versions-results.*); finetune: a mixed-precision N1.6 fine-tune "
                        "converted after the release and cold (bench/finetune-results.*); f32: an all-F32 N1.7 "
                        "fine-tune, one file and 5 GB shards, against the bf16 release (bench/f32-results.*); "
                        "network: a convert into the bucket and a load from it through 1%% cuts and 1%% 503s, "
                        "against the same network without them (bench/network-faults*-results.json)")
    a = p.parse_args(argv)
    if a.cold:
        from bench.harness import DROP_CACHES, drop_caches

        try:
            drop_caches()
        except OSError as e:
            print(f"--cold needs to write {DROP_CACHES} ({e.strerror}): run as root on a machine whose /proc/sys is "
                  "writable, or drop --cold (every contender's inputs are then read right before it)", file=sys.stderr)
            return 2
    if a.child:
        result = CHILDREN[a.child](json.loads(a.child_args))
        print(json.dumps({**result, "own_peak_rss_bytes": own_peak_rss_bytes()}))
        return 0
    try:
        return _run(a)
    except PipelineError as e:  # a --port-tree without the port, a child that failed: one sentence, as the CLI says it
        print(f"error: {e}", file=sys.stderr)
        return 2


def _run(a: argparse.Namespace) -> int:
    if a.only == "port":
        return run_port(a.scale, a.runs, a.cold)
    if a.only == "generic":
        return run_all(a.scale, a.runs, a.cold)
    if a.only == "zarr":
        return run_zarr(a.scale, a.runs)
    if a.only == "handoff":
        return run_handoff(a.scale, a.runs, a.cold, a.port_tree)
    if a.only == "versions":
        return run_versions(a.scale, a.runs, a.cold)
    if a.only == "finetune":
        return run_finetune(a.scale, a.runs, a.cold)
    if a.only == "network":
        from bench.network_faults import run as run_network

        return run_network(a.scale, min(a.runs, 2))
    if a.only == "f32":
        return run_f32(a.scale, a.runs, a.cold)
    return (run_all(a.scale, a.runs, a.cold) or run_port(a.scale, a.runs, a.cold) or run_handoff(a.scale, a.runs, a.cold, a.port_tree)
            or run_versions(a.scale, a.runs, a.cold) or run_finetune(a.scale, a.runs, a.cold) or run_f32(a.scale, a.runs, a.cold))


if __name__ == "__main__":
    sys.exit(main())
