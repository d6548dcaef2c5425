"""Writing an entry being built: its arrays' folders and documents, and each chunk, through the Zarr v3 encoding
(tasks/entries/zarr_v3.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import xxhash

from tasks.io.bulk_write import write_made_in_place
from tasks.entries.names import chunk_coords
from tasks.source.shards import read_host_table
from tasks.entries.zarr_v3 import chunk_path, create_array, write_chunk as _write_chunk


def create_arrays(tmp: Path, arrays: Mapping[str, dict], like: Sequence[Path] = ()) -> None:
    """Every target's array folder and document (idempotent, so a resumed run can repeat it): the stage tasks
    then write their chunks into folders that exist. A document some entry of `like` (published entries' folders)
    holds with the same bytes is linked from it, not written again."""
    for name, meta in arrays.items():
        create_array(tmp / name, meta, [entry / name for entry in like])


def write_chunk(entry: Path, name: str, slot: int | None, data: np.ndarray) -> None:
    """One chunk of target `name` (a bank: the chunk of `slot`), into an entry being built."""
    _write_chunk(entry / name, chunk_coords(data.ndim, slot), data)


def write_host_chunk(entry: Path, name: str, slot: int | None, table, seen=None) -> str:
    """A host table's chunk (tasks/plan.py HostTable), stored as the float32 the port keeps it in, read from its
    shard block by block as it is written: the table is never held whole, and read once (`seen(first, block)` is
    shown every block, for the finite check). Returns the stored bytes' xxh3."""
    digest = xxhash.xxh3_64()

    def make(block: memoryview, pos: int) -> None:
        values = np.frombuffer(block, np.float32)
        read_host_table(table, pos // 4, values)
        if seen is not None:
            seen(pos // 4, values)
        digest.update(block)

    write_made_in_place(chunk_path(entry / name, chunk_coords(table.ndim, slot)), table.size * 4, make)
    return digest.hexdigest()
