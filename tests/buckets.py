"""Helpers for tests against moto's S3 server (tests/conftest.py `s3_url`): a folder copied into the bucket, and the
MD5 of many objects at once, to hold a bucket's entry to a folder's byte for byte without a GET per object."""

from __future__ import annotations

import hashlib
from pathlib import Path


def forget_s3_clients() -> None:
    """Drop s3fs's cached filesystems: each holds the endpoint it was made with, and a test that points
    AWS_ENDPOINT_URL at a proxy leaves one behind that the next test's checkpoint in the bucket (UPath) would use."""
    from s3fs import S3FileSystem

    S3FileSystem.clear_instance_cache()


def upload(folder: Path, url: str) -> None:
    """A trainer's folder copied into the bucket, file by file, as `aws s3 sync` would."""
    import fsspec

    fs, base = fsspec.core.url_to_fs(url, skip_instance_cache=True)  # the endpoint of now (tests/faulty_network.py)
    fs.pipe({f"{base}/{p.relative_to(folder).as_posix()}": p.read_bytes() for p in folder.rglob("*") if p.is_file()})


def md5s(store, prefix: str, keys) -> dict[str, str | None]:
    """The MD5 of each of `keys`: in the bucket, the ETag S3 computed when the object was put whole (one listing,
    not a GET per object); in a folder, hashlib's of the file."""
    if store.local_path(prefix) is None:
        import fsspec

        # s3fs's listing (not the store under test), at the endpoint of now: a cached one may be a closed proxy's
        fs, base = fsspec.core.url_to_fs(store.describe(""), skip_instance_cache=True)
        listed = fs.find(f"{base}/{prefix}", detail=True)
        found = {k[len(base) + 1:]: info["ETag"].strip('"') for k, info in listed.items()}
        return {k: found.get(k) for k in keys}
    return {k: hashlib.md5(store.local_path(k).read_bytes()).hexdigest() for k in keys}


def entry_md5s(store, name: str) -> dict[str, str | None]:
    """The MD5 of every chunk and device file of entry `name`, keyed by what it is (`<array>@<slot>`, and
    `…:tensorbin`) rather than where it is: a folder's entry holds files of its own, an object store's names shared
    objects under objects/ in its manifest. Read from the manifest and the objects themselves."""
    from tasks.entries.names import chunk_file, entry_key, packed_path
    from pathlib import PurePosixPath

    entry = PurePosixPath(entry_key(name))
    manifest = manifest_doc(store, name)
    where = {}
    for array, arr in manifest["arrays"].items():
        for slot, rec in arr["chunks"].items():
            at = None if slot == "all" else int(slot)
            ndim = len(arr["shape"]) - (at is not None)
            where[f"{array}@{slot}"] = rec.get("object") or str(chunk_file(entry, array, ndim, at))
            if "tensorbin" in rec:
                packed = rec["tensorbin"].get("object") or str(packed_path(entry, array, at))
                where[f"{array}@{slot}:tensorbin"] = packed
    pooled = [k for k in where.values() if k.startswith("objects/")]
    found = md5s(store, "objects", pooled) if pooled else {}
    rest = [k for k in where.values() if not k.startswith("objects/")]
    found.update(md5s(store, str(entry), rest) if rest else {})
    return {what: found[key] for what, key in where.items()}


def named_objects(store, name: str) -> dict[str, set[str]]:
    """Each array of entry `name` -> the objects its manifest names (chunks and device files), read from the JSON."""
    manifest = manifest_doc(store, name)
    return {array: {o for c in arr["chunks"].values() for o in (c.get("object"), c.get("tensorbin", {}).get("object"))
                    if o} for array, arr in manifest["arrays"].items()}


def manifest_doc(store, name: str) -> dict | None:
    """Entry `name`'s MANIFEST.json as JSON, read here: plain in a folder, gzipped in an object store."""
    import gzip
    import json

    raw = store.get(f"entries/{name}/MANIFEST.json")
    if raw is None:
        return None
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
