"""The stage step: write a converted target into the entry's Zarr group (and, for packed device dtypes, ttnn's
`.tensorbin` of it under `tensorbin/`) and record what was written.

Each write then appends a progress record (the chunk's xxh3 checksum) to its thread's log in `.staged/`. A resumed
conversion keeps every chunk whose bytes still match its record and redoes the rest.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, TypeVar

from tasks.bulk_write import write_bytes_in_place
from tasks.convert import Converted
from tasks.entry import PROGRESS_DIR, FileRecord, checksum, chunk_coords, packed_path, progress_log
from tasks.zarr_v3 import chunk_path, write_chunk

T = TypeVar("T")


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


@dataclass(frozen=True)
class Uploaded:
    """A staged target that is also on the device (the upload stage's record)."""
    staged: Staged
    tensor: object             # the ttnn device tensor


def stage_target(entry: Path | str, converted: Converted) -> Staged:
    """Write one target (or one slot of a bank) as a chunk of its array, then its progress record."""
    entry, data = Path(entry), converted.array
    write_chunk(entry / converted.name, chunk_coords(data.ndim, converted.slot), data)
    packed = converted.packed
    if packed is not None:
        path = packed_path(entry, converted.name, converted.slot)
        _in_folder(path, lambda: write_bytes_in_place(path, packed))
    record = Staged(converted.name, converted.slot, data.nbytes, checksum(data), converted.max_abs_err, converted.pcc,
                    None if packed is None else len(packed), None if packed is None else checksum(packed))
    record_progress(entry, record)
    return record


def _in_folder(path: Path, act: Callable[[], T]) -> T:
    """`act()`, which creates `path`; the first file of its folder (device files, progress logs) makes the folder.
    Trying first spares a mkdir per file."""
    try:
        return act()
    except FileNotFoundError:
        path.parent.mkdir(exist_ok=True)
        return act()


def record_progress(entry: Path, record: Staged) -> None:
    """Append the record to this thread's progress log, after its chunk is in place. A line torn by a kill is
    skipped on resume, and its chunk converted again."""
    log = progress_log(entry, f"{os.getpid()}-{threading.get_ident()}")
    fd = _in_folder(log, lambda: os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
    try:
        os.write(fd, (json.dumps(asdict(record)) + "\n").encode())
    finally:
        os.close(fd)


def staged_records(entry: Path) -> dict[tuple[str, int | None], Staged]:
    """Every progress record a killed run left in `entry` (later lines win)."""
    records = {}
    for log in sorted((entry / PROGRESS_DIR).glob("*.jsonl")):
        for line in log.read_text(errors="replace").splitlines():
            try:
                record = Staged(**json.loads(line))
            except (ValueError, TypeError):
                continue  # torn by the kill
            records[(record.name, record.slot)] = record
    return records


def already_staged(entry: Path, record: Staged, ndim: int) -> bool:
    """Whether the chunk (and device file) a killed run recorded still hold the bytes the record describes."""
    try:
        data = chunk_path(entry / record.name, chunk_coords(ndim, record.slot)).read_bytes()
        packed = packed_path(entry, record.name, record.slot).read_bytes() if record.packed_xxh3 else None
    except OSError:
        return False
    if not FileRecord(record.nbytes, record.xxh3).matches(data):
        return False
    return packed is None or FileRecord(record.packed_nbytes, record.packed_xxh3).matches(packed)
