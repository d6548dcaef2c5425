"""What loads from an object store keep on this machine: each chunk and device file they fetched, in a local
folder (`<local cache>/fetched/`), named by its content as the manifest records it (its object's sha256 name, or
for an entry of format 5 its xxh3 and size). Entries of
one release and its fine-tunes share most of their bytes, so the next load of any of them fetches only what this
machine lacks. A kept file is checked against the record like a fetched one; one that does not match is fetched
again and replaced. Keeping is a courtesy: a folder that cannot be written (a full disk) costs a fetch next time,
never a load; what could not be kept, and why, is counted (`not_kept`) and said in the load's summary.
`cache gc --older-than-days N` on the local cache removes kept files no load used for N days.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tasks.io.bulk_write import write_bytes_atomic
from tasks.entries.manifest import FileRecord
from tasks.errors import CheckpointError
from tasks.io.file_blocks import read_into


def _used(path: Path) -> None:
    """Touch a kept file a load used: `cache gc --older-than-days` removes only those unused that long."""
    try:
        os.utime(path)
    except OSError:
        pass


@dataclass(frozen=True)
class Fetched:
    folder: Path
    # bytes that could not be kept, and the first reason (an OSError's words): a load says so
    not_kept: dict = field(default_factory=lambda: {"bytes": 0, "why": None}, compare=False)
    _counting: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    def path(self, record: FileRecord, suffix: str = "") -> Path:
        """`suffix`: a device file's (PACKED_SUFFIX), which ttnn wants in the name it loads. Bytes the record
        names by sha256 (its object's name) are kept under that name: an xxh3 can be forged, to pass one
        entry's bytes off as another's."""
        if record.object:
            return self.folder / record.object.rsplit("/", 1)[-1]
        return self.folder / f"{record.xxh3}-{record.nbytes}{suffix}"

    def read_into(self, record: FileRecord, out: np.ndarray) -> bool:
        """Fill `out` from the kept copy of `record`'s bytes; False when there is none (or not of its size). The
        caller checks the bytes against the record, as it checks a fetched object's."""
        path = self.path(record)
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return False
        try:
            if os.fstat(fd).st_size != record.nbytes or out.nbytes != record.nbytes:
                return False
            read_into(fd, 0, out.reshape(-1).view(np.uint8), path)
        except (OSError, CheckpointError):  # unreadable, or cut short meanwhile: fetched instead
            return False
        finally:
            os.close(fd)
        _used(path)
        return True

    def file(self, record: FileRecord, suffix: str = "") -> Path | None:
        """The kept copy of `record`'s bytes as a checked local file (ttnn loads from a path), or None."""
        path = self.path(record, suffix)
        try:
            if not record.matches_file(path):
                return None
        except OSError:
            return None
        _used(path)
        return path

    def keep(self, record: FileRecord, data: np.ndarray | bytes | memoryview, suffix: str = "") -> Path | None:
        """Keep bytes just fetched and checked against `record`; the file, or None if it could not be written."""
        path = self.path(record, suffix)
        try:
            write_bytes_atomic(path, memoryview(np.ascontiguousarray(data)).cast("B") if isinstance(data, np.ndarray)
                               else data)
        except OSError as e:
            with self._counting:
                self.not_kept["bytes"] += record.nbytes
                self.not_kept["why"] = self.not_kept["why"] or f"{e.strerror or e}: {self.folder}"
            return None
        return path
