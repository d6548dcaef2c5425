"""An object store read through what this machine fetched from it before (`KeepingStore`): each chunk and device
file a load fetched is kept in a local folder (`<local cache>/fetched/`), under its object's name (`objects/<sha256>`
is kept as `<sha256>`: the same bytes whichever entry names them). Entries of one release and its fine-tunes share
most of their bytes, so the next load of any of them fetches only what this machine lacks.

The entry reading through it checks every byte against its manifest, kept or fetched; a kept copy that fails the
check is forgotten (`forget`) and fetched again. Keeping is a courtesy: a folder that cannot be written (a full
disk) costs a fetch next time, never a load; what could not be kept, and why, is counted (`not_kept`) and said in
the load's summary. `cache gc --older-than-days N` on the local cache removes kept files no load used for N days.
Everything but reading a chunk or a device file goes to the store itself.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Mapping

import numpy as np

from tasks.entries.names import OBJECTS
from tasks.entries.store import Store, temporary_file
from tasks.errors import CheckpointError
from tasks.io.bulk_write import write_bytes_atomic
from tasks.io.file_blocks import read_into


def _used(path: Path) -> None:
    """Touch a kept file a load used: `cache gc --older-than-days` removes only those unused that long."""
    try:
        os.utime(path)
    except OSError:
        pass


class KeepingStore(Store):
    def __init__(self, store: Store, folder: Path):
        self.store, self.folder = store, Path(folder)
        # bytes that could not be kept, and the first reason (an OSError's words): a load says so
        self.not_kept: dict = {"bytes": 0, "why": None}
        self._counting = threading.Lock()

    def kept_path(self, key: str) -> Path:
        """Where the object `key` is kept: an object by its own name; any other key (an entry of format 5 named
        its chunks by their place in the entry) by the whole key."""
        name = key[len(OBJECTS) + 1:] if key.startswith(f"{OBJECTS}/") else key.replace("/", "%")
        return self.folder / name

    def kept_bytes(self, sizes: Mapping[str, int]) -> int:
        """Of these objects (key -> size), the bytes kept here already, each of its size: what a load need not fetch."""
        total = 0
        for key, size in sizes.items():
            try:
                total += size if self.kept_path(key).stat().st_size == size else 0
            except OSError:
                pass
        return total

    # -- reads: the kept copy first, else the store's, kept for next time -------------------------------------
    def read_into(self, key: str, out: np.ndarray) -> None:
        if self._read_kept(key, out):
            return
        self.store.read_into(key, out)
        self._keep(key, out.nbytes, lambda path: write_bytes_atomic(path, memoryview(out.reshape(-1).view(np.uint8))))

    def local_file(self, key: str) -> Path | None:
        path = self.kept_path(key)
        if path.is_file():
            _used(path)
            return path
        data = self.store.get(key)
        if data is None:
            return None
        # buffered, not O_DIRECT: ttnn reads it next, from the page cache
        if self._keep(key, len(data), lambda kept: write_bytes_atomic(kept, data)):
            return path
        return temporary_file(self, key, data)

    def forget(self, key: str) -> bool:
        path = self.kept_path(key)
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        except OSError:
            pass  # cannot be removed: it is overwritten by the next fetch
        return True

    def _read_kept(self, key: str, out: np.ndarray) -> bool:
        """Fill `out` from the kept copy; False when there is none of its size (or it cannot be read)."""
        path = self.kept_path(key)
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return False
        try:
            if os.fstat(fd).st_size != out.nbytes or not out.flags.c_contiguous:
                return False
            read_into(fd, 0, out.reshape(-1).view(np.uint8), path)
        except (OSError, CheckpointError):  # unreadable, or cut short meanwhile: fetched instead
            return False
        finally:
            os.close(fd)
        _used(path)
        return True

    def _keep(self, key: str, nbytes: int, write) -> bool:
        try:
            write(self.kept_path(key))
        except OSError as e:
            with self._counting:
                self.not_kept["bytes"] += nbytes
                self.not_kept["why"] = self.not_kept["why"] or f"{e.strerror or e}: {self.folder}"
            return False
        return True

    # -- everything else is the store's ------------------------------------------------------------------------
    def get(self, key: str) -> bytes | None:
        return self.store.get(key)

    def put(self, key: str, data: bytes | memoryview) -> None:
        self.store.put(key, data)

    def sizes(self, prefix: str) -> dict[str, int]:
        return self.store.sizes(prefix)

    def written(self, prefix: str) -> dict[str, float]:
        return self.store.written(prefix)

    def freshen(self, keys: list[str]) -> set[str]:
        return self.store.freshen(keys)

    def children(self, prefix: str) -> list[str]:
        return self.store.children(prefix)

    def delete(self, prefix: str) -> None:
        self.store.delete(prefix)

    def describe(self, key: str) -> str:
        return self.store.describe(key)
