"""The stage step: write a converted target into the entry's Zarr group (and, for packed device dtypes, ttnn's
`.tensorbin` of it under `tensorbin/`) and record what was written.

Each write leaves a small progress record (`.staged/<name>[@slot].json` with the chunk's xxh3 checksum). A resumed
conversion keeps every chunk whose bytes still match its record and redoes the rest.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from tasks.bulk_write import write_bytes_atomic
from tasks.convert import Converted
from tasks.entry import PROGRESS_DIR, checksum, chunk_coords, packed_path, progress_path
from tasks.zarr_v3 import chunk_path, write_chunk



@dataclass(frozen=True)
class Staged:
    name: str
    slot: int | None
    nbytes: int
    xxh3: str
    max_abs_err: float
    pcc: float
    packed_nbytes: int | None = None
    packed_xxh3: str | None = None


def stage_target(entry: Path | str, converted: Converted) -> Staged:
    """Write one target (or one slot of a bank) as a chunk of its array, then its progress record."""
    entry, data = Path(entry), converted.array
    write_chunk(entry / converted.name, chunk_coords(data.ndim, converted.slot), data)
    packed = converted.packed
    if packed is not None:
        write_bytes_atomic(packed_path(entry, converted.name, converted.slot), packed)
    record = Staged(converted.name, converted.slot, data.nbytes, checksum(data), converted.max_abs_err, converted.pcc,
                    None if packed is None else len(packed), None if packed is None else checksum(packed))
    write_bytes_atomic(progress_path(entry, converted.name, converted.slot), json.dumps(asdict(record)).encode())
    return record


def already_staged(entry: Path, name: str, slot: int | None, ndim: int) -> Staged | None:
    """The record of a chunk a killed run wrote, if the chunk's bytes still match it; else None."""
    record_path = progress_path(entry, name, slot)
    try:
        record = Staged(**json.loads(record_path.read_text()))
        data = chunk_path(entry / name, chunk_coords(ndim, slot)).read_bytes()
        packed = packed_path(entry, name, slot).read_bytes() if record.packed_xxh3 else None
    except (OSError, ValueError, TypeError):
        return None
    if len(data) != record.nbytes or checksum(data) != record.xxh3:
        return None
    return record if packed is None or checksum(packed) == record.packed_xxh3 else None
