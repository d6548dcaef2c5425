"""A convert whose entry the cache already holds: nothing is read or converted. The entry is named by what it is
made from, so finding it is the whole check; --sha256 gives the shards' sha256 as the entry recorded them (or takes
them now), and --device uploads the selection from the cache."""

from __future__ import annotations

import hashlib

from pipeline.jobs.load import load
from pipeline.jobs.options import ConvertOptions
from pipeline.jobs.prepare import Prepared
from pipeline.jobs.summary import peak_rss_bytes
from tasks.entries.entry import Entry
from tasks.entries.store import Store
from tasks.io.file_blocks import open_binary


def from_cache(opts: ConvertOptions, prep: Prepared, store: Store, existing: Entry) -> dict:
    """How the convert went when `existing` is its entry, as the summary's fields (pipeline/jobs/summary.py)."""
    ck, plan, slots = prep.checkpoint, prep.plan, prep.slots
    recorded = dict(existing.manifest.shards_sha256)
    notes = []
    if opts.sha256 and not set(recorded) >= set(ck.headers):  # converted without --sha256: taken now, and said so
        for shard in sorted(ck.headers):
            with open_binary(ck.shard_path(shard)) as f:
                recorded[shard] = hashlib.file_digest(f, "sha256").hexdigest()
        notes.append(f"sha256 taken now: {existing.describe()} was converted without --sha256 and does not record "
                     "them; convert with --force --sha256 to record them in the entry")
    uploaded = None
    if opts.device is not None:  # nothing to convert: upload straight from the cache
        uploaded = load(plan.version, store, slots[0] if len(slots) == 1 else None, into=opts.device,
                        entry=prep.name, synthetic=True).tensors  # the entry named: its layout and profile with it
    return dict(cache_hit=True, tasks=0, bytes_read=0, bytes_written=0, shards_sha256=recorded,
                notes=list(prep.notes) + notes, device_tensors=uploaded, peak_rss_bytes=peak_rss_bytes())
