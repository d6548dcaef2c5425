"""Build an entry: run the graph for what no published entry holds, and publish it.

Into a local folder the entry is built under a temporary name, adopting a killed run's work, and published by
rename (tasks/entries/publish.py); a device open beside an object-store cache builds it here and pushes it after.
Into an object store, every stage task puts its objects there from the worker that runs it, and the publish task
puts the manifest last: the client plans and names, the workers write. Either way, what a published entry of the
store already holds is given to the new entry, not converted, written or sent (pipeline/jobs/reuse.py).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import time
from dataclasses import replace

from pipeline import cache
from pipeline.jobs.graph import PUBLISH, GraphInputs, build_graph
from pipeline.jobs.options import ConvertOptions
from pipeline.jobs.prepare import Prepared
from pipeline.jobs.reuse import Reuse, plan_reuse
from pipeline.jobs.run import run, shared_folders
from pipeline.jobs.summary import peak_rss_bytes, source_bytes_read
from tasks.io.bulk_write import writes_finished
from tasks.io.file_blocks import is_remote
from tasks.entries.chunks import create_arrays
from tasks.entries.entry import Entry
from tasks.entries.manifest import array_documents
from tasks.entries.names import entry_key, scratch_name
from tasks.entries.objects import FRESH_FOR, Listing
from tasks.entries.objects import present_objects
from tasks.entries.progress import adopt_staged
from tasks.entries.publish import keep_processor, push
from tasks.entries.store import Store
from tasks.errors import CacheError
from tasks.io.network import stall_seconds


def build(opts: ConvertOptions, prep: Prepared, store: Store, name: str | None = None,
          against: Entry | None = None) -> dict:
    """Build `prep`'s entry for `store` and publish it, as `name` (default: its own). Returns how it went, as the
    summary's fields (pipeline/jobs/summary.py). `against`: the published entry to check instead: a fresh build
    beside it is compared with it, and deleted (--check-against-cache)."""
    if against is not None:
        return _checked(against, opts, prep, store)
    ck, plan, slots, ident = prep.checkpoint, prep.plan, prep.slots, prep.identity
    name = name or prep.name
    in_store = not store.can_rename and opts.device is None  # the workers put the entry into the store themselves
    building = store if in_store else cache.build_store(store)
    tmp = None if in_store else cache.claim_tmp(prep.root, name)
    key = entry_key(name) if tmp is None else tmp.relative_to(prep.root).as_posix()  # where it is built, in `building`
    present = present_objects(store) if in_store else {}
    fresh_after = time.time() - FRESH_FOR if in_store else 0.0
    try:
        arrays = array_documents(plan, slots)
        reused = Reuse() if opts.force or not opts.reuse else plan_reuse(  # --force: "rebuild from the source"
            building, prep, building_at=key, array_attrs={n: doc["attributes"] for n, doc in arrays.items()},
            listing=Listing(present, fresh_after))
        done = dict(reused.records)
        keep_processor(store if in_store else None, tmp, prep.processor)
        if tmp is not None:
            create_arrays(tmp, arrays, like=[building.path(entry_key(e)) for e in reused.holders])
            done = adopt_staged(tmp, plan.targets, slots, reused.records)
        graph = build_graph(GraphInputs(
            plan=plan, checkpoint=ck, slots=slots, expected_identity=dict(ident.shards), done=done, identity=ident,
            arrays=arrays, check_bf16=opts.check_bf16, known=reused.verified, identified=prep.identified,
            record_sha256=opts.sha256, device=opts.device, replace=opts.force, entry_tmp=tmp,
            # writes handed to writer threads only from the threads scheduler's: on the main thread (sync), a Ctrl-C
            # landing inside a Condition's __enter__ once it holds its lock leaves it held, and the run hangs
            entry_final=cache.entries_dir(prep.root) / name, write_behind=opts.scheduler == "threads",
            store_url=store.describe("") if in_store else None, stall=stall_seconds(), present=present,
            fresh_after=fresh_after))
        bytes_read = source_bytes_read(plan, ck, slots, done)
        # threads by the bytes only where a task waits on nothing but this machine: while one waits on the network,
        # the next runs (a convert through a bad network took twice as long on one thread)
        result, timings = run(graph, PUBLISH, opts.scheduler, opts.workers, opts.progress, shared_folders(ck.dir, tmp),
                              store.describe("") if in_store else None,
                              work_bytes=None if tmp is None or is_remote(ck.dir) else bytes_read)
    except BaseException as e:
        if tmp is not None:
            _clean_up_after(e, tmp, name)
        raise
    pushed = local_build = None
    if in_store:
        pushed = sum(n for k, n in result["objects"].items() if k not in present) + result["document_bytes"]
    elif not store.can_rename:  # a device is open here: built beside it, then pushed
        final = cache.entries_dir(prep.root) / name
        local_build, pushed = str(final), push(cache.entry_at(final), store, opts.progress)
    return dict(cache_hit=False, resumed_chunks=len(done) - len(reused.records), reused_chunks=len(reused.records),
                reused_bytes=reused.reused_bytes, identified_shards=sorted(reused.identified), tasks=len(graph),
                bytes_read=bytes_read,
                bytes_written=result["file_bytes"] - sum(r.record.file_bytes for r in done.values()),
                stage_seconds=timings["stage_seconds"], stage_tasks=timings["stage_tasks"],
                peak_rss_bytes=peak_rss_bytes(), published_here=result["published_here"],
                device_tensors=result["device_tensors"], shards_sha256=result["shards_sha256"],
                numerics=sorted(result["numerics"], key=lambda n: (n["pcc"], -n["max_abs_err"])),
                pushed_bytes=pushed, local_build=local_build, worker_retries=timings.get("worker_retries", {}))


def _clean_up_after(error: BaseException, tmp, name: str) -> None:
    """After `error` stopped a build in the folder `tmp`. A kill -9 never gets here and Ctrl-C is let through, so
    their folder stays for the next run to resume; an error must not leave a half-built folder behind (nor a write
    handed off make it again). A full disk is said in one sentence."""
    with contextlib.suppress(Exception):  # the error being raised is `error`; a handed-off write's is a symptom
        writes_finished(tmp)
    if not isinstance(error, KeyboardInterrupt):
        shutil.rmtree(tmp, ignore_errors=True)
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        raise CacheError(f"{error.filename or tmp}: no space left on the device while staging {name}; nothing was "
                         f"published and the temporary files were removed — free space or pass --cache DIR on a "
                         f"larger disk") from error


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
