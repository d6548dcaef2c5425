"""The slice of the Zarr v3 format the cache uses, written and read directly (https://zarr-specs.readthedocs.io/en/latest/v3/core/index.html).

Arrays are `uint16` (bf16 bit patterns; `attributes.dtype == "bfloat16"`) or `float32` (a host table kept at a
wider source's precision; `attributes.dtype == "float32"`), regular chunk grid, default chunk key
encoding with `.` (a chunk is a file beside its `zarr.json`, not a directory per coordinate), one `bytes` codec (little endian) and nothing else: a chunk file is the chunk's raw C-order
bytes. So a chunk can be written and read with one system call into a caller's buffer, with no per-array
library overhead, and zarr-python (or any v3 reader) still opens the result. Chunk files are written in place,
inside an entry that is being built and is published whole by one rename (tasks/entries/publish.py), so a reader never sees
a torn chunk.

Measured against zarr-python 3.1 (`python -m bench --only zarr`, bench/zarr-results.json): writing and reading back
every bf16 array of the full-size N1.6 tt-n16 entry (6.24 GB, 986 arrays, banks chunked per slot), page cache warm,
median of 2 on 2 cores: this module 3.16 s write + 1.33 s read = 4.49 s (7.2 s CPU); zarr-python (no compressor, same
chunks) 13.67 s + 3.66 s = 17.33 s (20.9 s CPU), 3.9x. So the project keeps its own, and zarr-python is a test
dependency only: the independent reader the tests open every entry with.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from tasks.io.bulk_write import write_bytes_in_place
from tasks.entries.store import link_or_copy

METADATA = "zarr.json"  # a group's or an array's document, as the Zarr v3 spec names it


STORAGE_DTYPE = np.dtype("<u2")
# attributes.dtype -> (Zarr data_type, numpy dtype of the stored bytes)
DATA_TYPES = {"bfloat16": ("uint16", STORAGE_DTYPE), "float32": ("float32", np.dtype("<f4"))}
SEPARATOR = "."  # cache format 3 (2 used "/": a directory per coordinate, 3,800 per N1.6 entry instead of 990)


PLAIN_CODECS = [{"name": "bytes", "configuration": {"endian": "little"}}]  # a chunk file is its raw C-order bytes


def array_metadata(shape: Sequence[int], chunks: Sequence[int], attributes: Mapping[str, object],
                   codecs: Sequence[Mapping] = PLAIN_CODECS) -> dict:
    """The `zarr.json` document of one array of `attributes["dtype"]` (see DATA_TYPES). Does not perform I/O.
    `codecs`: how a chunk file holds its values (plain C order; a tiled chunk's: tasks/device/one_file.py)."""
    return {
        "shape": list(shape), "data_type": DATA_TYPES[str(attributes.get("dtype", "bfloat16"))][0],
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(chunks)}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": SEPARATOR}},
        "fill_value": 0, "codecs": [dict(c) for c in codecs],
        "attributes": dict(attributes), "zarr_format": 3, "node_type": "array", "storage_transformers": [],
    }


def group_metadata(arrays: Mapping[str, dict], attributes: Mapping[str, object]) -> dict:
    """The root `zarr.json`, with every array's metadata consolidated inline (one read opens the entry)."""
    return {"attributes": dict(attributes), "zarr_format": 3, "node_type": "group",
            "consolidated_metadata": {"kind": "inline", "must_understand": False, "metadata": dict(arrays)}}


def chunk_path(array_dir: Path, coords: Sequence[int]) -> Path:
    return array_dir / SEPARATOR.join(("c", *(str(c) for c in coords)))


def create_array(array_dir: Path, meta: Mapping[str, object], like: Sequence[Path] = ()) -> None:
    """The array's folder and `zarr.json`, inside an entry being built (written in place: tasks/io/bulk_write.py).
    A `zarr.json` with the same bytes in one of the array folders `like` (the same array in a published entry) is
    hard-linked instead: no new inode, which costs 0.3-0.8 ms on this project's ext4 disk, against ~20 us for
    reading and comparing the other one."""
    array_dir.mkdir(exist_ok=True)
    doc = (json.dumps(meta, indent=1) + "\n").encode()
    target = array_dir / METADATA
    for other in like:
        try:
            if (other / METADATA).read_bytes() == doc:
                link_or_copy(other / METADATA, target)  # a killed run's is replaced, never written through
                return
        except OSError:  # gone meanwhile: written below
            continue
    write_bytes_in_place(target, doc)


def write_chunk(array_dir: Path, coords: Sequence[int], data: np.ndarray) -> None:
    """Store one chunk into an array `create_array` made: `data` must already have the chunk's shape and its
    array's dtype; bf16 is stored as its uint16 bits, little endian like everything here."""
    raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    write_bytes_in_place(chunk_path(array_dir, coords), memoryview(raw))
