"""Helpers for tests against moto's S3 server (tests/conftest.py `s3_url`): a folder copied into the bucket, and the
MD5 of many objects at once, to hold a bucket's entry to a folder's byte for byte without a GET per object."""

from __future__ import annotations

import hashlib
from pathlib import Path


def upload(folder: Path, url: str) -> None:
    """A trainer's folder copied into the bucket, file by file, as `aws s3 sync` would."""
    import fsspec

    fs, base = fsspec.core.url_to_fs(url)
    fs.pipe({f"{base}/{p.relative_to(folder).as_posix()}": p.read_bytes() for p in folder.rglob("*") if p.is_file()})


def md5s(store, prefix: str, keys) -> dict[str, str | None]:
    """The MD5 of each of `keys`: in the bucket, the ETag S3 computed when the object was put whole (one listing,
    not a GET per object); in a folder, hashlib's of the file."""
    if store.local_path(prefix) is None:
        listed = store.fs.find(store.describe(prefix), detail=True)
        found = {k[len(store.base) + 1:]: info["ETag"].strip('"') for k, info in listed.items()}
        return {k: found.get(k) for k in keys}
    return {k: hashlib.md5(store.local_path(k).read_bytes()).hexdigest() for k in keys}
