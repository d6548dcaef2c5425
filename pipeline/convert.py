"""The convert job: snapshot -> plan -> fingerprint -> (cache hit | graph run -> publish) -> summary."""

from __future__ import annotations

import resource
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from pipeline import cache
from pipeline.graph import PUBLISH, GraphInputs, build_graph
from pipeline.recipe import Plan, build_plan
from pipeline.run import run
from pipeline.snapshot import resolve_snapshot
from pipeline.versions import load_config
from tasks.checkpoint import Checkpoint
from tasks.stage import already_staged


@dataclass(frozen=True)
class ConvertOptions:
    version: str
    profile: str = "bf16"
    embodiments: str = "all"
    scheduler: str = "threads"
    snapshot: Path | None = None
    hf_cache: Path | None = None
    cache_root: Path | None = None
    force: bool = False
    workers: int | None = None
    progress: bool = True
    check_bf16: bool = False  # round-trip bf16 targets through ttnn too (exact by construction; slow)


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def prepare(opts: ConvertOptions) -> tuple[Checkpoint, Plan, tuple[int, ...], dict, Path]:
    """Everything up to the fingerprint: open and check the snapshot, plan the targets, name the entry."""
    cfg = load_config(opts.version)
    ck = Checkpoint(resolve_snapshot(cfg, opts.snapshot, opts.hf_cache))
    plan = build_plan(opts.version, {k: ck.shape(k) for k in _state_dict_order(ck)}, opts.profile)
    slots = cfg.slot_ids(opts.embodiments)
    root = cache.cache_root(opts.cache_root)
    ident = cache.identity(plan, cfg.revision, cache.source_sha256(root, ck), slots)
    return ck, plan, slots, ident, root


def _state_dict_order(ck: Checkpoint) -> list[str]:
    # The index preserves no order; target order only affects presentation, so sort keys like the layout does.
    return ck.keys()


def convert(opts: ConvertOptions) -> dict:
    """Convert (or reuse) one entry; returns the summary that `convert --json` prints."""
    t0 = time.perf_counter()
    ck, plan, slots, ident, root = prepare(opts)
    name = cache.entry_name(ident)
    final = cache.entries_dir(root) / name
    summary = {"version": opts.version, "profile": opts.profile, "fingerprint": ident["fingerprint"],
               "cache_path": str(final), "slots": list(slots), "targets": len(plan.targets),
               "skipped": dict(plan.skipped)}
    existing = cache.find_entry(root, name) if not opts.force else None
    if existing is not None:
        cache.set_ref(root, opts.version, opts.profile, name)
        return {**summary, "cache_hit": True, "tasks": 0, "bytes_read": 0, "bytes_written": 0,
                "seconds": time.perf_counter() - t0, "peak_rss_bytes": peak_rss_bytes()}
    if opts.force and final.exists():
        shutil.rmtree(final)
    tmp = cache.claim_tmp(root, name)
    try:
        cache.create_arrays(tmp, plan, slots, ident)
        done = {}
        for t in plan.targets:
            for slot in (slots if t.embodiment else (None,)):
                record = already_staged(tmp, t.name, slot, len(t.shape))
                if record is not None:
                    done[(t.name, slot)] = record
        inputs = GraphInputs(plan, ck, slots, tmp, final, {s: ck.blob_sha256(s) or ident["shards"][s] for s in ck.headers},
                             done, ident, opts.check_bf16)
        graph = build_graph(inputs)
        result, timings = run(graph, PUBLISH, opts.scheduler, opts.workers, opts.progress)
    except BaseException:
        # Keep the temporary directory only when it can be resumed: a kill never reaches here, an error should
        # not leave a half-entry behind for the next run to trust.
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        ck.close()
    cache.set_ref(root, opts.version, opts.profile, name)
    stage_bytes = sum(n["nbytes"] for n in result["numerics"])
    read_bytes = _source_bytes_read(plan, ck, slots, done)
    return {**summary, "cache_hit": False, "resumed_chunks": len(done), "tasks": len(graph),
            "bytes_read": read_bytes, "bytes_written": stage_bytes,
            "seconds": time.perf_counter() - t0, "stage_seconds": timings["stage_seconds"],
            "stage_tasks": timings["stage_tasks"], "peak_rss_bytes": peak_rss_bytes(),
            "published_here": result["published_here"],
            "numerics": sorted(result["numerics"], key=lambda n: (n["pcc"], -n["max_abs_err"]))}


def _source_bytes_read(plan: Plan, ck: Checkpoint, slots: tuple[int, ...], done: dict) -> int:
    """Bytes the read/slot tasks fetched (verify's hashing pass is counted separately in its stage time)."""
    total = 0
    for t in plan.targets:
        for slot in (slots if t.embodiment else (None,)):
            if (t.name, slot) in done:
                continue
            for key in t.sources:
                nbytes = ck.info(key).nbytes
                total += nbytes // ck.shape(key)[0] if slot is not None else nbytes
    return total
