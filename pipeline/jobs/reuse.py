"""Fine-tunes convert in proportion to what changed.

Every published array carries a content id: a hash of its source tensors' bytes (xxh3-128 per tensor, taken during
the verify pass), its transform and device format, and the converter version. Before a conversion runs, the
tensors of each shard are identified — from an earlier entry when the shard's identity (its HF blob sha256, or
its content identity) is unchanged, by one xxh3 pass otherwise (its sha256 is then taken by the graph's verify
task, beside the conversion) — and every target whose content id some published entry already holds is given to
the new entry inside the store (a hard link in a local folder; in an object store, the new manifest names the
same objects) instead of being read, converted, written or sent. A typical fine-tune changes the action head: the
backbone shard is untouched, so only the action-head shard is hashed and only the changed targets are converted.
"""

from __future__ import annotations

from collections import Counter
import os
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Mapping

from pipeline.cache.homes import EntryHome
from pipeline.jobs.prepare import Prepared
from tasks.source.checkpoint import Checkpoint
from tasks.plan import work_units
from tasks.entries.entry import Entry, list_entries
from tasks.entries.manifest import Staged, content_id
from tasks.device.one_file import chunk_rank
from tasks.entries.names import CONVERTER_VERSION, chunk_file, packed_path
from tasks.source.shards import CONTENT_ID, VerifiedShard, identify_shards
from tasks.entries.objects import Listing
from tasks.entries.store import Store


@dataclass
class Reuse:
    records: dict = field(default_factory=dict)    # (target, slot) -> Staged, linked from another entry
    verified: dict = field(default_factory=dict)   # shard -> VerifiedShard identified before the graph by its identity
    identified: set = field(default_factory=set)   # shards known by identity alone: verified only if read from
    reused_bytes: int = 0                          # what the reused chunks and device files hold: linked here, or named in a bucket
    objects: set = field(default_factory=set)      # the keys the reused chunks and device files were given
    holders: list = field(default_factory=list)    # the entries given from, the one giving most first


def _published(store: Store, version: str) -> list[Entry]:
    out = [e for _, e, state in list_entries(store) if state == "published" and e.manifest.version == version]
    return sorted(out, key=lambda e: e.manifest.published_unix, reverse=True)


def _known_tensor_hashes(entries: list[Entry], identity: str) -> tuple[dict[str, str], str | None]:
    """Per-key hashes recorded by entries converted from a shard of this identity, and its sha256 as recorded."""
    known: dict[str, str] = {}
    sha256 = None
    for e in entries:
        names = [s for s, v in e.manifest.shards.items() if v == identity]
        if names:
            # an entry written before shards_sha256 existed was named by the sha256 itself
            sha256 = sha256 or e.manifest.shards_sha256.get(names[0]) or (
                None if identity.startswith(CONTENT_ID) else identity)
            for arr in e.manifest.arrays.values():
                known.update(arr.source_xxh3)
    return known, sha256


def _tensor_hashes(ck: Checkpoint, entries: list[Entry], identities: dict[str, str],
                   identified: Mapping[str, Mapping[str, str]], reuse: Reuse) -> dict[str, str]:
    """Every key's xxh3-128: from the pass that named the entry (`identified`), from an earlier entry of a shard of
    the same identity (recorded in `reuse` as identified), or, for a changed shard, by one xxh3 pass, both shards
    at once (its sha256 is left to the graph's verify task, beside the conversion; sha256 is the slow hash)."""
    hashes: dict[str, str] = {}
    unknown = []
    for shard, header in ck.headers.items():
        known, sha256 = _known_tensor_hashes(entries, identities[shard])
        if shard in identified:
            hashes.update(identified[shard])
        elif all(k in known for k in header.entries):
            hashes.update({k: known[k] for k in header.entries})
            reuse.verified[shard] = VerifiedShard(header, sha256, {k: known[k] for k in header.entries})
            reuse.identified.add(shard)
        else:
            unknown.append(header)
    for tensors in identify_shards(unknown, os.cpu_count() or 1) if unknown else ():
        hashes.update(tensors)
    return hashes


def plan_reuse(home: EntryHome, prep: Prepared, *, building_at: str, array_attrs: dict[str, dict],
               listing: Listing = Listing()) -> Reuse:
    """Give the entry of `prep` being built under key `building_at` every chunk (and device file) whose content id
    a published entry of `home` already holds; returns what was reused. The home gives them its way (a folder by
    hard links into `building_at`; in an object store the new manifest names the same objects: `listing`, those
    there, and which of them are old enough to be freshened first)."""
    reuse = Reuse()
    plan, slots = prep.plan, prep.slots
    entries = _published(home.store, plan.version)
    if not entries:
        return reuse
    hashes = _tensor_hashes(prep.checkpoint, entries, dict(prep.identity.shards), prep.identified or {}, reuse)
    by_id: dict[str, tuple[Entry, str]] = {}
    for e in reversed(entries):  # newest wins
        for name, arr in e.manifest.arrays.items():
            if arr.content_id and home.gives(arr):
                by_id[arr.content_id] = (e, name)
    holder = {t.name: by_id.get(content_id([hashes[k] for k in t.sources], array_attrs[t.name], CONVERTER_VERSION))
              for t in plan.targets}
    held: dict[tuple[str, int | None], tuple[Staged, str, dict[str, tuple[str, int]]]] = {}
    for t, slot in work_units(plan.targets, slots):
        if holder[t.name] is None:
            continue
        entry, name = holder[t.name]
        arr = entry.manifest.arrays[name]
        rec = arr.chunks.get(slot)
        if rec is None or (t.device_file and rec.tensorbin is None and not arr.tiled):  # its device file is wanted
            continue
        at = PurePosixPath(building_at)  # new key -> (the holder's key, size)
        objects = {chunk_file(at, t.name, chunk_rank(t), slot).as_posix(): (entry.chunk_object(name, slot), rec.nbytes)}
        if rec.tensorbin:
            objects[packed_path(at, t.name, slot).as_posix()] = (entry.device_object(name, slot), rec.tensorbin.nbytes)
        held[(t.name, slot)] = Staged(t.name, slot, rec), entry.name, objects
    made = home.give(held, listing)
    for unit, (staged, _, objects) in held.items():
        if all(new in made for new in objects):  # a chunk whose holder went meanwhile is converted instead
            reuse.records[unit] = staged
            reuse.reused_bytes += sum(size for _, size in objects.values())
            reuse.objects.update(objects)
    given = Counter(e for _, e, objects in held.values() if all(new in made for new in objects))
    reuse.holders = [e for e, _ in given.most_common()]
    return reuse
