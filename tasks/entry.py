"""A cache entry's names and keys, in one place (cache/README.md says the same): where the manifest, refs, chunks and
device files of an entry live, how a chunk is keyed in the manifest, and the checksum every chunk is held to.
Paths are relative to the cache root or the entry, so one name serves a local folder and an object store alike.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import numpy as np
import xxhash

from tasks.zarr_v3 import chunk_path

MANIFEST = "MANIFEST.json"  # written last: present means complete
ENTRIES, REFS = "entries", "refs"
PROGRESS_DIR = ".staged"    # per-chunk progress records of an entry being built (resume)
PACKED_DIR = "tensorbin"    # ttnn's `.tensorbin` device files, outside the Zarr arrays
WHOLE = "all"               # the manifest key of a whole-array chunk; a bank's chunks are keyed by slot


def entry_key(name: str) -> str:
    return f"{ENTRIES}/{name}"


def manifest_key(name: str) -> str:
    return f"{ENTRIES}/{name}/{MANIFEST}"


def ref_key(version: str, layout: str, profile: str) -> str:
    """The ref naming the entry last converted for this version, layout and profile."""
    return f"{REFS}/{version}-{layout}-{profile}.json"


def chunk_key(slot: int | None) -> str:
    return WHOLE if slot is None else str(slot)


def slot_of(key: str) -> int | None:
    return None if key == WHOLE else int(key)


def chunk_coords(ndim: int, slot: int | None) -> tuple[int, ...]:
    """Whole-array targets are one chunk; an embodiment bank has one chunk per slot."""
    return (0,) * ndim if slot is None else (slot,) + (0,) * ndim


def chunk_file(entry: Path | PurePosixPath, name: str, ndim: int, slot: int | None) -> Path | PurePosixPath:
    """The chunk of target `name` (`ndim` = its logical rank) for `slot`, under the entry folder or key."""
    return chunk_path(entry / name, chunk_coords(ndim, slot))


def _chunk_name(name: str, slot: int | None) -> str:
    return name + ("" if slot is None else f"@{slot}")


def packed_path(entry: Path | PurePosixPath, name: str, slot: int | None) -> Path | PurePosixPath:
    """Where a target's `.tensorbin` lives (outside the arrays, so Zarr readers never see it)."""
    return entry / PACKED_DIR / (_chunk_name(name, slot) + ".tensorbin")


def progress_path(entry: Path, name: str, slot: int | None) -> Path:
    return entry / PROGRESS_DIR / (_chunk_name(name, slot) + ".json")


def checksum(data: np.ndarray | bytes | memoryview) -> str:
    """xxh3-64 of raw bytes (about 10 GB/s: cheap enough to verify every chunk on every load)."""
    if isinstance(data, np.ndarray):
        data = memoryview(np.ascontiguousarray(data).reshape(-1).view(np.uint8))
    return xxhash.xxh3_64_hexdigest(data)


def matches(data: np.ndarray | bytes | memoryview | None, record: dict) -> bool:
    """Whether bytes are the chunk (or device file) a manifest record describes: its size and xxh3."""
    if data is None:
        return False
    size = data.nbytes if isinstance(data, (np.ndarray, memoryview)) else len(data)
    return size == record["nbytes"] and checksum(data) == record["xxh3"]
