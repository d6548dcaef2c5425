"""The convert job, along its flow: prepare (find, read, plan, name: pipeline/jobs/prepare.py), then the entry the
cache holds (pipeline/jobs/cached.py), a check of it against a fresh conversion, or a build (pipeline/jobs/build_entry.py),
and what it did as one record (pipeline/jobs/summary.py)."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import replace

from pipeline import cache
from pipeline.cache.roots import writable_folder
from pipeline.jobs.build_entry import build
from pipeline.jobs.cached import from_cache
from pipeline.jobs.options import ConvertOptions
from pipeline.jobs.prepare import prepare
from pipeline.jobs.run import IN_PROCESS, check_scheduler
from pipeline.jobs.summary import ConvertSummary
from tasks.entries.names import entry_key
from tasks.entries.refs import write_ref
from tasks.errors import CacheError, ConfigError
from tasks.io.file_blocks import is_remote
from tasks.io.network import retries_since, retries_so_far

__all__ = ["ConvertOptions", "convert", "writable_folder"]


def convert(options: ConvertOptions | str | None = None, /, **keywords) -> ConvertSummary:
    """Convert (or reuse) one entry; returns what it did (pipeline/jobs/summary.py). The entry is built in a
    local folder and published there by rename, or put into an object store by the workers, manifest last.

    `convert("n17", snapshot=..., embodiments=...)`: the version (None, or left out with `snapshot` or `model`:
    found from the keys) and `ConvertOptions`'s fields as keywords; or `convert(ConvertOptions(...))`."""
    if isinstance(options, ConvertOptions):
        if keywords:
            raise TypeError(f"convert(ConvertOptions(...)) takes no keywords as well ({', '.join(keywords)}): put "
                            "them in the ConvertOptions, or pass the version and every option as keywords")
        opts = options
    else:
        opts = ConvertOptions(options, **keywords)
    check_scheduler(opts.scheduler)  # what can be refused is refused before anything is read or claimed
    if opts.device is not None and opts.scheduler not in IN_PROCESS:
        raise ConfigError(f"--device needs the threads or sync scheduler (an open device cannot move to "
                          f"{opts.scheduler} workers)")
    t0, retried_before = time.perf_counter(), retries_so_far()
    store = cache.cache_store(opts.cache_root, opts.stall_seconds)
    root = cache.build_root(store)
    writable_folder(root, "cache")
    prep = prepare(opts, root)
    plan, ident = prep.plan, prep.identity
    asked = ConvertSummary(version=plan.version, version_found=opts.version is None, layout=plan.layout,
                           profile=plan.profile, fingerprint=ident.fingerprint,
                           cache_path=store.describe(entry_key(prep.name)), slots=list(prep.slots),
                           targets=len(plan.targets), skipped=dict(plan.skipped), source=ident.source,
                           notes=list(prep.notes), shards_checked_against=ident.shards_checked_against,
                           processor=prep.processor_said)
    with prep.checkpoint:
        existing = cache.find_entry(store, prep.name) if not opts.force else None
        if opts.check_against_cache and existing is None:
            raise CacheError(f"{asked.cache_path}: nothing is cached for this conversion, so there is nothing to "
                             "check against; run the convert without --check-against-cache first")
        if existing is not None and not opts.check_against_cache:
            went = from_cache(opts, prep, store, existing)
        else:
            went = build(opts, prep, store, against=existing)
    if not opts.check_against_cache:
        write_ref(store, plan.version, plan.layout, plan.profile, prep.name, bool(ident.synthetic))
    remote = cache.home_of(store).over_network or is_remote(prep.checkpoint.dir)
    workers = Counter(went.pop("worker_retries", {}))  # a cluster's workers' requests
    retried = dict(sorted((Counter(retries_since(retried_before)) + workers).items())) if remote else None
    return replace(asked, **went, seconds=time.perf_counter() - t0, store_retries=retried)
