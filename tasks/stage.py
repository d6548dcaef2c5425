"""The stage step: write a converted target into the entry's Zarr group (and, for packed device dtypes, ttnn's
`.tensorbin` of it under `tensorbin/`) and record what was written.

Each write then appends a progress record (the chunk's xxh3 checksum) to its thread's log in `.staged/`
(tasks/entries/manifest.py `Staged`, tasks/entries/progress.py `record_progress`). A resumed conversion keeps every chunk whose bytes still match its
record and redoes the rest.
"""

from __future__ import annotations

from pathlib import Path

from tasks.bulk_write import write_bytes_in_place
import numpy as np

from tasks.convert import Converted, NonFinite
from tasks.entries.chunks import write_chunk, write_host_chunk
from tasks.entries.manifest import ChunkRecord, FileRecord, Staged, checksum
from tasks.entries.names import packed_path
from tasks.source import HostTable
from tasks.entries.progress import in_folder, record_progress


def stage_target(entry: Path | str, converted: Converted) -> Staged:
    """Write one target (or one slot of a bank) as a chunk of its array, then its progress record."""
    entry, data = Path(entry), converted.array
    if isinstance(data, HostTable):  # a host table, streamed from its file as float32 and checked as it is written
        found = NonFinite()
        nbytes, xxh3 = data.size * 4, write_host_chunk(entry, converted.name, converted.slot, data,
                                                       lambda first, block: found.add(first, block.view(np.uint32)))
        found.check(converted.name, converted.sources, converted.origin)
    else:
        write_chunk(entry, converted.name, converted.slot, data)
        nbytes, xxh3 = data.nbytes, checksum(data)
    packed = converted.packed
    if packed is not None:
        path = packed_path(entry, converted.name, converted.slot)
        in_folder(path, lambda: write_bytes_in_place(path, packed))
    device_file = None if packed is None else FileRecord(len(packed), checksum(packed))
    staged = Staged(converted.name, converted.slot, ChunkRecord(nbytes, xxh3, converted.max_abs_err,
                                                                converted.pcc, device_file))
    record_progress(entry, staged)
    return staged
