"""The stage step: write a converted target into the entry's Zarr group (and, for packed device dtypes, ttnn's
`.tensorbin` of it under `tensorbin/`) and record what was written. Two places an entry is built:

- a local folder (`stage_target`): each write then appends a progress record (the chunk's xxh3 checksum) to its
  thread's log in `.staged/` (tasks/entries/manifest.py `Staged`, tasks/entries/progress.py `record_progress`); a
  resumed conversion keeps every chunk whose bytes still match its record and redoes the rest. Where the entry is
  published in the same process (the threads and sync schedulers), the writes are handed off and the converting
  thread goes on;
- an object store (`stage_into_store`): the worker that converted the target puts its objects into the store
  itself, each named by its sha256 under `objects/` (a reader accepts an entry only through its manifest, which
  the publish puts last); bytes the store already holds (another entry's, or a killed run's) are not sent again.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import Future
from pathlib import Path

from tasks.io.bulk_write import DIRECT_MIN, write_behind, write_bytes_in_place
import numpy as np

from tasks.device.host_tensors import Converted, NonFinite
from tasks.device.one_file import device_end, zarr_shape
from tasks.entries.chunks import write_chunk, write_host_chunk
from tasks.entries.manifest import ChunkRecord, FileRecord, Staged, checksum, tiled_record
from tasks.entries.names import PACKED_SUFFIX, chunk_file, object_key, packed_path
from tasks.entries.objects import Present, still_held
from tasks.entries.cache_root import store_at
from tasks.plan import HostTable
from tasks.source.shards import read_host_table
from tasks.entries.progress import in_folder, record_progress


def stage_target(entry: Path | str, converted: Converted, behind: bool = False) -> Staged:
    """Write one target (or one slot of a bank) as a chunk of its array (and its device file), then its progress
    record. `behind`: hand the writes off (tasks/io/bulk_write.py `write_behind`) and return once they are checksummed,
    for a build whose publish runs in this process (it waits for them: `writes_finished`)."""
    entry, data = Path(entry), converted.array
    if isinstance(data, HostTable):  # a host table, streamed from its file as float32 and checked as it is written
        found = NonFinite()
        nbytes, xxh3 = data.size * 4, write_host_chunk(entry, converted.name, converted.slot, data,
                                                       lambda first, block: found.add(first, block.view(np.uint32)))
        found.check(converted.name, converted.sources, converted.origin)
        staged = _staged(converted, nbytes, xxh3)
        record_progress(entry, staged)
        return staged
    if converted.tiled:  # one file: the device file is the chunk (tasks/device/one_file.py)
        return _stage_tiled(entry, converted, behind)
    packed = converted.packed
    if not behind or not _waits_for_the_disk(data.nbytes, packed):
        write_chunk(entry, converted.name, converted.slot, data)
        staged = _staged(converted, data.nbytes, checksum(data))
        _write_device_file(entry, converted, staged)
        return staged
    # the chunk and the device file written side by side (the disk streams only with several writes in flight)
    chunk_written = write_behind(entry, data.nbytes, lambda: write_chunk(entry, converted.name, converted.slot, data))
    staged = _staged(converted, data.nbytes, checksum(data))
    write_behind(entry, 0 if packed is None else len(packed),
                 lambda: _write_device_file(entry, converted, staged, after=chunk_written))
    return staged


def _stage_tiled(entry: Path, converted: Converted, behind: bool) -> Staged:
    """A tiled target's one file, written as its chunk, then its progress record (after the write, handed off or
    not: a resumed build trusts what a record names)."""
    file = converted.packed
    path = chunk_file(entry, converted.name, len(zarr_shape(converted.array.shape)), converted.slot)
    staged = Staged(converted.name, converted.slot, tiled_record(file, device_end(file), converted.max_abs_err,
                                                                 converted.pcc))

    def write() -> None:
        write_bytes_in_place(path, memoryview(file))  # into the array's folder, which create_arrays made
        record_progress(entry, staged)

    if behind and len(file) >= DIRECT_MIN:
        write_behind(entry, len(file), write)
    else:
        write()
    return staged


def _waits_for_the_disk(chunk_bytes: int, packed: bytes | None) -> bool:
    """Whether the target's writes go to the disk directly (O_DIRECT) and hold a thread until it has them: smaller
    ones land in the page cache at once, and handing them off costs more than writing them (a tiny N1.7 of every
    slot on the threads scheduler: 1.8-2.5 s with every write handed off, 1.55-1.75 s with these written here)."""
    return chunk_bytes >= DIRECT_MIN or (packed is not None and len(packed) >= DIRECT_MIN)


def _write_device_file(entry: Path, converted: Converted, staged: Staged, after: Future | None = None) -> None:
    """The device file, if the target has one, then the progress record, once the chunk (`after`) is written too:
    a resumed build trusts what a record names."""
    if converted.packed is not None:
        path = packed_path(entry, converted.name, converted.slot)
        in_folder(path, lambda: write_bytes_in_place(path, converted.packed))
    if after is not None:
        after.result()
    record_progress(entry, staged)


def _staged(converted: Converted, nbytes: int, xxh3: str) -> Staged:
    packed = converted.packed
    device_file = None if packed is None else FileRecord(len(packed), checksum(packed))
    return Staged(converted.name, converted.slot, ChunkRecord(nbytes, xxh3, converted.max_abs_err, converted.pcc,
                                                              device_file))


def stage_into_store(store_url: str, stall: float, converted: Converted, present: Present,
                     fresh_after: float) -> Staged:
    """Put one target (or one slot of a bank) into the object store at `store_url`, from whichever worker runs
    this: its chunk, and its `.tensorbin` for packed device dtypes, each under `objects/` by its sha256 (which the
    record names). `present`: key -> (size, when written) of the objects the store held when the convert began;
    one of those is not sent again, only freshened if written before `fresh_after` (so that `cache gc` cannot take
    it before the manifest that names it is published). `stall`: the client's stall limit (tasks/io/network.py)."""
    data = converted.array
    if isinstance(data, HostTable):  # whole here: an object is put in one piece
        table, data = data, np.empty(data.shape, np.float32)
        read_host_table(table, 0, data.reshape(-1))
        found = NonFinite()
        found.add(0, data.reshape(-1).view(np.uint32))
        found.check(converted.name, converted.sources, converted.origin)
    raw = memoryview(np.ascontiguousarray(converted.packed if converted.tiled else data).reshape(-1).view(np.uint8))
    chunk = object_key(hashlib.sha256(raw).hexdigest())
    objects = {chunk: raw}
    packed = None if converted.tiled else converted.packed  # a tiled chunk is its own device file
    device_file = None
    if packed is not None:
        key = object_key(hashlib.sha256(packed).hexdigest(), PACKED_SUFFIX)
        objects[key] = memoryview(packed)
        device_file = FileRecord(len(packed), checksum(packed), object=key)
    store = store_at(store_url, stall)
    held = still_held(store, {k: len(v) for k, v in objects.items()}, present, fresh_after)
    store.put_many({k: v for k, v in objects.items() if k not in held})
    if converted.tiled:
        return Staged(converted.name, converted.slot, tiled_record(converted.packed, device_end(converted.packed),
                                                                   converted.max_abs_err, converted.pcc, chunk))
    return Staged(converted.name, converted.slot, ChunkRecord(len(raw), checksum(raw), converted.max_abs_err,
                                                              converted.pcc, device_file, object=chunk))
