"""The safetensors format, in one place: parse and validate a header, frame a new file, read byte ranges.

Format (https://github.com/huggingface/safetensors, README "Format"): an 8-byte little-endian header length N,
then N bytes of UTF-8 JSON — an object mapping each tensor name to `{"dtype", "shape", "data_offsets"}` plus an
optional `"__metadata__"` object of strings — padded with spaces to a multiple of 8, then the data. Offsets are
relative to the first data byte; the spans tile the data exactly (no holes, no overlaps, nothing after the last).

The parser treats every file as hostile: the header length is capped before anything is allocated, every field is
type-checked, and each error names the file and the key. Data is read by byte range into caller-owned numpy
buffers (tasks/io/file_blocks.py `open_at`: `os.preadv`, or a ranged GET for a shard in an object store), so a read
costs exactly the bytes it returns.
"""

from __future__ import annotations

import json
import os
import stat
import struct
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, Mapping

import ml_dtypes
import numpy as np

from tasks.io.bulk_write import aligned_empty, nbytes
from tasks.errors import CheckpointError
from tasks.io.file_blocks import is_remote, open_binary

# safetensors dtype tag -> numpy dtype used to hold it (bf16 as ml_dtypes.bfloat16: same bytes, real numbers).
NUMPY_DTYPES: Mapping[str, np.dtype] = {
    "BF16": np.dtype(ml_dtypes.bfloat16), "F16": np.dtype(np.float16), "F32": np.dtype(np.float32),
    "F64": np.dtype(np.float64), "I8": np.dtype(np.int8), "U8": np.dtype(np.uint8), "I16": np.dtype(np.int16),
    "U16": np.dtype(np.uint16), "I32": np.dtype(np.int32), "U32": np.dtype(np.uint32), "I64": np.dtype(np.int64),
    "U64": np.dtype(np.uint64), "BOOL": np.dtype(np.bool_),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn), "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
}
MAX_HEADER_BYTES = 100 * 2**20  # real GR00T headers are ~130 KB; a hostile length must not allocate gigabytes
MAX_TENSORS_PER_FILE = 200_000


@dataclass(frozen=True, kw_only=True)
class TensorEntry:
    key: str
    dtype: str
    shape: tuple[int, ...]
    start: int  # data_offsets, relative to the first data byte
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, kw_only=True)
class ShardHeader:
    path: Path
    header_len: int
    metadata: Mapping[str, str]
    entries: Mapping[str, TensorEntry]
    file_size: int

    @property
    def data_start(self) -> int:
        return 8 + self.header_len

    @property
    def data_bytes(self) -> int:
        """Bytes after the header: the tensors tile them exactly (checked at parse), aliases or not."""
        return self.file_size - self.data_start

    def renamed(self, names: Mapping[str, str]) -> "ShardHeader":
        """The same file seen under other key names: `names` maps each name to the stored key whose bytes it
        reads (a stripped prefix, or a tied table read from the tensor it is tied to). Does not perform I/O."""
        entries = {name: replace(self.entries[stored], key=name) for name, stored in names.items()}
        return replace(self, entries=entries)


def _shape(path: Path, key: str, raw: object) -> tuple[int, ...]:
    if not isinstance(raw, list) or not all(type(d) is int and d >= 0 for d in raw):
        raise CheckpointError(path, f"shape must be a list of non-negative integers, found {raw!r}", key)
    return tuple(raw)


def _entry(path: Path, key: str, raw: object) -> TensorEntry:
    if not isinstance(raw, dict) or set(raw) != {"dtype", "shape", "data_offsets"}:
        raise CheckpointError(path, f"tensor entry must be an object with dtype, shape and data_offsets, found {raw!r}", key)
    dtype = raw["dtype"]
    if dtype not in NUMPY_DTYPES:
        raise CheckpointError(path, f"unknown dtype {dtype!r}; known: {', '.join(NUMPY_DTYPES)}", key)
    shape = _shape(path, key, raw["shape"])
    offsets = raw["data_offsets"]
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)):
        raise CheckpointError(path, f"data_offsets must be two integers, found {offsets!r}", key)
    start, end = offsets
    if not 0 <= start <= end:
        raise CheckpointError(path, f"data_offsets [{start}, {end}] are reversed or negative", key)
    expected = nbytes(shape, NUMPY_DTYPES[dtype])
    if end - start != expected:
        raise CheckpointError(path, f"data_offsets span {end - start} bytes but shape {list(shape)} x {dtype} "
                                    f"needs {expected}", key)
    return TensorEntry(key=key, dtype=dtype, shape=shape, start=start, end=end)


def parse_header(path: Path, raw: bytes, file_size: int) -> ShardHeader:
    """Validate header bytes (without the 8-byte prefix) of a file of `file_size` bytes. Does not perform I/O."""
    try:
        obj = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise CheckpointError(path, f"header is not UTF-8 ({e.reason} at byte {e.start}); the file is not safetensors or is corrupt") from e
    except json.JSONDecodeError as e:
        raise CheckpointError(path, f"header is not valid JSON ({e.msg} at byte {e.pos})") from e
    if not isinstance(obj, dict):
        raise CheckpointError(path, f"header must be a JSON object, found {type(obj).__name__}")
    metadata = obj.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise CheckpointError(path, f"__metadata__ must be an object of strings, found {metadata!r}", "__metadata__")
    if len(obj) > MAX_TENSORS_PER_FILE:
        raise CheckpointError(path, f"header lists {len(obj)} tensors, more than the cap of {MAX_TENSORS_PER_FILE}")
    entries = {key: _entry(path, key, value) for key, value in obj.items()}
    data_size = file_size - 8 - len(raw)
    cursor = 0
    for e in sorted(entries.values(), key=lambda e: (e.start, e.end)):
        if e.start != cursor:
            what = "overlaps the previous tensor" if e.start < cursor else f"leaves a gap of {e.start - cursor} bytes"
            raise CheckpointError(path, f"data_offsets [{e.start}, {e.end}] {what} (expected start {cursor})", e.key)
        if e.end > data_size:
            raise CheckpointError(path, f"data_offsets end {e.end} is past the end of the data ({data_size} bytes): "
                                        "the file is truncated; download it again", e.key)
        cursor = e.end
    if cursor != data_size:
        raise CheckpointError(path, f"tensors cover {cursor} data bytes but the file holds {data_size} after the header")
    return ShardHeader(path=path, header_len=len(raw), metadata=metadata, entries=entries, file_size=file_size)


def read_header(path: Path) -> ShardHeader:
    """Read and validate the header of one safetensors file; no tensor data is read."""
    if not is_remote(path) and not stat.S_ISREG(mode := os.stat(path).st_mode):  # a pipe waits for its writer
        kind = "a folder" if stat.S_ISDIR(mode) else "a named pipe" if stat.S_ISFIFO(mode) else \
            "a socket" if stat.S_ISSOCK(mode) else "a device"
        raise CheckpointError(path, f"is {kind}, not a regular file; pass the weight files themselves, or a folder "
                                    "of them")
    with open_binary(path) as fh:
        size = fh.seek(0, os.SEEK_END)
        fh.seek(0)
        prefix = fh.read(8)
        if len(prefix) < 8:
            raise CheckpointError(path, f"file is {size} bytes, too short for the 8-byte header length: truncated")
        (n,) = struct.unpack("<Q", prefix)
        if n > MAX_HEADER_BYTES:
            raise CheckpointError(path, f"header length {n} exceeds the {MAX_HEADER_BYTES}-byte cap: not a safetensors file or corrupt")
        if 8 + n > size:
            raise CheckpointError(path, f"header length {n} runs past the end of the {size}-byte file: truncated")
        raw = fh.read(n)
    return parse_header(path, raw, size)


def frame_header(entries: Iterable[tuple[str, str, tuple[int, ...]]], metadata: Mapping[str, str]) -> tuple[bytes, list[tuple[str, int, int]]]:
    """Header bytes for `(key, dtype, shape)` entries, laid out as safetensors' own writer does (sorted by name),
    and the `(key, start, end)` data plan. Does not perform I/O."""
    header: dict[str, object] = {"__metadata__": dict(metadata)} if metadata else {}
    plan, cursor = [], 0
    for key, dtype, shape in sorted(entries, key=lambda e: e[0]):
        size = nbytes(shape, NUMPY_DTYPES[dtype])
        header[key] = {"dtype": dtype, "shape": list(shape), "data_offsets": [cursor, cursor + size]}
        plan.append((key, cursor, cursor + size))
        cursor += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw, plan


def write_file(fh: BinaryIO, entries: list[tuple[str, str, tuple[int, ...]]],
               chunks: Callable[[str], Iterable[np.ndarray]], metadata: Mapping[str, str] | None = None) -> int:
    """Stream a safetensors file into `fh`: `chunks(key)` yields one tensor's data piece by piece, so no tensor
    (let alone a shard) is ever whole in memory. Returns the number of bytes written."""
    head, plan = frame_header(entries, {"format": "pt"} if metadata is None else metadata)
    fh.write(head)
    for key, start, end in plan:
        written = 0
        for piece in chunks(key):
            data = np.ascontiguousarray(piece).reshape(-1).view(np.uint8)
            fh.write(memoryview(data))
            written += data.nbytes
        if written != end - start:
            raise CheckpointError(getattr(fh, "name", "?"), f"wrote {written} bytes, the header promises {end - start}", key)
    return len(head) + (plan[-1][2] if plan else 0)


def read_rows_from(shard, header: ShardHeader, key: str, lo: int, hi: int) -> np.ndarray:
    """Rows `lo:hi` of the leading dimension of `key` (a 0-d tensor has one row) from the open shard (tasks/
    file_blocks.py `open_at`: a local file or an object in a store), reading only those bytes (tasks/source/shards.py
    `read_rows` opens the shard for it)."""
    entry = header.entries[key]
    rows = entry.shape[0] if entry.shape else 1
    if not 0 <= lo <= hi <= rows:
        raise CheckpointError(header.path, f"rows [{lo}, {hi}) are out of range for shape {list(entry.shape)}", key)
    # page-aligned: a tensor staged as it was read (banks, norms) goes to the cache without a bounce copy
    out = aligned_empty((hi - lo, *entry.shape[1:]) if entry.shape else (), NUMPY_DTYPES[entry.dtype])
    row_bytes = entry.nbytes // rows if rows else 0
    shard.read_into(header.data_start + entry.start + lo * row_bytes, out)
    return out
