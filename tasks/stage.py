"""The stage step: write a converted target into the entry's Zarr group and record what was written.

Each write leaves a small progress record (`.staged/<name>[@slot].json` with the chunk's xxh3 checksum). A resumed
conversion keeps every chunk whose bytes still match its record and redoes the rest.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import xxhash

from tasks.convert import Converted
from tasks.zarr_v3 import chunk_path, write_chunk, write_json_atomic

PROGRESS_DIR = ".staged"


@dataclass(frozen=True)
class Staged:
    name: str
    slot: int | None
    nbytes: int
    xxh3: str
    max_abs_err: float
    pcc: float


def checksum(data: np.ndarray | bytes | memoryview) -> str:
    """xxh3-64 of raw bytes (about 10 GB/s: cheap enough to verify every chunk on every load)."""
    if isinstance(data, np.ndarray):
        data = memoryview(np.ascontiguousarray(data).reshape(-1).view(np.uint8))
    return xxhash.xxh3_64_hexdigest(data)


def progress_path(entry: Path, name: str, slot: int | None) -> Path:
    return entry / PROGRESS_DIR / (name + ("" if slot is None else f"@{slot}") + ".json")


def chunk_coords(ndim: int, slot: int | None) -> tuple[int, ...]:
    """Whole-array targets are one chunk; an embodiment bank has one chunk per slot."""
    return (0,) * ndim if slot is None else (slot,) + (0,) * ndim


def stage_target(entry: Path | str, converted: Converted) -> Staged:
    """Write one target (or one slot of a bank) as a chunk of its array, then its progress record."""
    entry, data = Path(entry), converted.array
    write_chunk(entry / converted.name, chunk_coords(data.ndim, converted.slot), data)
    record = Staged(converted.name, converted.slot, data.nbytes, checksum(data), converted.max_abs_err, converted.pcc)
    write_json_atomic(progress_path(entry, converted.name, converted.slot), asdict(record))
    return record


def already_staged(entry: Path, name: str, slot: int | None, ndim: int) -> Staged | None:
    """The record of a chunk a killed run wrote, if the chunk's bytes still match it; else None."""
    record_path = progress_path(entry, name, slot)
    try:
        record = Staged(**json.loads(record_path.read_text()))
        data = chunk_path(entry / name, chunk_coords(ndim, slot)).read_bytes()
    except (OSError, ValueError, TypeError):
        return None
    return record if len(data) == record.nbytes and checksum(data) == record.xxh3 else None
