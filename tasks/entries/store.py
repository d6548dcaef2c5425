"""Where cache entries live: one small interface (`Store`), with a local directory (`LocalStore`, here) or an object
store (tasks/entries/object_stores.py) behind it; tasks/entries/cache_root.py `open_store` picks one for a cache root.

Keys are `/`-separated paths relative to the cache root. A store moves bytes; what they mean for an entry (how it is
built, shared and published, whether readers hold leases) is its home's, pipeline/cache/homes.py, the one place that
asks which kind of store it has. tests/test_store.py runs one contract suite on every store:
- `local_path(key)`: where a key is a file on this machine (a local directory), so it can be read block by block,
  mapped, or handed to ttnn by name; None for an object store, read through `get`;
- `written` and `freshen`: when each object was last written, and writing that time again without the bytes:
  `cache gc` removes an object no manifest names only once it is older than a grace period, and a convert
  freshens an old object it is about to name (as git freshens an object it would have written);
- `LocalStore.copy_many`: a folder's entries share bytes by hard links.
Everything else — listing, reading a chunk into a caller's buffer, verifying — is the same code for every store.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import tempfile
import threading
import uuid
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Mapping

import numpy as np

from tasks.io.bulk_write import nbytes, write_bytes_atomic
from tasks.errors import CacheError
from tasks.old_paths import names_moved
from tasks.io.file_blocks import is_url, read_into  # is_url: callers ask the store

_DOWNLOADS_MADE = threading.Lock()
IN_FLIGHT = 16  # requests to an object store at once: freshenings, and a load's fetches (`--transfers`)


class Store(ABC):
    def local_path(self, key: str) -> Path | None:
        """Where the object `key` is, or would be, a file on this machine; None where objects are not local files."""
        return None

    @abstractmethod
    def get(self, key: str) -> bytes | None:
        """The object's bytes, or None when it does not exist."""

    @abstractmethod
    def put(self, key: str, data: bytes | memoryview) -> None:
        """Write a whole object; readers see the old object or the new one, never a mix."""

    @abstractmethod
    def sizes(self, prefix: str) -> dict[str, int]:
        """Every key under `prefix` (recursively), sorted, with its size in bytes (one listing, no reads)."""

    def list(self, prefix: str) -> list[str]:
        return list(self.sizes(prefix))

    @abstractmethod
    def written(self, prefix: str) -> dict[str, float]:
        """Every key under `prefix` (recursively), sorted, with when it was last written (unix seconds)."""

    def sizes_and_times(self, prefix: str) -> dict[str, tuple[int, float | None]]:
        """Every key under `prefix` with its size and when it was last written (None: the backend did not say), in
        one listing where the backend's listing holds both (a bucket's: a listing is a request per 1,000 keys)."""
        written = self.written(prefix)
        return {key: (size, written.get(key)) for key, size in self.sizes(prefix).items()}

    def last_written(self, prefix: str) -> float | None:
        """When the newest object under `prefix` was written; None when there is none. How `cache gc` tells an
        abandoned push from one in flight."""
        return max(self.written(prefix).values(), default=None)

    @abstractmethod
    def freshen(self, keys: list[str]) -> set[str]:
        """Mark each object as written now, its bytes untouched; returns the keys freshened (one that is gone is
        left out: the caller writes it again)."""

    def usage(self, prefix: str) -> tuple[int, int, dict]:
        """Bytes under `prefix`; how many of them are its own (removing `prefix` frees exactly those: a local
        cache shares bytes between entries by hard links, an object store shares none); and each stored file's
        identity -> size, for totals that count shared bytes once."""
        sizes = self.sizes(prefix)
        return sum(sizes.values()), sum(sizes.values()), dict(sizes)

    @abstractmethod
    def children(self, prefix: str) -> list[str]:
        """The names directly under `prefix` (objects or folders), sorted."""

    @abstractmethod
    def delete(self, prefix: str) -> None:
        """Remove every key under `prefix` (and the key itself)."""

    def delete_many(self, keys: list[str]) -> None:
        """Remove these objects (one that is gone already is no error)."""
        for key in keys:
            self.delete(key)

    @abstractmethod
    def describe(self, key: str) -> str:
        """The key as the user knows it (a path or a URL), for messages."""

    def put_many(self, objects: Mapping[str, bytes]) -> None:
        """Write several objects, each one whole as `put` writes it; a store may send them concurrently."""
        for key, data in objects.items():
            self.put(key, data)

    def read_into(self, key: str, out: np.ndarray) -> None:
        """Fill `out` with the object, which must hold exactly `out.nbytes` bytes."""
        data = self.get(key)
        _check_size(self, key, None if data is None else len(data), out.nbytes)
        out.reshape(-1).view(np.uint8)[:] = np.frombuffer(data, np.uint8)

    def map(self, key: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        """The object as a writable array of `shape` (locally a private memory map of the file, no copy)."""
        out = np.empty(shape, dtype)
        self.read_into(key, out)
        return out

    def local_file(self, key: str) -> Path | None:
        """A local file holding the object (ttnn loads from a path), or None when it does not exist."""
        data = self.get(key)
        return None if data is None else temporary_file(self, key, data)

    def forget(self, key: str) -> bool:
        """Drop a copy of the object kept on this machine (one a read found not to be the object's bytes), so that
        the next read fetches it; False when the store keeps none (tasks/entries/fetched.py keeps some)."""
        return False

    def get_json(self, key: str) -> dict | None:
        raw = self.get(key)
        if raw is None:
            return None
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise CacheError(f"{self.describe(key)}: not valid JSON ({e}); the object is corrupt") from e

    def put_json(self, key: str, doc: object) -> None:
        self.put(key, (json.dumps(doc, indent=1) + "\n").encode())


def temporary_file(store: Store, key: str, data: bytes) -> Path:
    """`data` as a file of the store's temporary folder, removed with the store (ttnn loads from a path)."""
    with _DOWNLOADS_MADE:  # once per store: a second folder would replace (and delete) the first
        if not hasattr(store, "_downloads"):
            store._downloads = tempfile.TemporaryDirectory(prefix="gr00t-store-")
    path = Path(store._downloads.name) / key.replace("/", "%")
    fetched = path.with_name(f"{path.name}.{uuid.uuid4().hex}")
    fetched.write_bytes(data)  # buffered, not O_DIRECT: ttnn reads it next, from the page cache
    os.replace(fetched, path)  # a new file each time: a tensor mapping an earlier fetch keeps its bytes
    return path


def _check_size(store: Store, key: str, found: int | None, expected: int) -> None:
    """A missing or short object is an error, never zeros."""
    if found is None:
        raise CacheError(f"{store.describe(key)}: chunk is missing from the cache entry; run `python -m pipeline "
                         "cache verify` and convert again with --force")
    if found != expected:
        raise CacheError(f"{store.describe(key)}: chunk holds {found} bytes, expected {expected}; the entry is "
                         "corrupt — convert again with --force")


class LocalStore(Store):
    """A cache folder. Reads go through one system call into the caller's buffer, or a private memory map."""

    def __init__(self, root: Path | str):
        self.root = Path(root)

    def local_path(self, key: str) -> Path:
        return self.path(key)

    def path(self, key: str) -> Path:
        return self.root / key

    def get(self, key: str) -> bytes | None:
        try:
            return self.path(key).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def put(self, key: str, data: bytes | memoryview) -> None:
        write_bytes_atomic(self.path(key), data)

    def copy_many(self, pairs: Mapping[str, str]) -> set[str]:
        """Each `new key -> existing key` of `pairs` as a hard link (a copy across filesystems); returns the new
        keys made. One whose source is gone (removed meanwhile) is left out, not an error: the caller makes that
        file itself."""
        made = set()
        for new, old in pairs.items():
            try:
                link_or_copy(self.path(old), self.path(new))
            except FileNotFoundError:
                continue
            made.add(new)
        return made

    def sizes(self, prefix: str) -> dict[str, int]:
        base = self.path(prefix)
        files = sorted(p for p in base.rglob("*") if p.is_file()) if base.is_dir() else []
        return {p.relative_to(self.root).as_posix(): p.stat().st_size for p in files}

    def written(self, prefix: str) -> dict[str, float]:
        base = self.path(prefix)
        files = sorted(p for p in base.rglob("*") if p.is_file()) if base.is_dir() else [base] if base.is_file() else []
        return {p.relative_to(self.root).as_posix(): p.stat().st_mtime for p in files}

    def freshen(self, keys: list[str]) -> set[str]:
        done = set()
        for key in keys:
            try:
                os.utime(self.path(key))
            except FileNotFoundError:
                continue
            done.add(key)
        return done

    def usage(self, prefix: str) -> tuple[int, int, dict]:
        size, links, stats = 0, {}, {}
        for p in self.path(prefix).rglob("*"):
            if p.is_file():
                st = p.stat()
                size += st.st_size
                ident = (st.st_dev, st.st_ino)
                links[ident] = links.get(ident, 0) + 1
                stats[ident] = st
        # own: every name of the file is under `prefix`, so removing it frees the bytes (whatever order a
        # listing visits entries in)
        own = sum(st.st_size for ident, st in stats.items() if links[ident] >= st.st_nlink)
        return size, own, {ident: st.st_size for ident, st in stats.items()}

    def children(self, prefix: str) -> list[str]:
        base = self.path(prefix)
        return sorted(p.name for p in base.iterdir()) if base.is_dir() else []

    def delete(self, prefix: str) -> None:
        path = self.path(prefix)
        try:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
        except FileNotFoundError:
            pass  # gone already (another process removed it)
        except OSError as e:  # never report a removal that did not happen
            raise CacheError(f"{path}: could not be removed ({e.strerror}); check the cache folder's permissions") from None

    def describe(self, key: str) -> str:
        return str(self.path(key)) if key else str(self.root)

    def _open(self, key: str, nbytes: int) -> int:
        try:
            fd = os.open(self.path(key), os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            _check_size(self, key, None, nbytes)
        size = os.fstat(fd).st_size
        if size != nbytes:
            os.close(fd)
            _check_size(self, key, size, nbytes)
        return fd

    def read_into(self, key: str, out: np.ndarray) -> None:
        fd = self._open(key, out.nbytes)
        try:
            read_into(fd, 0, out, self.path(key))
        finally:
            os.close(fd)

    def map(self, key: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        # The page cache's pages, not a copy into fresh memory (which costs more than the read on a VM that hands
        # out pages lazily); copy-on-write, so a caller's writes stay private. Mapped from the descriptor the size
        # was checked on: np.memmap opens the file again and resolves its path (an lstat per folder), which was
        # most of a tiny entry's load (1,030 chunks: 0.62-0.82 s, now 0.28-0.33 s).
        size = nbytes(shape, dtype)
        fd = self._open(key, size)
        try:
            if size == 0:
                return np.empty(shape, dtype)
            return np.frombuffer(mmap.mmap(fd, size, access=mmap.ACCESS_COPY), dtype).reshape(shape)
        finally:
            os.close(fd)

    def local_file(self, key: str) -> Path | None:
        return self.path(key) if self.path(key).is_file() else None


def link_or_copy(src: Path, dst: Path) -> None:
    """`dst` as the same file as `src` (a hard link: entries share the bytes), or a copy across filesystems. An
    existing `dst` is replaced, never written through."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.unlink(missing_ok=True)
    try:
        os.link(src, dst)
    except FileNotFoundError:
        raise
    except OSError:
        shutil.copyfile(src, dst)  # another filesystem: a copy is still cheaper than a conversion


# Names that left this module (deprecated, CHANGELOG.md): the object stores, and the opening of a cache root
__getattr__ = names_moved("tasks.entries.store", {
    **dict.fromkeys(("S3Store", "FsspecStore", "object_store_failure", "WRITES"), "tasks.entries.object_stores"),
    **dict.fromkeys(("open_store", "store_at"), "tasks.entries.cache_root")})
