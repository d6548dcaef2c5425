"""Stage functions on the source checkpoint: index a shard, verify its bytes, read a tensor or one slot.

Pure in the sense that matters for the graph: plain values in, plain values out, no Dask, no shared state. Reads
open the shard themselves (an `os.open` is far cheaper than the read; a shard in an object store is read by
ranged GETs), so tasks run on any worker; the checkpoint reader (tasks/source/checkpoint.py) reads through the same
functions.
"""

from __future__ import annotations

import hashlib
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import ml_dtypes
import numpy as np
import xxhash

from tasks.errors import CheckpointError
from tasks.numerics import precision
from tasks.source import safetensors_file
from tasks.io.bulk_write import aligned_empty
from tasks.io.file_blocks import each_block, open_at
from tasks.plan import HostTable
from tasks.source.safetensors_file import ShardHeader, read_header


@dataclass(frozen=True)
class VerifiedShard:
    header: ShardHeader
    sha256: str | None              # taken only where a sha256 is expected (an HF blob name) or asked for (--sha256)
    tensor_xxh3: Mapping[str, str]  # per-tensor content identity: lets a fine-tune reuse what did not change


def index_shard(path: Path, expected_keys: frozenset[str], names: Mapping[str, str] | None = None) -> ShardHeader:
    """Parse one shard header and check it still holds exactly the keys the plan was built from; `names` (the
    checkpoint's view: key -> stored key) renames it as the plan sees it."""
    header = read_header(path)
    if set(header.entries) != expected_keys:
        extra = sorted(set(header.entries) - expected_keys)
        gone = sorted(expected_keys - set(header.entries))
        key = (extra or gone)[0]
        raise CheckpointError(path, f"shard changed since the plan was made ({len(extra)} new, {len(gone)} missing keys); "
                                    "run the conversion again", key)
    return header if names is None else header.renamed(names)


def _tensor_spans(header: ShardHeader) -> tuple[list[tuple[int, int, str]], dict[str, list[str]]]:
    """Each distinct byte range of the shard's tensors as (file start, file end, the key hashed for it), in file
    order, and the keys that share it (a tied table reads the bytes of another key: hashed once)."""
    aliases: dict[tuple[int, int], list[str]] = {}
    for k, e in header.entries.items():
        aliases.setdefault((e.start, e.end), []).append(k)
    spans = sorted((header.data_start + lo, header.data_start + hi, keys[0]) for (lo, hi), keys in aliases.items())
    return spans, {keys[0]: keys for keys in aliases.values()}


def _hash_spans(header: ShardHeader, spans: Sequence[tuple[int, int, str]], sha=None,
                whole: bool = True) -> dict[str, str]:
    """The xxh3-128 of each span, in one sequential pass over the file (`whole`), or over those spans' bytes only;
    `sha` (a hashlib object) is fed every byte of the file on the way."""
    hashers = {k: xxhash.xxh3_128() for _, _, k in spans}
    first = 0  # the first span not wholly before the current block

    def consume(block: memoryview, pos: int) -> None:
        nonlocal first
        n = len(block)
        if sha is not None:
            sha.update(block)
        while first < len(spans) and spans[first][1] <= pos:
            first += 1
        i = first
        while i < len(spans) and spans[i][0] < pos + n:
            lo, hi, key = spans[i]
            hashers[key].update(block[max(lo - pos, 0):min(hi - pos, n)])
            i += 1

    try:
        each_block(header.path, consume, span=None if whole or not spans else (spans[0][0], spans[-1][1]))
    except OSError as e:
        raise CheckpointError(header.path, f"could not be read to the end ({e.strerror or e}); if it is being "
                                           "written or downloaded, wait for it and run again") from e
    return {k: h.hexdigest() for k, h in hashers.items()}


def hash_shard(header: ShardHeader, with_sha256: bool = True) -> tuple[str | None, dict[str, str]]:
    """One sequential pass: the file's sha256 (unless `with_sha256` is False: None) and every tensor's xxh3-128,
    from the same blocks."""
    sha = hashlib.sha256() if with_sha256 else None
    spans, aliases = _tensor_spans(header)
    digests = _hash_spans(header, spans, sha)
    return sha and sha.hexdigest(), {k: digests[first] for first, keys in aliases.items() for k in keys}


PIECE = 256 << 20  # the identity pass hands out a shard's tensors in runs of about this many bytes


def _pieces(spans: list[tuple[int, int, str]]) -> list[list[tuple[int, int, str]]]:
    """The spans in runs of about PIECE bytes, cut only between tensors (one xxh3 stream cannot be split)."""
    runs: list[list[tuple[int, int, str]]] = []
    for span in spans:
        if not runs or runs[-1][-1][1] - runs[-1][0][0] >= PIECE:
            runs.append([])
        runs[-1].append(span)
    return runs


def identify_shards(headers: Sequence[ShardHeader], workers: int) -> list[dict[str, str]]:
    """Every tensor's xxh3-128 of each shard (no sha256). The shards' tensors are handed out in runs, largest
    first, to `workers` threads: a fine-tune's 6.2 and 3.2 GB shards took one thread each, and the second thread
    sat idle for a third of the pass."""
    work, aliases = [], []
    for i, header in enumerate(headers):
        spans, shared = _tensor_spans(header)
        aliases.append(shared)
        work += [(i, run) for run in _pieces(spans)]
    work.sort(key=lambda w: w[1][-1][1] - w[1][0][0], reverse=True)
    found: list[dict[str, str]] = [{} for _ in headers]
    with ThreadPoolExecutor(max(1, min(workers, len(work)))) as pool:
        for i, digests in pool.map(lambda w: (w[0], _hash_spans(headers[w[0]], w[1], whole=False)), work):
            found[i].update(digests)
    return [{k: digests[first] for first, keys in shared.items() for k in keys}
            for digests, shared in zip(found, aliases)]


CONTENT_ID = "xxh3-128:"  # the prefix of a shard identity taken from its tensors (a sha256 has none)
CHECKED_BY_SHA256 = "published sha256"   # an HF snapshot: the sha256 its blob is named by
CHECKED_BY_CONTENT = "content identity"  # a plain folder or file: its tensors' xxh3-128


def checked_against(identity: str) -> str:
    """What a shard of this identity is checked against: the sha256 the hub published it under, or its content."""
    return CHECKED_BY_CONTENT if identity.startswith(CONTENT_ID) else CHECKED_BY_SHA256


def content_identity(header: ShardHeader, tensor_xxh3: Mapping[str, str]) -> str:
    """A shard's identity when no sha256 is known before the conversion (a plain file, not an HF blob): its tensors'
    names, dtypes, shapes and xxh3-128, which a pass at memory speed gives. It names the entry, finds what changed,
    and checks the bytes again in the graph (verify_shard); no sha256 is taken unless asked for."""
    doc = [[k, e.dtype, list(e.shape), tensor_xxh3[k]] for k, e in sorted(header.entries.items())]
    return CONTENT_ID + xxhash.xxh3_128_hexdigest(json.dumps(doc, separators=(",", ":")).encode())


def verify_shard(header: ShardHeader, expected: str | None, record_sha256: bool = False) -> VerifiedShard:
    """Check the shard's bytes against its identity, in one pass that also gives every tensor's xxh3. The sha256,
    the slow hash, is taken only where it checks something, an HF blob name (`expected` a sha256), or where it is
    asked for (`record_sha256`, --sha256: provenance); a plain file is checked against its content identity."""
    content = expected is not None and expected.startswith(CONTENT_ID)
    digest, tensors = hash_shard(header, with_sha256=record_sha256 or not content)
    found = content_identity(header, tensors) if content else digest
    if expected is not None and found != expected:
        what = "content identity" if content else "content sha256"
        raise CheckpointError(header.path, f"{what} is {found}, expected {expected} (its HF blob name, or what was "
                                           "read when this conversion began or when it was first converted): the "
                                           "file changed or is corrupt; download it again")
    return VerifiedShard(header, digest, tensors)


def read_rows(header: ShardHeader, key: str, lo: int, hi: int) -> np.ndarray:
    """Rows `lo:hi` of the leading dimension of `key`, reading only those bytes. The one read every reader takes:
    the graph's read and slot tasks below, and `Checkpoint.rows/get/slot`."""
    with open_at(header.path) as shard:
        return safetensors_file.read_rows_from(shard, header, key, lo, hi)


def read_tensor(header: ShardHeader, key: str) -> np.ndarray:
    """One whole tensor, as stored."""
    entry = header.entries[key]
    return read_rows(header, key, 0, entry.shape[0] if entry.shape else 1)


def read_slot(header: ShardHeader, key: str, slot: int) -> np.ndarray:
    """`W[slot]` of an embodiment bank: reads that slot's bytes only. Never transposed: the model computes
    `x @ W[e] + b[e]`."""
    _slot_in_range(header, key, slot)
    return read_rows(header, key, slot, slot + 1)[0]


def _slot_in_range(header: ShardHeader, key: str, slot: int) -> None:
    shape = header.entries[key].shape
    if len(shape) < 2:
        raise CheckpointError(header.path, f"shape {list(shape)} has no slot dimension to index", key)
    if not 0 <= slot < shape[0]:
        raise CheckpointError(header.path, f"slot {slot} is out of range: the bank has slots 0..{shape[0] - 1}", key)


def read_host_table(table: HostTable, first: int, out: np.ndarray) -> None:
    """Values [first, first + out.size) of a host table, flat, as the float32 the port keeps (F32 copied, BF16 and
    F16 widened exactly) into `out` (contiguous float32): how the stage streams it into the entry."""
    _read_as_stored(table.header, table.key, True, first, out)


def read_weight(header: ShardHeader, key: str, host: bool = False) -> np.ndarray | HostTable:
    """A source tensor as its target is made from it: bf16 as the port's `.to(torch.bfloat16)` makes it, or, for
    a host table (`host`), left in its file to be streamed into the entry at float32 (`HostTable`). The graph's
    read task; what each source dtype becomes is tasks/numerics/precision.py's rule."""
    if host:
        return HostTable(header, key)
    entry = header.entries[key]
    if precision.kept_as_stored(entry.dtype, host=False):
        return read_tensor(header, key)
    out = aligned_empty(entry.shape, ml_dtypes.bfloat16)  # page-aligned: staged without a bounce copy
    _read_as_stored(header, key, False, 0, out.reshape(-1).view(np.uint16))
    return out


_CONVERT_BLOCK_BYTES = 4 << 20  # source bytes converted at a time: its output stays in L2/L3 meanwhile


def _read_as_stored(header: ShardHeader, key: str, host: bool, first: int, out: np.ndarray) -> None:
    """Values [first, first + out.size) of `key` into `out` (flat) as the cache stores them: straight in when the
    source's bytes are already that (precision.kept_as_stored), else block by block from the shard's mapping
    (file_blocks.each_block), each block converted (precision.convert_block) where the page cache holds it: one
    pass over the source bytes and no copy of them, and a wide tensor is never whole in memory. (Read through a
    4 MB buffer, the copy out of the page cache was 13% of a mixed fine-tune's CPU; its 4.37 GB of F32 DiT weights
    took 1.06-1.31 s and 2.0-2.4 CPU-s on two threads that way, 0.69-0.84 s and 1.3-1.6 CPU-s mapped.)"""
    entry = header.entries[key]
    source = safetensors_file.NUMPY_DTYPES[entry.dtype]
    offset = header.data_start + entry.start + first * source.itemsize
    if precision.kept_as_stored(entry.dtype, host):
        with open_at(header.path) as shard:
            shard.read_into(offset, out.view(source))
        return

    def convert(block: memoryview, pos: int) -> None:
        lo = (pos - offset) // source.itemsize
        values = np.frombuffer(block, source)
        precision.convert_block(values, out[lo:lo + values.size], host, key, header.path, first + lo)

    try:
        each_block(header.path, convert, _CONVERT_BLOCK_BYTES // source.itemsize * source.itemsize,
                   (offset, offset + out.size * source.itemsize))
    except OSError as e:
        raise CheckpointError(header.path, f"could not be read to the end ({e.strerror or e}); if it is being "
                                           "written or downloaded, wait for it and run again", key) from None


def read_weight_slot(header: ShardHeader, key: str, slot: int) -> np.ndarray:
    """`W[slot]` of a bank as bf16 (`.to(torch.bfloat16)`): the graph's slot task. A wider source is rounded
    block by block as it is read (one pass), into a page-aligned array the stage writes without a bounce copy."""
    entry = header.entries[key]
    if precision.kept_as_stored(entry.dtype, host=False):
        return read_slot(header, key, slot)
    _slot_in_range(header, key, slot)
    out = aligned_empty(entry.shape[1:], ml_dtypes.bfloat16)
    _read_as_stored(header, key, False, slot * out.size, out.reshape(-1).view(np.uint16))
    return out
