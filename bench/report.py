"""The reports of `make bench` (the method: bench/harness.py): results.json / .md / .png, port-results.json / .md."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from bench.harness import BENCH, DATA, median, remove, run_child, settle, warm_up
from bench.tables import context, contender_table, metric, metric_table, write
from pipeline.cache import entry_at, resolve_ref
from pipeline.inputs.snapshot import resolve_snapshot
from pipeline.model.versions import load_config
from tasks.errors import CheckpointError
from tasks.entries.store import LocalStore

VERSION = "n16"  # the release whose layout is verified byte for byte


def _out(scale: str) -> Path:
    """Where results go: bench/ for the full-size run the README quotes; a smoke run at another scale writes under
    bench/data/ (git-ignored), so it never overwrites the committed results."""
    out = BENCH if scale == "full" else DATA / f"results-{scale}"
    out.mkdir(parents=True, exist_ok=True)
    return out


def _built() -> None:
    """What `make` does once per install, done before any contender is timed: the C kernels built for this source
    and CPU, ttnn's `.tensorbin` headers checked. Else the first child after an edit of tasks/numerics/kernels.c pays both
    (3-4 s and an import of ttnn) inside its row."""
    from tasks.numerics import kernels
    from tasks.device import tensorbin

    kernels.build()
    tensorbin.check_formats()


def _synthetic_snapshot(scale: str, version: str = VERSION) -> tuple[Path, Path]:
    """The bench's synthetic checkpoint of `scale` (made once under bench/data/): its HF cache and snapshot folder."""
    hf = DATA / f"hf-{scale}"
    cfg = load_config(version)
    try:
        return hf, resolve_snapshot(cfg, hf_cache=hf, synthetic=scale)
    except CheckpointError:  # what resolve_snapshot says of a stand-in not made yet
        from pipeline.inputs.synth import synthesize

        print(f"synthesizing {version} ({scale}) into {hf} (once)", flush=True)
        synthesize(version, hf, scale)
    return hf, resolve_snapshot(cfg, hf_cache=hf, synthetic=scale)


def run_all(scale: str, runs: int, cold: bool) -> int:
    """The generic layout's rows: convert against a raw copy and `ttnn.as_tensor`, reloads against raw reads and
    the naive path, one embodiment's share of the bank bytes, Dask's overhead. Writes bench/results.{json,md,png}."""
    started = time.time()
    hf, snapshot = _synthetic_snapshot(scale)
    tiny_hf, _ = _synthetic_snapshot("tiny")
    caches = {p: DATA / f"cache-{scale}-{p}" for p in ("bf16", "bfp8")}
    rows: list[dict] = []
    raw: dict[str, list] = {}
    print(f"bench: {VERSION} {scale}, {runs} runs each, page cache {'cold' if cold else 'warm'}", flush=True)
    _convert_rows(rows, raw, hf=hf, snapshot=snapshot, scale=scale, caches=caches, runs=runs, cold=cold)
    _reload_rows(rows, raw, snapshot=snapshot, caches=caches, runs=runs, cold=cold)
    _overhead_rows(rows, raw, sources=(("", hf, scale), ("_tiny", tiny_hf, "tiny")), runs=runs, scale=scale)
    _as_tensor_rows(rows, raw, snapshot=snapshot, caches=caches, scale=scale, runs=runs, cold=cold)
    ctx = context(only="generic", scale=scale, runs=runs, cold=cold, started=started, version=VERSION)
    out = _out(scale)
    write(out, "results", ctx=ctx, raw=raw, metrics=rows, what=f"{VERSION} {scale} synthetic checkpoint, generic layout",
          tables=[metric_table(rows)])
    _chart(rows, raw, out)
    print(f"wrote {out / 'results.md'}, results.json, results.png", flush=True)
    for scratch in (DATA / f"as_tensor-{scale}-bf16", DATA / f"as_tensor-{scale}-bfp8", DATA / "cache-overhead",
                    DATA / "scratch"):  # ~20 GB at full scale
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


def _convert_rows(rows: list, raw: dict, *, hf: Path, snapshot: Path, scale: str, caches: dict, runs: int,
                  cold: bool) -> None:
    """Convert (bf16, bfp8) against reading and writing the source's bytes raw, contenders alternating."""
    raw.update(convert_bf16=[], convert_bfp8=[], raw_copy=[])
    for _ in range(runs):
        for profile in ("bf16", "bfp8"):
            raw[f"convert_{profile}"].append(run_child("convert", {"version": VERSION, "profile": profile, "hf": str(hf),
                                                                   "synthetic": scale, "cache": str(caches[profile])},
                                                       cold, fresh=caches[profile]))
        raw["raw_copy"].append(run_child("raw_copy", {"snapshot": str(snapshot), "scratch": str(DATA / "scratch")}, cold))
    conv = median(raw["convert_bf16"])
    metric(rows, "convert bf16 / read+write raw", conv, median(raw["raw_copy"]), "<= 1.3",
           conv <= 1.3 * median(raw["raw_copy"]), note="both sync to disk at the end")
    peak = median(raw["convert_bf16"], "peak_rss_bytes")
    metric(rows, "peak RSS of convert (GB)", peak / 1e9, None, "<= 1.5 GB", peak <= 1.5e9, unit="GB")
    wall, cpu, cores = median(raw["convert_bfp8"]), median(raw["convert_bfp8"], "cpu_seconds"), os.cpu_count() or 1
    metric(rows, "bfp8 convert: wall / (CPU / cores)", wall, cpu / cores, "<= 1.15", wall <= 1.15 * cpu / cores)


def _reload_rows(rows: list, raw: dict, *, snapshot: Path, caches: dict, runs: int, cold: bool) -> None:
    """The full reload against raw reads of the same files and the naive path; one embodiment's share of the bank."""
    entry = resolve_ref(LocalStore(caches["bf16"]), VERSION, "generic", "bf16").path
    raw.update(load=[], raw_read=[], cat=[], naive=[])
    for _ in range(runs):  # each contender's inputs read just before it, so all start equally warm
        warm_up(entry)
        raw["load"].append(run_child("load", {"version": VERSION, "cache": str(caches["bf16"])}, cold))
        warm_up(entry)
        raw["raw_read"].append(run_child("raw_read", {"entry": str(entry)}, cold))
        warm_up(entry)
        raw["cat"].append(run_child("cat", {"entry": str(entry)}, cold))
        warm_up(*snapshot.iterdir())
        raw["naive"].append(run_child("naive", {"version": VERSION, "snapshot": str(snapshot)}, cold))
    gbps = {k: median(raw[k], "bytes") / median(raw[k]) / 1e9 for k in ("raw_read", "cat")}
    metric(rows, "raw readinto GB/s / cat GB/s (is the baseline starved?)", gbps["raw_read"], gbps["cat"], ">= 0.5",
           gbps["raw_read"] >= 0.5 * gbps["cat"], unit="GB/s", note=f"cat {gbps['cat']:.2f} GB/s")
    load = median(raw["load"])
    metric(rows, "full reload to host / raw readinto", load, median(raw["raw_read"]), "<= 1.2",
           load <= 1.2 * median(raw["raw_read"]), note="same files, buffers kept")
    metric(rows, "full reload / naive load_file+transform+from_torch", load, median(raw["naive"]), "<= 0.2",
           load <= 0.2 * median(raw["naive"]))
    one = run_child("load", {"version": VERSION, "cache": str(caches["bf16"]), "embodiment": "gr1"})
    arrays = entry_at(entry).manifest.arrays
    bank = sum(c.nbytes for a in arrays.values() if a.bank for c in a.chunks.values())
    rest = sum(c.nbytes for a in arrays.values() if not a.bank for c in a.chunks.values())
    share = (one["bytes"] - rest) / bank
    metric(rows, "one-embodiment bank bytes read / bank bytes", share, None, "<= 1/32 + 1%", share <= 1 / 32 + 0.01, unit="")


def _overhead_rows(rows: list, raw: dict, *, sources: tuple, runs: int, scale: str) -> None:
    """The graph on Dask's synchronous scheduler against a plain loop over the same tasks, full and tiny."""
    scratch = DATA / "cache-overhead"
    for _ in range(runs):
        for suffix, hf, sc in sources:
            args = {"version": VERSION, "hf": str(hf), "synthetic": sc, "cache": str(scratch)}
            raw.setdefault(f"dask_sync{suffix}", []).append(
                run_child("convert", {**args, "profile": "bf16", "scheduler": "sync"}, fresh=scratch))
            raw.setdefault(f"plain_loop{suffix}", []).append(run_child("plain_loop", {**args, "profile": "bf16"},
                                                                      fresh=scratch))
    for suffix, name, note in (("", "Dask overhead: graph (sync, 1 thread) / plain loop", f"{scale} n16"),
                               ("_tiny", "Dask overhead on tiny n16 (5,800 tasks, no real work)", "context: per-task cost")):
        ours, base = median(raw[f"dask_sync{suffix}"]), median(raw[f"plain_loop{suffix}"])
        metric(rows, name, ours, base, "<= 1.1", ours <= 1.1 * base, note=note)


def _as_tensor_rows(rows: list, raw: dict, *, snapshot: Path, caches: dict, scale: str, runs: int, cold: bool) -> None:
    """Convert and one-slot reload against tt-metal's `ttnn.as_tensor` cache, its first run and a warm one."""
    for _ in range(runs):
        for p in ("bf16", "bfp8"):
            ast = DATA / f"as_tensor-{scale}-{p}"
            args = {"version": VERSION, "snapshot": str(snapshot), "cache_dir": str(ast), "profile": p, "scale": scale}
            raw.setdefault(f"as_tensor_first_{p}", []).append(run_child("as_tensor", {**args, "first": True}, cold, fresh=ast))
            raw.setdefault(f"as_tensor_warm_{p}", []).append(run_child("as_tensor", {**args, "first": False}, cold))
        raw.setdefault("load_bfp8", []).append(run_child("load", {"version": VERSION, "cache": str(caches["bfp8"]),
                                                                  "profile": "bfp8", "embodiment": "gr1",
                                                                  "ttnn_host": True}, cold))
    ours, base = median(raw["load_bfp8"]), median(raw["as_tensor_warm_bfp8"])
    metric(rows, "bfp8 reload (ttnn host, 1 slot) / as_tensor warm (all slots)", ours, base, "<= 1.0", ours <= base,
           note="as_tensor has no slot selection")
    for p in ("bf16", "bfp8"):
        ours, base = median(raw[f"convert_{p}"]), median(raw[f"as_tensor_first_{p}"])
        metric(rows, f"convert {p} / as_tensor first run", ours, base, "<= 0.5", ours <= 0.5 * base)


PLANS = {"port": 0.6, "bf16": 1.0, "bfp8": 0.6}  # dtype plan -> the goal for convert / the port's own path


def run_port(scale: str, runs: int, cold: bool, plans: tuple[str, ...] = tuple(PLANS)) -> int:
    """The tt-n16 layout in each dtype plan (the port's mixed one, all-bfloat16, all-bfloat8_b) against the port's
    own path and `ttnn.as_tensor` in the same plan, all in fresh processes, inputs warmed right before each run,
    contenders alternating run by run. Writes bench/port-results.{json,md}."""
    started = time.time()
    print(f"bench port: {VERSION} {scale}, plans {', '.join(plans)}, {runs} runs each", flush=True)
    raw = _port_runs(scale, runs, cold, plans)
    rows: list[dict] = []
    for plan in plans:
        for ours, base, goal in (("convert", "port_path", PLANS[plan]), ("convert", "as_tensor_first", 0.5),
                                 ("reload", "as_tensor_warm", 0.5)):
            for measure, label in (("seconds", "wall in child"), ("process_seconds", "wall of process"),
                                   ("cpu_seconds", "CPU user+sys")):
                o, b = median(raw[f"{plan}:{ours}"], measure), median(raw[f"{plan}:{base}"], measure)
                metric(rows, f"{plan}: {ours} / {base} ({label})", o, b, f"<= {goal}", o <= goal * b)
        peak = median(raw[f"{plan}:convert"], "peak_rss_bytes")
        metric(rows, f"{plan}: peak RSS of convert (GB)", peak / 1e9, None, "<= 1.5 GB", peak <= 1.5e9, unit="GB")
    ctx = context(only="port", scale=scale, runs=runs, cold=cold, started=started, version=VERSION, layout="tt-n16",
                  plans=list(plans))
    out = _out(scale)
    table = contender_table(raw, columns=("plan", "contender"), cells=lambda key: key.split(":"),
                            extra={"minor faults": lambda r: f"{median(r, 'minor_faults'):,.0f}"})
    write(out, "port-results", ctx=ctx, raw=raw, metrics=rows, what=f"{VERSION} {scale} synthetic checkpoint, tt-n16 layout",
          tables=[table, metric_table(rows)])
    print(f"wrote {out / 'port-results.md'}", flush=True)
    for plan in plans:  # keep the port plan's entry (the zarr bench reads it); the rest is ~35 GB at full scale
        shutil.rmtree(DATA / f"as_tensor-{scale}-tt-n16-{plan}", ignore_errors=True)
        if plan != "port":
            shutil.rmtree(DATA / f"cache-{scale}-tt-n16-{plan}", ignore_errors=True)
    return 0


def _port_runs(scale: str, runs: int, cold: bool, plans: tuple[str, ...]) -> dict[str, list]:
    """Every contender of each plan, run by run, each one's inputs warmed right before it."""
    hf, snapshot = _synthetic_snapshot(scale)
    shards = [p.resolve() for p in snapshot.iterdir()]
    contenders = ("convert", "port_path", "as_tensor_first", "reload", "as_tensor_warm")
    raw: dict[str, list] = {f"{plan}:{c}": [] for plan in plans for c in contenders}
    for _ in range(runs):
        for plan in plans:
            cache, ast = DATA / f"cache-{scale}-tt-n16-{plan}", DATA / f"as_tensor-{scale}-tt-n16-{plan}"
            args = {"version": VERSION, "snapshot": str(snapshot), "plan": plan}
            remove(cache)
            settle()  # before the warming, so the source is as warm for us as for the others
            warm_up(*shards)
            raw[f"{plan}:convert"].append(run_child("convert", {"version": VERSION, "profile": plan, "layout": "tt-n16",
                                                                "hf": str(hf), "cache": str(cache), "synthetic": scale}, cold))
            warm_up(*shards)
            raw[f"{plan}:port_path"].append(run_child("port_path", args, cold))
            remove(ast)
            settle()
            warm_up(*shards)
            raw[f"{plan}:as_tensor_first"].append(run_child("as_tensor_port", {**args, "cache_dir": str(ast), "first": True}, cold))
            warm_up(cache)
            raw[f"{plan}:reload"].append(run_child("load", {"version": VERSION, "cache": str(cache), "profile": plan,
                                                            "layout": "tt-n16", "embodiment": "gr1", "ttnn_host": True}, cold))
            warm_up(ast)
            raw[f"{plan}:as_tensor_warm"].append(run_child("as_tensor_port", {**args, "cache_dir": str(ast), "first": False}, cold))
            print(f"  {plan} run done: " + ", ".join(f"{c} {raw[f'{plan}:{c}'][-1]['seconds']:.1f} s" for c in contenders),
                  flush=True)
    return raw


def run_zarr(scale: str, runs: int) -> int:
    """zarr-python against our Zarr v3 writer and reader, on every bf16 array of the full tt-n16 entry."""
    cache = DATA / f"cache-{scale}-tt-n16-port"
    entries = sorted((cache / "entries").glob("n16-*")) if (cache / "entries").is_dir() else []
    if not entries:
        print(f"no entry in {cache}: run `python -m bench --only port` first", flush=True)
        return 1
    raw: dict[str, list] = {"ours": [], "zarr-python": []}
    for _ in range(runs):
        for impl in raw:
            warm_up(entries[-1])
            raw[impl].append(run_child("zarr_io", {"entry": str(entries[-1]), "scratch": str(DATA / "zarr-scratch"),
                                                   "impl": impl}))
            print(f"  {impl}: write {raw[impl][-1]['write_seconds']:.2f} s, read {raw[impl][-1]['read_seconds']:.2f} s",
                  flush=True)
    out = _out(scale)
    summary = {impl: {k: median(r, k) for k in ("write_seconds", "read_seconds", "seconds", "cpu_seconds")} |
               {"bytes": r[0]["bytes"]} for impl, r in raw.items()}
    (out / "zarr-results.json").write_text(json.dumps({"summary": summary, "runs": raw}, indent=1))
    print(json.dumps(summary, indent=1), flush=True)
    return 0


def _chart(rows: list[dict], raw: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(15, 6))
    runs = [(f"bf16 #{i + 1}", r) for i, r in enumerate(raw["convert_bf16"])] + \
           [(f"bfp8 #{i + 1}", r) for i, r in enumerate(raw["convert_bfp8"])]
    xs = range(len(runs))
    left.bar([x - 0.2 for x in xs], [r["seconds"] for _, r in runs], width=0.4, label="wall (in the child)")
    left.bar([x + 0.2 for x in xs], [r["cpu_seconds"] for _, r in runs], width=0.4, label="CPU, user + sys (whole process)")
    left.set_xticks(list(xs), [n for n, _ in runs], rotation=45)
    left.set_title("convert: wall and CPU time per run (per-stage task-seconds are in results.json)")
    left.set_ylabel("seconds")
    left.legend(fontsize=8)
    ratios = [r for r in rows if r["baseline"] is not None]
    goals = [float(r["goal"].split()[-1]) for r in ratios]
    colors = ["tab:green" if r["holds"] else "tab:red" for r in ratios]
    right.barh([r["metric"] for r in ratios], [r["ratio"] for r in ratios], color=colors)
    right.scatter(goals, range(len(ratios)), marker="|", s=400, color="black", label="goal")
    right.set_title("ratio against baseline (green: goal holds)")
    right.legend()
    right.tick_params(axis="y", labelsize=8)
    fig.tight_layout()
    fig.savefig(out / "results.png", dpi=90)


HANDOFF = {"port_startup": "port's own start-up (loader + constructors, host)",
           "handoff": "ours: entry -> port model (host)",
           "handoff_first": "ours: first start on this entry and port revision (the self-check, the constructors traced and the model kept; host, once)",
           "handoff_simulated": "ours: entry -> port model (simulated N150, figures only)"}


def _handoff_report(raw: dict[str, list], ctx: dict, out: Path) -> list[str]:
    """bench/handoff-results.{json,md}: the contenders side by side, and the goals (issue 28: the start-up itself
    <= 0.05x the port's, peak RSS <= its tensors' bytes + 1 GB; whole processes and CPU, issue 26's 0.1x)."""
    rows: list[dict] = []
    for measure, label, goal in (("seconds", "wall in child", 0.05), ("process_seconds", "wall of process", 0.1),
                                 ("cpu_seconds", "CPU user+sys", 0.1)):
        o, b = median(raw["handoff"], measure), median(raw["port_startup"], measure)
        metric(rows, f"handoff / port start-up ({label})", o, b, f"<= {goal}", o <= goal * b)
    tensor_bytes = median(raw["handoff"], "tensor_bytes")
    peak = median(raw["handoff"], "peak_rss_bytes")
    metric(rows, "handoff peak RSS above its tensors' bytes (GB)", (peak - tensor_bytes) / 1e9, None, "<= 1 GB",
           peak - tensor_bytes <= 1e9, unit="GB", note=f"peak {peak / 1e9:.2f} GB, tensors {tensor_bytes / 1e9:.2f} GB")
    listing = median(raw["handoff"], "listing_seconds")
    had = sorted({r.get("model", "traced") for r in raw["handoff"]})
    metric(rows, "handoff: the entry chosen and the port's model had, before any file is read (s)", listing, None,
           "<= 0.1 s", listing <= 0.1, note=f"the model {' / '.join(had)}; first start: "
           f"{raw['handoff_first'][0].get('model', 'traced')}")
    table = contender_table(raw, cells=lambda key: [HANDOFF[key]])
    return write(out, "handoff-results", ctx=ctx, raw=raw, metrics=rows, tables=[table, metric_table(rows)],
                 what=f"{ctx['version']} {ctx['scale']} synthetic checkpoint, all 32 slots")


def run_handoff(scale: str, runs: int, cold: bool, port_tree: Path | None = None) -> int:
    """The port's model from our cache against the port's own start-up (weight loader + constructors, host),
    full-size synthetic N1.6, every slot, fresh processes, each contender's inputs read right before it; then ours
    on the simulated device (figures only). `port_tree`: the tt-metal tree holding the port (default: the pinned
    copy, bench/children.py PORT_TREE). Writes bench/handoff-results.{json,md}."""
    from bench.children import PORT_TREE
    from pipeline.jobs.convert import ConvertOptions, convert
    from pipeline.port_n16 import PortCode
    from tasks.entries.names import PORT_MODELS

    code = PortCode.find(port_tree or PORT_TREE)  # a tree without the port: one sentence, before anything runs
    hf, snapshot = _synthetic_snapshot(scale)
    cache = DATA / f"cache-{scale}-handoff"
    convert(ConvertOptions(VERSION, profile="port", embodiments="all", hf_cache=hf, synthetic=scale, cache_root=cache, progress=False))
    shards = [p.resolve() for p in snapshot.iterdir()]
    raw: dict[str, list] = {name: [] for name in HANDOFF}
    started = time.time()
    print(f"bench handoff: {VERSION} {scale}, {runs} runs", flush=True)
    # The first start of this port revision on this entry: it holds the port to its own constructor and keeps the
    # verdict, and traces the constructors and keeps the model; every start after it finds both.
    shutil.rmtree(cache / "port-checks", ignore_errors=True)
    shutil.rmtree(cache / PORT_MODELS, ignore_errors=True)
    warm_up(cache)
    raw["handoff_first"].append(run_child("handoff", {"cache": str(cache), "tt_metal": str(code.root), "check": True}, cold))
    for _ in range(runs):
        warm_up(*shards)
        raw["port_startup"].append(run_child("port_startup", {"snapshot": str(snapshot), "tt_metal": str(code.root)}, cold))
        warm_up(cache)
        raw["handoff"].append(run_child("handoff", {"cache": str(cache), "tt_metal": str(code.root)}, cold))
        print(f"  run done: port {raw['port_startup'][-1]['seconds']:.1f} s, ours {raw['handoff'][-1]['seconds']:.2f} s",
              flush=True)
    warm_up(cache)
    raw["handoff_simulated"].append(run_child("handoff", {"cache": str(cache), "simulated": True, "tt_metal": str(code.root)}, cold))
    ctx = context(only="handoff", scale=scale, runs=runs, cold=cold, started=started, version=VERSION,
                  slots="all 32", port=f"{code.root} (revision {code.revision})",
                  imports="'wall in child' starts after imports (ttnn, torch, the port's modules, diffusers); "
                          "'wall of process' and CPU include them")
    lines = _handoff_report(raw, ctx, _out(scale))
    print("\n".join(lines))
    return 0


def run_versions(scale: str, runs: int, cold: bool, versions: tuple[str, ...] = ("n15", "n16", "n17")) -> int:
    """Each version's default conversion (its Tenstorrent layout and the port profile, every slot) from a cold cache,
    then one embodiment reloaded as ttnn host tensors and every target loaded into torch, in fresh processes, each
    contender's inputs read right before it. Figures beside each other, no contender. Each cache is removed once
    measured (~9 GB at full scale). Writes bench/versions-results.{json,md}."""
    from pipeline.model.recipe import resolve

    raw: dict[str, list] = {}
    started = time.time()
    print(f"bench versions: {', '.join(versions)} {scale}, {runs} runs each", flush=True)
    for version in versions:
        hf, snapshot = _synthetic_snapshot(scale, version)
        layout, profile = resolve(version)
        cache, shards = DATA / f"cache-{scale}-{version}-default", [p.resolve() for p in snapshot.iterdir()]
        tag = next(iter(load_config(version).embodiment_ids))
        for _ in range(runs):
            remove(cache)
            settle()
            warm_up(*shards)
            raw.setdefault(f"{version}:convert", []).append(run_child(
                "convert", {"version": version, "profile": profile, "layout": layout, "hf": str(hf),
                            "cache": str(cache), "synthetic": scale}, cold))
            warm_up(cache)
            raw.setdefault(f"{version}:reload", []).append(run_child(
                "load", {"version": version, "cache": str(cache), "profile": profile, "layout": layout,
                         "embodiment": tag, "ttnn_host": True}, cold))
            warm_up(cache)  # every target into torch: what a host-side user loads (tiled chunks put in rows)
            raw.setdefault(f"{version}:torch, every slot", []).append(run_child(
                "load", {"version": version, "cache": str(cache), "profile": profile, "layout": layout}, cold))
            print(f"  {version} ({layout}, {profile}) run done: convert {raw[f'{version}:convert'][-1]['seconds']:.1f} s, "
                  f"reload {raw[f'{version}:reload'][-1]['seconds']:.2f} s, "
                  f"torch {raw[f'{version}:torch, every slot'][-1]['seconds']:.2f} s", flush=True)
        raw[f"{version}:convert"][-1]["source_bytes"] = sum(p.stat().st_size for p in shards)
        remove(cache)
    ctx = context(only="versions", scale=scale, runs=runs, cold=cold, started=started, versions=list(versions),
                  slots="all 32 (convert, torch), one (reload)")
    table = contender_table(raw, columns=("version", "layout, profile", "step"),
                            cells=lambda key: [key.split(":")[0], ", ".join(resolve(key.split(":")[0])), key.split(":")[1]])
    rows: list[dict] = []
    for version in versions:  # what a default entry costs on disk against its checkpoint (issue 71's goal)
        made = raw[f"{version}:convert"][-1]
        metric(rows, f"{version}: bytes written / source bytes", made["bytes"] / 1e9, made["source_bytes"] / 1e9,
               "<= 1.30", made["bytes"] <= 1.30 * made["source_bytes"], unit="GB")
    lines = write(_out(scale), "versions-results", ctx=ctx, raw=raw, tables=[table, metric_table(rows)], metrics=rows,
                  what=f"{scale} synthetic checkpoints, each version's default layout and profile")
    print("\n".join(lines))
    return 0


def _changed_bytes(fine_tune: Path, release: Path) -> int:
    """Bytes of the fine-tune entry's chunks and device files whose content the release's entry does not hold."""
    mine, theirs = entry_at(fine_tune).manifest.arrays, entry_at(release).manifest.arrays
    held = {a.content_id for a in theirs.values()}
    return sum(r.file_bytes for a in mine.values() if a.content_id not in held for r in a.chunks.values())


FLOOR = "floor: copying the files it wrote, synced"
SHA256 = "bound: sha256 of its largest shard (one core)"


def _finetune_report(raw: dict[str, list], ctx: dict, out: Path) -> list[str]:
    """bench/finetune-results.{json,md}: the three converts side by side, and the issue's three goals."""
    after, base, coldft = raw["fine-tune, release cached"], raw["release, cold"], raw["fine-tune, cold"]
    ratio, floor = median(after) / median(base), median(raw[FLOOR]) / median(base)
    written, changed = median(after, "bytes"), median(after, "changed_bytes")
    table = contender_table(raw, columns=("convert",), extra={"bytes written": lambda r: f"{median(r, 'bytes') / 1e6:,.0f} MB"})
    goals = [f"- fine-tune after the release / the release cold: **{ratio:.2f}** (issue 48's goal <= 0.5)",
             f"- fine-tune after the release / the floor: **{ratio / floor:.2f}** (issue 48's goal <= 1.5)",
             f"- the floor (the files the fine-tune wrote, copied and synced) / the release cold: **{floor:.2f}**: "
             "no convert that writes what changed, durably, is faster on this disk",
             f"- the sha256 of the fine-tune's largest shard, which a plain folder's convert takes only with --sha256: "
             f"**{median(raw[SHA256]):.2f} s**, {median(raw[SHA256]) / median(raw[FLOOR]):.2f}x the floor and "
             f"{median(raw[SHA256]) / median(base):.2f}x the release cold, on one core (a hash stream is not split)",
             f"- bytes written / the changed targets' bytes: **{written / max(1, changed):.3f}** "
             f"({written / 1e6:,.0f} of {changed / 1e6:,.0f} MB; goal <= 1.05)",
             f"- the fine-tune's cold convert: peak RSS **{median(coldft, 'peak_rss_bytes') / 1e9:.2f} GB** (goal <= 1.5)"]
    what = (f"{ctx['scale']} synthetic {ctx['version']}, {ctx['layout']} / {ctx['profile']}, every slot; the fine-tune: "
            f"{ctx['fine_tune']}")
    return write(out, "finetune-results", ctx=ctx, raw=raw, what=what, tables=[table], after=goals)


def run_finetune(scale: str, runs: int, cold: bool) -> int:
    """A mixed-precision N1.6 fine-tune (pipeline/inputs/synth.py `fine_tune_form` "mixed": the action head and
    q_norm/k_norm F32 with new values, everything else the release's bytes), default layout and profile, every
    slot, in fresh processes: the release's cold convert; the fine-tune's convert into the cache holding the
    release (what changed only); the fine-tune's cold convert (peak RSS). Writes bench/finetune-results.{json,md}."""
    from pipeline.model.recipe import resolve
    from pipeline.inputs.synth import fine_tune_form

    version = VERSION
    _built()
    hf, release = _synthetic_snapshot(scale, version)
    fine_tune = DATA / f"finetune-{scale}-mixed"
    if not (fine_tune / "model.safetensors.index.json").is_file():
        remove(fine_tune)
        print(f"writing the mixed fine-tune of {version} ({scale}) into {fine_tune} (once)", flush=True)
        fine_tune_form(release, version, "mixed", fine_tune)
    layout, profile = resolve(version)
    warm_cache, cold_cache = DATA / f"cache-{scale}-finetune-warm", DATA / f"cache-{scale}-finetune-cold"
    scratch = DATA / f"copy-{scale}-finetune-changed"
    args = {"version": version, "profile": profile, "layout": layout}
    raw: dict[str, list] = {}
    started = time.time()
    for _ in range(runs):
        remove(warm_cache)
        settle()
        warm_up(release)
        raw.setdefault("release, cold", []).append(run_child("convert", {**args, "snapshot": str(release), "cache": str(warm_cache)}, cold))
        warm_up(warm_cache, fine_tune)  # its own shards last: the convert reads them, and only the manifests of the cache
        after = run_child("convert", {**args, "snapshot": str(fine_tune), "cache": str(warm_cache)}, cold)
        after["changed_bytes"] = _changed_bytes(Path(after["cache_path"]), Path(raw["release, cold"][-1]["cache_path"]))
        raw.setdefault("fine-tune, release cached", []).append(after)
        warm_up(Path(after["cache_path"]))
        raw.setdefault(FLOOR, []).append(run_child("copy_changed", {"entry": after["cache_path"], "scratch": str(scratch)},
                                                   cold, fresh=scratch))
        warm_up(fine_tune)
        raw.setdefault(SHA256, []).append(run_child("sha256", {"snapshot": str(fine_tune)}, cold))
        remove(warm_cache)  # both caches at once (28 GB at full size) do not fit beside the inputs here
        remove(cold_cache)
        settle()
        warm_up(fine_tune)
        raw.setdefault("fine-tune, cold", []).append(run_child("convert", {**args, "snapshot": str(fine_tune), "cache": str(cold_cache)}, cold))
        print(f"  run done: release {raw['release, cold'][-1]['seconds']:.1f} s; fine-tune after it "
              f"{after['seconds']:.1f} s, wrote {after['bytes'] / 1e6:,.0f} MB (changed {after['changed_bytes'] / 1e6:,.0f} MB); "
              f"fine-tune cold {raw['fine-tune, cold'][-1]['seconds']:.1f} s, "
              f"{raw['fine-tune, cold'][-1]['peak_rss_bytes'] / 1e9:.2f} GB peak", flush=True)
        remove(cold_cache)  # before the next run's caches: two runs' at once do not fit beside the inputs
    ctx = context(only="finetune", scale=scale, runs=runs, cold=cold, started=started, version=version, layout=layout,
                  profile=profile, slots="all 32",
                  fine_tune="action head and q_norm/k_norm F32 (new values), the rest the release's")
    lines = _finetune_report(raw, ctx, _out(scale))
    print("\n".join(lines))
    return 0


F32_SHAPES = {"F32, one file (LeRobot)": "lerobot", "F32, 5 GB shards (Isaac-GR00T)": "checkpoint"}


def _f32_report(raw: dict[str, list], ctx: dict, out: Path) -> list[str]:
    """bench/f32-results.{json,md}: each all-F32 shape's cold convert against the bf16 release's."""
    base = raw["release (bf16), cold"]
    table = contender_table(raw, columns=("convert, cold cache",),
                            extra={"read stage (summed)": lambda r: f"{median(r, 'read_seconds'):.1f} s"})
    goals = []
    for name in F32_SHAPES:
        ratio, peak = median(raw[name]) / median(base), median(raw[name], "peak_rss_bytes") / 1e9
        goals.append(f"- {name}: wall / the bf16 release's **{ratio:.2f}** (goal <= 1.2, "
                     f"runs {', '.join(f'{r['seconds']:.1f}' for r in raw[name])} s against "
                     f"{', '.join(f'{r['seconds']:.1f}' for r in base)} s); peak RSS **{peak:.2f} GB** (goal <= 1.2)")
    what = f"{ctx['scale']} synthetic {ctx['version']}, {ctx['layout']} / {ctx['profile']}, every slot, a cold cache each"
    return write(out, "f32-results", ctx=ctx, raw=raw, what=what, tables=[table], after=goals)


def run_f32(scale: str, runs: int, cold: bool, version: str = "n17") -> int:
    """An all-F32 fine-tune of N1.7 as the trainers save it (pipeline/inputs/synth.py: LeRobot's one file, Isaac-GR00T's
    5 GB shards; every value F32 with detail below bf16's), each converted into an empty cache in a fresh process,
    alternating with the bf16 release's cold convert. Writes bench/f32-results.{json,md}."""
    from pipeline.model.recipe import resolve
    from pipeline.inputs.synth import fine_tune_form

    _built()
    hf, release = _synthetic_snapshot(scale, version)
    forms = {}
    for name, form in F32_SHAPES.items():
        out = DATA / f"f32-{scale}-{version}-{form}"
        made = out / "checkpoint-1000" if form == "checkpoint" else out
        if not (made / "config.json").is_file():
            remove(out)
            print(f"writing the {name} fine-tune of {version} ({scale}) into {out} (once)", flush=True)
            made = fine_tune_form(release, version, form, out)
        forms[name] = made
    layout, profile = resolve(version)
    cache = DATA / f"cache-{scale}-f32"
    args = {"version": version, "profile": profile, "layout": layout, "cache": str(cache)}
    raw: dict[str, list] = {}
    started = time.time()
    for _ in range(runs):
        for name, snapshot in {"release (bf16), cold": release, **forms}.items():
            remove(cache)
            settle()
            warm_up(*(p.resolve() for p in snapshot.iterdir() if p.suffix == ".safetensors"))
            run = run_child("convert", {**args, "snapshot": str(snapshot)}, cold)
            run["read_seconds"] = run["stage_seconds"].get("read", 0.0)
            raw.setdefault(name, []).append(run)
            print(f"  {name}: {run['seconds']:.1f} s, read stage {run['read_seconds']:.1f} s, "
                  f"{run['peak_rss_bytes'] / 1e9:.2f} GB peak", flush=True)
    remove(cache)
    ctx = context(only="f32", scale=scale, runs=runs, cold=cold, started=started, version=version, layout=layout,
                  profile=profile, slots="all 32")
    lines = _f32_report(raw, ctx, _out(scale))
    print("\n".join(lines))
    return 0
