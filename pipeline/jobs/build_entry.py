"""Build an entry: run the graph for what no published entry holds, and publish it.

Into a local folder the entry is built under a temporary name, adopting a killed run's work, and published by
rename (tasks/entries/publish.py); a device open beside an object-store cache builds it here and pushes it after.
Into an object store, every stage task puts its objects there from the worker that runs it, and the publish task
puts the manifest last: the client plans and names, the workers write. Either way, what a published entry of the
store already holds is given to the new entry, not converted, written or sent (pipeline/jobs/reuse.py).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import replace

from pipeline import cache
from pipeline.jobs.graph import PUBLISH, GraphInputs, build_graph
from pipeline.jobs.options import ConvertOptions
from pipeline.jobs.prepare import Prepared
from pipeline.jobs.reuse import Reuse, plan_reuse
from pipeline.jobs.run import run, shared_folders
from pipeline.jobs.summary import peak_rss_bytes, source_bytes_read
from tasks.io.file_blocks import is_remote
from tasks.entries.entry import Entry
from tasks.entries.manifest import array_documents
from tasks.entries.names import scratch_name
from tasks.entries.store import Store
from tasks.errors import CacheError


def build(opts: ConvertOptions, prep: Prepared, store: Store, name: str | None = None,
          against: Entry | None = None) -> dict:
    """Build `prep`'s entry for `store` and publish it, as `name` (default: its own). Returns how it went, as the
    summary's fields (pipeline/jobs/summary.py). `against`: the published entry to check instead: a fresh build
    beside it is compared with it, and deleted (--check-against-cache)."""
    if against is not None:
        return _checked(against, opts, prep, store)
    ck, plan, slots, name = prep.checkpoint, prep.plan, prep.slots, name or prep.name
    home = cache.home_of(store)
    builder = home.builder(device_open=opts.device is not None)  # where the entry is built
    # writes handed to writer threads only from the threads scheduler's: on the main thread (sync), a Ctrl-C landing
    # inside a Condition's __enter__ once it holds its lock leaves it held, and the run hangs
    site = builder.start(name, replace=opts.force, behind=opts.scheduler == "threads")
    try:
        arrays = array_documents(plan, slots)
        reused = Reuse() if opts.force or not opts.reuse else plan_reuse(  # --force: "rebuild from the source"
            builder, prep, building_at=site.key, array_attrs={n: doc["attributes"] for n, doc in arrays.items()},
            listing=site.listing)
        done = builder.lay_out(site, plan, slots, arrays, reused.records, reused.holders, prep.processor)
        graph = build_graph(GraphInputs(
            plan=plan, checkpoint=ck, slots=slots, expected_identity=dict(prep.identity.shards), done=done,
            identity=prep.identity, arrays=arrays, check_bf16=opts.check_bf16, known=reused.verified,
            identified=prep.identified, record_sha256=opts.sha256, device=opts.device, place=site.place))
        bytes_read = source_bytes_read(plan, ck, slots, done)
        # threads by the bytes only where a task waits on nothing but this machine: while one waits on the network,
        # the next runs (a convert through a bad network took twice as long on one thread)
        result, timings = run(graph, PUBLISH, opts.scheduler, opts.workers, opts.progress,
                              shared_folders(ck.dir, site.folder), site.store,
                              work_bytes=None if site.folder is None or is_remote(ck.dir) else bytes_read)
    except BaseException as e:
        builder.abandon(site, e)
        raise
    pushed_from = home.push(builder, name, opts.progress)  # built here, published there (a device open by a bucket)
    local_build, pushed = pushed_from if pushed_from is not None else (None, builder.sent(site, result))
    return dict(cache_hit=False, resumed_chunks=len(done) - len(reused.records), reused_chunks=len(reused.records),
                reused_bytes=reused.reused_bytes, identified_shards=sorted(reused.identified), tasks=len(graph),
                bytes_read=bytes_read,
                bytes_written=result["file_bytes"] - sum(r.record.file_bytes for r in done.values()),
                stage_seconds=timings["stage_seconds"], stage_tasks=timings["stage_tasks"],
                peak_rss_bytes=peak_rss_bytes(), published_here=result["published_here"],
                device_tensors=result["device_tensors"], shards_sha256=result["shards_sha256"],
                numerics=sorted(result["numerics"], key=lambda n: (n["pcc"], -n["max_abs_err"])),
                pushed_bytes=pushed, local_build=local_build, worker_retries=timings.get("worker_retries", {}))


def _checked(existing: Entry, opts: ConvertOptions, prep: Prepared, store: Store) -> dict:
    """Convert afresh into a scratch entry beside `existing` and compare every chunk with it, so a cache can never
    hide a broken conversion. The scratch entry is deleted either way."""
    scratch = scratch_name(existing.name, os.getpid())
    folder = cache.entries_dir(prep.root) / scratch
    try:
        build(replace(opts, reuse=False), prep, cache.build_store(store), scratch)
        fresh = cache.entry_at(folder).manifest.arrays
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    cached = existing.manifest.arrays
    differ = sorted(n for n in fresh.keys() | cached.keys() if fresh.get(n) != cached.get(n))
    problems = existing.verify()
    if differ or problems:
        raise CacheError(f"{existing.describe()}: the cached entry differs from a fresh conversion in {len(differ)} "
                         f"array(s){' (first ' + differ[0] + ')' if differ else ''} and has {len(problems)} bad "
                         "chunk(s); delete it or convert with --force")
    return {"cache_hit": True, "checked_against_fresh_conversion": True, "arrays_compared": len(fresh), "tasks": 0,
            "bytes_read": 0, "bytes_written": 0, "peak_rss_bytes": peak_rss_bytes()}
