"""Where cache entries live: one small interface, with a local directory or an object store behind it.

A local cache builds entries in place and publishes them by rename (cache/README.md). Object stores have no
rename, so a cache at an `s3://…` (or any fsspec) URL is written by pushing an entry that was built and verified
locally: every object first, `MANIFEST.json` last, the ref after it. A reader accepts an entry only through its
manifest, so a half-pushed entry is invisible, and two teams pushing the same fingerprint write the same bytes.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from abc import ABC, abstractmethod
from pathlib import Path, PurePosixPath

from tasks.errors import CacheError
from tasks.entry import MANIFEST, chunk_file, entry_key, manifest_key, matches, packed_path, slot_of
from tasks.zarr_v3 import write_bytes_atomic


class Store(ABC):
    """Keys are `/`-separated paths relative to the cache root."""

    supports_rename: bool = False

    @abstractmethod
    def get(self, key: str) -> bytes | None:
        """The object's bytes, or None when it does not exist."""

    @abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Write a whole object; readers see the old object or the new one, never a mix."""

    @abstractmethod
    def list(self, prefix: str) -> list[str]:
        """Every key under `prefix` (recursively)."""

    @abstractmethod
    def delete(self, prefix: str) -> None:
        """Remove every key under `prefix`."""

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

    def describe(self, key: str) -> str:
        return key


class LocalStore(Store):
    supports_rename = True

    def __init__(self, root: Path):
        self.root = Path(root)

    def get(self, key: str) -> bytes | None:
        try:
            return (self.root / key).read_bytes()
        except FileNotFoundError:
            return None

    def put(self, key: str, data: bytes) -> None:
        write_bytes_atomic(self.root / key, data)

    def list(self, prefix: str) -> list[str]:
        base = self.root / prefix
        return sorted(str(p.relative_to(self.root)) for p in base.rglob("*") if p.is_file()) if base.exists() else []

    def delete(self, prefix: str) -> None:
        shutil.rmtree(self.root / prefix, ignore_errors=True)

    def describe(self, key: str) -> str:
        return str(self.root / key)


class FsspecStore(Store):
    """An object store through fsspec (s3fs for `s3://`; the endpoint comes from AWS_ENDPOINT_URL when set)."""

    def __init__(self, url: str):
        import fsspec  # lazy: only object-store caches need it (with s3fs, ~0.3 s to import)

        self.url = url.rstrip("/")
        self.fs, self.base = fsspec.core.url_to_fs(self.url)

    def _path(self, key: str) -> str:
        return f"{self.base}/{key}"

    def get(self, key: str) -> bytes | None:
        try:
            return self.fs.cat_file(self._path(key))
        except FileNotFoundError:
            return None

    def put(self, key: str, data: bytes) -> None:
        self.fs.pipe_file(self._path(key), data)  # one PUT: atomic per object

    def list(self, prefix: str) -> list[str]:
        try:
            found = self.fs.find(self._path(prefix))
        except FileNotFoundError:
            return []
        return sorted(p[len(self.base) + 1:] for p in found)

    def delete(self, prefix: str) -> None:
        paths = self.fs.find(self._path(prefix))
        if paths:
            self.fs.rm(paths)

    def describe(self, key: str) -> str:
        return f"{self.url}/{key}"


def is_url(root: object) -> bool:
    """True for an object-store cache: `--cache URL`, or no `--cache` and `$GR00T_CACHE` set to a URL."""
    root = root if root is not None else os.environ.get("GR00T_CACHE")
    return isinstance(root, str) and "://" in root


def requested_root(root: object) -> object:
    """`--cache` as given, else `$GR00T_CACHE` (which may be a URL)."""
    return root if root is not None else os.environ.get("GR00T_CACHE")


def open_store(root: str | Path) -> Store:
    return FsspecStore(str(root)) if is_url(root) else LocalStore(Path(root))


def remote_entries(store: Store) -> dict[str, dict | None]:
    """Every entry name in an object-store cache -> its manifest, or None (a push not finished, or abandoned)."""
    names = sorted({key.split("/")[1] for key in store.list("entries") if key.count("/") >= 2})
    out = {}
    for name in names:
        manifest = store.get_json(manifest_key(name))
        out[name] = manifest if manifest and name.endswith(str(manifest.get("fingerprint", ""))[:20]) else None
    return out


def remote_refs(store: Store) -> dict[str, list[str]]:
    """Entry name -> the refs pointing to it."""
    out: dict[str, list[str]] = {}
    for key in store.list("refs"):
        ref = store.get_json(key) or {}
        if "entry" in ref:
            out.setdefault(ref["entry"], []).append(Path(key).stem)
    return out


def verify_remote(store: Store, name: str, manifest: dict) -> list[str]:
    """Every chunk and device file the manifest lists must exist with its size and xxh3 (one GET each)."""
    problems, base = [], PurePosixPath(entry_key(name))
    for array, arr in manifest["arrays"].items():
        for chunk, rec in arr["chunks"].items():
            slot = slot_of(chunk)
            key = str(chunk_file(base, array, len(arr["attributes"]["logical_shape"]), slot))
            if not matches(store.get(key), rec):
                problems.append(f"{store.describe(key)}: chunk is missing or does not match the manifest checksum")
            if "tensorbin" in rec:
                packed = str(packed_path(base, array, slot))
                if not matches(store.get(packed), rec["tensorbin"]):
                    problems.append(f"{store.describe(packed)}: device file is missing or does not match")
    return problems


def push_entry(local_entry: Path, store: Store, name: str, progress: bool = False) -> int:
    """Copy a published local entry to `store` under entries/<name>/: every object, then the manifest last.
    Objects already there with the same size are skipped (they are named by content). Returns bytes sent."""
    sent = 0
    existing = set(store.list(entry_key(name)))
    files = sorted(p for p in local_entry.rglob("*") if p.is_file() and p.name != MANIFEST)
    total, t0, last = sum(p.stat().st_size for p in files), time.perf_counter(), time.perf_counter()
    for path in files:
        key = f"{entry_key(name)}/{path.relative_to(local_entry)}"
        if key in existing:
            continue
        data = path.read_bytes()
        store.put(key, data)
        sent += len(data)
        if progress and time.perf_counter() - last >= 5:
            last = time.perf_counter()
            print(f"push: {sent / 1e6:,.0f} of {total / 1e6:,.0f} MB to {store.describe('entries/' + name)}, "
                  f"{last - t0:.0f} s", file=sys.stderr, flush=True)
    manifest = (local_entry / MANIFEST).read_bytes()
    store.put(manifest_key(name), manifest)
    return sent + len(manifest)
