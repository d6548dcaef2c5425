"""The stage step: write a converted target into the entry's Zarr group (and, for packed device dtypes, ttnn's
`.tensorbin` of it under `tensorbin/`) and record what was written.

Each write then appends a progress record (the chunk's xxh3 checksum) to its thread's log in `.staged/`
(tasks/entry.py: `Staged`, `record_progress`). A resumed conversion keeps every chunk whose bytes still match its
record and redoes the rest.
"""

from __future__ import annotations

from pathlib import Path

from tasks.bulk_write import write_bytes_in_place
from tasks.convert import Converted
from tasks.entry import ChunkRecord, FileRecord, Staged, checksum, packed_path, write_chunk, write_widened_chunk
from tasks.plan import HOST
from tasks.progress import in_folder, record_progress


def stage_target(entry: Path | str, converted: Converted) -> Staged:
    """Write one target (or one slot of a bank) as a chunk of its array, then its progress record."""
    entry, data = Path(entry), converted.array
    if converted.layout == HOST and data.dtype.itemsize == 2:  # a bf16 host table, stored float32: widened as written
        nbytes, xxh3 = data.nbytes * 2, write_widened_chunk(entry, converted.name, converted.slot, data)
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
