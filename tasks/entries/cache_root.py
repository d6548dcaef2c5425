"""The store behind a cache root: a local folder (`LocalStore`), or an object-store URL (`S3Store` for `s3://`,
`FsspecStore` for any other fsspec scheme). Every command and task opens its cache through here."""

from __future__ import annotations

import functools
from pathlib import Path

from tasks.entries.object_stores import FsspecStore, S3Store
from tasks.entries.store import LocalStore, Store
from tasks.errors import CacheError
from tasks.io.file_blocks import is_url


def open_store(root: Store | Path | str, stall: float | None = None) -> Store:
    """A store for a cache root: a local folder, or an object-store URL (`s3://bucket/prefix`; `stall`: its stall
    limit, default tasks/io/network.py `stall_seconds()`)."""
    if isinstance(root, Store):
        return root
    if not is_url(root):
        if Path(root).exists() and not Path(root).is_dir():
            raise CacheError(f"{root}: the cache is a file, not a folder; pass the cache folder (--cache DIR or "
                             "$GR00T_CACHE; it is made if missing)")
        return LocalStore(Path(root))
    return S3Store(root, stall) if root.startswith(("s3://", "s3a://")) else FsspecStore(root)


@functools.cache
def store_at(url: str, stall: float | None = None) -> Store:
    """The store at an object-store URL, one per process and stall limit: a Dask worker's tasks reuse its client
    and connections, and keep the stall limit the client was given (a worker has its own environment)."""
    return open_store(url, stall)
