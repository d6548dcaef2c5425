"""The last two stages: close a unit, and publish a finished entry (manifest last, then one rename).

Publication order is the protocol (cache/README.md): every chunk is in place and synced, the consolidated group
metadata is written, then `MANIFEST.json` (per-chunk checksums), then `rename(tmp, final)`. A reader accepts
only a final directory with a manifest, so a crash at any point leaves either nothing or a complete entry.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import functools
import hashlib
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping, Sequence

from tasks.errors import CacheError
from tasks.source.shards import VerifiedShard
from tasks.io.bulk_write import write_json_atomic, writes_finished
from tasks.entries.manifest import Identity, Manifest, Staged, group_document, manifest_arrays
from tasks.entries.entry import Entry
from tasks.entries.names import (MANIFEST, OBJECTS, PACKED_SUFFIX, PROGRESS_DIR, entry_key, manifest_key, object_key,
                                 set_aside_name)
from tasks.entries.objects import FRESH_FOR, present_objects, still_held
from tasks.entries.cache_root import store_at
from tasks.entries.store import Store
from tasks.entries.zarr_v3 import METADATA
from tasks.device.ttnn_edge import Uploaded


@dataclass(frozen=True)
class UnitDone:
    """A unit (layer, block, ...) whose targets are all staged (and uploaded, when a device is open) and whose
    shards are all verified."""
    unit: str
    staged: tuple[Staged, ...]
    device: Mapping[tuple[str, int | None], object]  # (target, slot) -> device tensor
    shards: tuple[str, ...]


def unit_done(unit: str, staged: Sequence[Staged | Uploaded], verified: Sequence[VerifiedShard]) -> UnitDone:
    """A unit is complete once all its targets are staged (and uploaded) and every shard it read from has been
    verified (one, or two for the unit a shard boundary cuts)."""
    records = tuple(s.staged if isinstance(s, Uploaded) else s for s in staged)
    on_device = {(s.staged.name, s.staged.slot): s.tensor for s in staged if isinstance(s, Uploaded)}
    return UnitDone(unit, records, on_device, tuple(v.header.path.name for v in verified))


def _fsync(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """Make every file durable before the rename that publishes them (zarr-style writes never fsync). Where the
    OS has syncfs(2), one call flushes the filesystem: an N1.6 port-plan entry's ~4,800 fsyncs took 0.76 s, alone
    at the end of the convert. Elsewhere, each file is fsynced."""
    if _syncfs(root):
        return
    for dirpath, _, files in os.walk(root):
        for name in files:
            _fsync(os.path.join(dirpath, name))


def _syncfs(path: Path) -> bool:
    syncfs = getattr(_libc(), "syncfs", None)
    if syncfs is None:
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        if syncfs(fd) != 0:
            raise OSError(ctypes.get_errno(), f"syncfs failed: {os.strerror(ctypes.get_errno())}", str(path))
    finally:
        os.close(fd)
    return True


@functools.cache
def _libc() -> object:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _manifest(identity: Identity, array_meta: Mapping[str, dict], units: Sequence[UnitDone],
              verified: Sequence[VerifiedShard], where: str) -> tuple[Manifest, list[Staged]]:
    """The manifest of an entry whose every array has been staged (`where`: the entry, for the refusal)."""
    tensor_xxh3 = {k: h for v in verified for k, h in v.tensor_xxh3.items()}
    staged = [s for u in units for s in u.staged]
    missing = sorted(set(array_meta) - {s.name for s in staged})
    if missing:
        raise CacheError(f"{where}: array {missing[0]!r} was created but nothing was staged into it; nothing was "
                         "published — convert again")
    arrays = manifest_arrays(staged, array_meta, tensor_xxh3, identity.converter)
    shards_sha256 = {v.header.path.name: v.sha256 for v in verified if v.sha256}
    return Manifest.published(identity, arrays, sum(s.record.nbytes for s in staged), len(staged), shards_sha256), staged


def _result(where: str, won: bool, manifest: Manifest, staged: Sequence[Staged], units: Sequence[UnitDone]) -> dict:
    written = sum(s.record.file_bytes for s in staged)
    return {"cache_path": where, "published_here": won, "bytes": manifest.bytes, "file_bytes": written,
            "chunks": manifest.chunks, "shards_sha256": dict(manifest.shards_sha256),
            "numerics": [s.numerics() for s in staged], "device_tensors": {k: v for u in units for k, v in u.device.items()}}


def publish_into_store(store_url: str, stall: float, name: str, identity: Identity, array_meta: Mapping[str, dict],
                       units: Sequence[UnitDone], verified: Sequence[VerifiedShard]) -> dict:
    """Publish an entry whose objects the workers put into an object store themselves (tasks/stage.py
    `stage_into_store`) or an earlier entry holds: its `MANIFEST.json`, which names every one, once each is there
    (a reader never sees half an entry, and `cache gc` cannot have taken one meanwhile unnoticed). Runs on whichever
    worker the scheduler picks: it needs the store, not a folder (`stall`: the client's stall limit)."""
    store, entry = store_at(store_url, stall), entry_key(name)
    manifest, staged = _manifest(identity, array_meta, units, verified, store.describe(entry))
    check_objects_there(store, manifest, entry)
    encoded = manifest.encoded()
    store.put(manifest_key(name), encoded)
    return {**_result(store.describe(entry), True, manifest, staged, units), "document_bytes": len(encoded),
            "objects": {rec.object: rec.nbytes for s in staged for rec in (s.record, s.record.tensorbin) if rec}}


def check_objects_there(store: Store, manifest: Manifest, entry: str) -> None:
    """Every object the manifest names is in the store with its size, or nothing is published."""
    there = store.sizes(OBJECTS)
    for name, kept in manifest.processor.items():
        if there.get(object_key(str(kept["sha256"]))) != kept["nbytes"]:
            raise CacheError(f"{store.describe(object_key(str(kept['sha256'])))}: processor file {name} is not in the "
                             f"store as {entry} was published; nothing was published — convert again")
    for arr in manifest.arrays.values():
        for record in arr.chunks.values():
            for rec in (record, record.tensorbin):
                if rec is not None and (rec.object is None or there.get(rec.object) != rec.nbytes):
                    raise CacheError(f"{store.describe(rec.object or entry)}: gone from the store before {entry} was "
                                     "published (a `cache gc` meanwhile?); nothing was published — convert again")


def publish_entry(tmp: str, final: str, identity: Identity, array_meta: Mapping[str, dict],
                  units: Sequence[UnitDone], verified: Sequence[VerifiedShard], replace: bool = False) -> dict:
    """Write the manifest into `tmp` and rename it to `final`. Losing a race to an identical entry is success.
    `replace` (--force): a published `final` is moved aside only now, once the new entry is complete, and
    deleted after the rename (readers holding its files keep them)."""
    tmp_dir, final_dir = Path(tmp), Path(final)
    writes_finished(tmp_dir)  # the stage tasks' writes handed off in this process (tasks/stage.py)
    manifest, staged = _manifest(identity, array_meta, units, verified, str(tmp_dir))
    write_json_atomic(tmp_dir / METADATA, group_document(array_meta, identity))
    shutil.rmtree(tmp_dir / PROGRESS_DIR, ignore_errors=True)
    for orphan in tmp_dir.rglob("*.partial"):  # a killed run's half-written temporaries: never part of an entry
        orphan.unlink(missing_ok=True)
    fsync_tree(tmp_dir)
    write_json_atomic(tmp_dir / MANIFEST, manifest.to_json(), durable=True)
    _fsync(tmp_dir)
    aside = final_dir.with_name(set_aside_name(final_dir.name, os.getpid()))
    if replace and final_dir.exists():
        os.rename(final_dir, aside)
    try:
        os.rename(tmp_dir, final_dir)
        won = True
        shutil.rmtree(aside, ignore_errors=True)
    except OSError as e:
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        shutil.rmtree(tmp_dir, ignore_errors=True)  # another process published the same fingerprint first
        won = False
    return _result(str(final_dir), won, manifest, staged, units)


# -- from a local entry to an object store ---------------------------------------------------------------------
PUSH_BATCH = (64, 256 << 20)  # objects sent together (and held in memory): at most this many, or this many bytes


def _batches(files: Sequence[tuple[Path, str, int]]) -> Iterator[list[tuple[Path, str, int]]]:
    batch, held = [], 0
    for file in files:
        if batch and (len(batch) == PUSH_BATCH[0] or held + file[2] > PUSH_BATCH[1]):
            yield batch
            batch, held = [], 0
        batch.append(file)
        held += file[2]
    if batch:
        yield batch


def _file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def push(local: Entry, store: Store, progress: bool = False) -> int:
    """Copy a published local entry into an object store (a convert with a device open builds beside it): each
    chunk and device file as the object of its sha256, then a manifest naming them, last, so a reader never sees
    half of it. Objects the store holds already are not sent again (freshened when old, as the workers do).
    Returns the bytes sent."""
    entry = entry_key(local.name)
    present, fresh_after = present_objects(store), time.time() - FRESH_FOR
    files: list[tuple[Path, str, int]] = []  # (file, object key, size)
    arrays = {}
    for array, arr in local.manifest.arrays.items():
        chunks = {}
        for slot, rec in arr.chunks.items():
            chunk = local.store.local_path(local.chunk_object(array, slot))
            key = object_key(_file_sha256(chunk))
            files.append((chunk, key, rec.nbytes))
            packed = None
            if rec.tensorbin is not None:
                path = local.store.local_path(local.device_object(array, slot))
                packed = dataclasses.replace(rec.tensorbin, object=object_key(_file_sha256(path), PACKED_SUFFIX))
                files.append((path, packed.object, rec.tensorbin.nbytes))
            chunks[slot] = dataclasses.replace(rec, tensorbin=packed, object=key)
        arrays[array] = dataclasses.replace(arr, chunks=chunks)
    files += [(local.store.local_path(local.processor_object(n)), object_key(str(rec["sha256"])), int(rec["nbytes"]))
              for n, rec in local.manifest.processor.items()]
    held = still_held(store, {key: size for _, key, size in files}, present, fresh_after)
    missing = list({f[1]: f for f in files if f[1] not in held}.values())  # bytes an entry holds twice: sent once
    total, sent, t0 = sum(size for *_, size in missing), 0, time.perf_counter()
    last = t0
    for batch in _batches(missing):
        store.put_many({key: path.read_bytes() for path, key, _ in batch})
        sent += sum(size for *_, size in batch)
        if progress and time.perf_counter() - last >= 5:
            last = time.perf_counter()
            print(f"push: {sent / 1e6:,.0f} of {total / 1e6:,.0f} MB to {store.describe(OBJECTS)}, "
                  f"{last - t0:.0f} s", file=sys.stderr, flush=True)
    manifest = dataclasses.replace(local.manifest, arrays=arrays)
    check_objects_there(store, manifest, entry)
    encoded = manifest.encoded()
    store.put(manifest_key(local.name), encoded)
    return sent + len(encoded)
