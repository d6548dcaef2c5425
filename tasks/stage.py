"""The stage step: write a converted target into the entry's Zarr group (and, for packed device dtypes, ttnn's
`.tensorbin` of it under `tensorbin/`) and record what was written. Two places an entry is built:

- a local folder (`stage_target`): each write then appends a progress record (the chunk's xxh3 checksum) to its
  thread's log in `.staged/` (tasks/entries/manifest.py `Staged`, tasks/entries/progress.py `record_progress`); a
  resumed conversion keeps every chunk whose bytes still match its record and redoes the rest;
- an object store (`stage_into_store`): the worker that converted the target puts its objects into the store
  itself, under the entry's final keys (a reader accepts an entry only through its manifest, which the publish
  puts last); an object a killed run already put is not sent again.
"""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path, PurePosixPath
from typing import Mapping

from tasks.bulk_write import write_bytes_in_place
import numpy as np

from tasks.convert import Converted, NonFinite
from tasks.entries.chunks import write_chunk, write_host_chunk
from tasks.entries.manifest import ChunkRecord, FileRecord, Staged, checksum
from tasks.entries.names import chunk_file, entry_key, packed_path
from tasks.entries.store import store_at
from tasks.source import HostTable
from tasks.entries.progress import in_folder, record_progress


WRITES_BESIDE = 4  # at least the graph's threads, so no stage task waits for another's write to start


@functools.cache
def _writer() -> ThreadPoolExecutor:
    """Where a chunk is written while its device file is written and both are checksummed: two O_DIRECT writes in
    flight per stage task instead of one after the other (the disk streams only with several in flight)."""
    return ThreadPoolExecutor(WRITES_BESIDE, thread_name_prefix="chunk-write")


def stage_target(entry: Path | str, converted: Converted) -> Staged:
    """Write one target (or one slot of a bank) as a chunk of its array, then its progress record."""
    entry, data = Path(entry), converted.array
    if isinstance(data, HostTable):  # a host table, streamed from its file as float32 and checked as it is written
        found = NonFinite()
        nbytes, xxh3 = data.size * 4, write_host_chunk(entry, converted.name, converted.slot, data,
                                                       lambda first, block: found.add(first, block.view(np.uint32)))
        found.check(converted.name, converted.sources, converted.origin)
        chunk_written = None
    else:
        chunk_written = _writer().submit(write_chunk, entry, converted.name, converted.slot, data)
        nbytes, xxh3 = data.nbytes, checksum(data)
    packed = converted.packed
    try:
        if packed is not None:
            path = packed_path(entry, converted.name, converted.slot)
            in_folder(path, lambda: write_bytes_in_place(path, packed))
        device_file = None if packed is None else FileRecord(len(packed), checksum(packed))
    finally:
        if chunk_written is not None:
            wait([chunk_written])  # never left writing behind an error: the caller may remove the entry next
    if chunk_written is not None:
        chunk_written.result()  # its error, if it had one; written before the record says so
    staged = Staged(converted.name, converted.slot, ChunkRecord(nbytes, xxh3, converted.max_abs_err,
                                                                converted.pcc, device_file))
    record_progress(entry, staged)
    return staged


def stage_into_store(store_url: str, name: str, converted: Converted, present: Mapping[str, int]) -> Staged:
    """Put one target (or one slot of a bank) into entry `name` of the object store at `store_url`, from whichever
    worker runs this: its chunk, and its `.tensorbin` for packed device dtypes. `present`: key -> size of what the
    store already holds under the entry (a killed run's objects, the same bytes since the entry is named by its
    content): those are not sent again."""
    entry, data = PurePosixPath(entry_key(name)), converted.array
    if isinstance(data, HostTable):  # whole here: an object is put in one piece
        table, data = data, np.empty(data.shape, np.float32)
        table.read_float32(0, data.reshape(-1))
        found = NonFinite()
        found.add(0, data.reshape(-1).view(np.uint32))
        found.check(converted.name, converted.sources, converted.origin)
    raw = memoryview(np.ascontiguousarray(data).reshape(-1).view(np.uint8))
    objects = {str(chunk_file(entry, converted.name, data.ndim, converted.slot)): raw}
    packed = converted.packed
    if packed is not None:
        objects[str(packed_path(entry, converted.name, converted.slot))] = memoryview(packed)
    store_at(store_url).put_many({k: v for k, v in objects.items() if present.get(k) != len(v)})
    device_file = None if packed is None else FileRecord(len(packed), checksum(packed))
    return Staged(converted.name, converted.slot, ChunkRecord(len(raw), checksum(raw), converted.max_abs_err,
                                                              converted.pcc, device_file))
