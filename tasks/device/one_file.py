"""Cache format 7's tiled chunk: one file per TILE target that is at once ttnn's `.tensorbin` of it and its Zarr
chunk, so each weight is stored once (../shared/reference/one-file-design.md has what was measured).

    [u64 N][ttnn's N-byte header][device payload][bf16 tile payload: packed dtypes only][u64 offset][u64 nbytes]

- ttnn loads it as a `.tensorbin`: the header says how long the device payload is, and ttnn reads nothing after
  it. That ttnn ignores the tail, and loads a file whose name does not end in `.tensorbin`, is no documented
  contract: `ttnn_reads_in_place()` asks it once per installation, and where it does not, a reader hands ttnn a
  scratch copy without the tail (`device_tensor`).
- Zarr reads it as a `sharding_indexed` shard whose index, at the end, points (offset, nbytes) at the bf16 tile
  payload: the one inner chunk of an array [*lead, H/32, 2, 16, W/32, 2, 16] stored through a `transpose` codec,
  which is the padded [*lead, H, W] reshaped (`zarr_shape`). Cut to the array's `logical_shape` attribute, it is
  the target's values. Nothing points at the header or at a packed payload: Zarr never reads them.
- A bfloat16 target's two payloads are the same bytes: its index points into the `.tensorbin` itself.

Readers that want rows (torch, a mesh upload, a check) untilize the bf16 payload (`logical`: tasks/numerics/kernels.c).
"""

from __future__ import annotations

import os
import struct
import tempfile

import numpy as np

from tasks.device import tensorbin
from tasks.device.ttnn_edge import padded_shape, ttnn_module
from tasks.io.bulk_write import aligned_empty
from tasks.plan import Target

INDEX = struct.Struct("<QQ")  # Zarr's shard index of one inner chunk, `bytes` little endian, no checksum
TILE, FACE = 32, 16


def is_tiled(target: Target) -> bool:
    """Whether a target is stored as one tiled file: a TILE target of rank 2 or more that keeps a device file
    (every packed one does). The rest keep a plain chunk in rows (host tables, biases of rank 1, the generic
    profile's bf16 targets), beside a `.tensorbin` where they have one."""
    return target.device_layout == "TILE" and len(target.shape) >= 2 and \
        (target.device_file or target.device_dtype != "bfloat16")


def zarr_shape(logical: tuple[int, ...] | list[int]) -> list[int]:
    """The Zarr array shape of one tiled target (or one slot of a bank): its padded [*lead, H, W] reshaped so that
    C order is tile order once the `transpose` codec is applied."""
    *lead, rows, cols = padded_shape(tuple(logical), "TILE")
    return [*lead, rows // TILE, 2, FACE, cols // TILE, 2, FACE]


def chunk_rank(target: Target) -> int:
    """How many coordinates name one chunk of the target (a bank's slot axis aside): its logical rank, or, tiled,
    its tile array's (four more)."""
    return len(zarr_shape(target.shape)) if is_tiled(target) else len(target.shape)


def zarr_codecs(chunk_shape: list[int]) -> list[dict]:
    """The codecs of a tiled array whose chunks are `chunk_shape` (one file each): a shard of one inner chunk, its
    index at the end; inside it, tile order is [tile row, tile column, face row, face column, row, column]."""
    lead = len(chunk_shape) - 6
    order = [*range(lead), *(lead + i for i in (0, 3, 1, 4, 2, 5))]
    little = {"name": "bytes", "configuration": {"endian": "little"}}
    return [{"name": "sharding_indexed", "configuration": {
        "chunk_shape": list(chunk_shape),
        "codecs": [{"name": "transpose", "configuration": {"order": order}}, little],
        "index_codecs": [little], "index_location": "end"}}]


def _tile_payload_bytes(shape: tuple[int, ...]) -> int:
    return tensorbin.payload_size(shape, "bfloat16")


def _after_device_file(shape: tuple[int, ...], device_dtype: str) -> int:
    """The bytes a tiled chunk holds after its `.tensorbin`: the bf16 tiles (packed dtypes only) and the index."""
    return (0 if device_dtype == "bfloat16" else _tile_payload_bytes(shape)) + INDEX.size


def tiled_file(array: np.ndarray, device_dtype: str) -> tuple[np.ndarray, tensorbin.Packed] | None:
    """The whole file of a bf16 array (logical shape) whose device dtype is `device_dtype`, in one aligned buffer,
    and the numerics of what the device reads; None where numpy does not make this ttnn's `.tensorbin` (another
    ttnn, bfloat4_b): then `around` ttnn's own bytes."""
    extra = _after_device_file(array.shape, device_dtype)
    made = tensorbin.tensorbin(array, device_dtype, spare=extra)
    if made is None:
        return None
    buffer, packed = made
    _finish(buffer, len(buffer) - extra, array, device_dtype)
    return buffer, packed


def around(device_file: bytes | np.ndarray, array: np.ndarray, device_dtype: str) -> np.ndarray:
    """The whole file made of a `.tensorbin` ttnn wrote itself: copied once, with the bf16 payload and the index."""
    device_file = np.frombuffer(device_file, np.uint8) if not isinstance(device_file, np.ndarray) else device_file
    extra = _after_device_file(array.shape, device_dtype)
    buffer = aligned_empty(device_file.nbytes + extra, np.uint8)
    buffer[:device_file.nbytes] = device_file.reshape(-1).view(np.uint8)
    _finish(buffer, device_file.nbytes, array, device_dtype)
    return buffer


def _header_end(file: np.ndarray) -> int:
    return 8 + int(file[:8].view("<u8")[0])


def _finish(buffer: np.ndarray, end: int, array: np.ndarray, device_dtype: str) -> None:
    """After the `.tensorbin` (which ends at byte `end`): the bf16 tile payload if the device's is packed, then
    the index pointing at the bf16 one."""
    if device_dtype == "bfloat16":
        offset = _header_end(buffer)
        nbytes = end - offset
    else:
        offset, nbytes = end, _tile_payload_bytes(array.shape)
        tensorbin.pack(array, "bfloat16", buffer[offset:offset + nbytes])
    INDEX.pack_into(buffer, len(buffer) - INDEX.size, offset, nbytes)


def bf16_payload(file: np.ndarray | memoryview | bytes) -> np.ndarray:
    """The bf16 tile payload the file's index points at (uint8, a view). ValueError when the index does not fit
    the file."""
    file = np.frombuffer(file, np.uint8) if not isinstance(file, np.ndarray) else file.reshape(-1).view(np.uint8)
    if file.nbytes < INDEX.size + 8:
        raise ValueError(f"a tiled chunk of {file.nbytes} bytes is too short to hold its index")
    offset, nbytes = INDEX.unpack_from(file, file.nbytes - INDEX.size)
    if offset < 8 or offset + nbytes > file.nbytes - INDEX.size:
        raise ValueError(f"a tiled chunk's index ({offset}, {nbytes}) points outside its {file.nbytes} bytes")
    return file[offset:offset + nbytes]


def logical(file: np.ndarray | memoryview | bytes, shape: tuple[int, ...], out: np.ndarray | None = None) -> np.ndarray:
    """The target's bf16 bits in rows (uint16, `shape`), from a tiled chunk's bytes, into `out` when given."""
    return tensorbin.untilize(bf16_payload(file), tuple(shape), out)


def device_end(file: np.ndarray) -> int:
    """Where ttnn's `.tensorbin` ends in a tiled chunk: after the bf16 payload for bfloat16, before it otherwise."""
    file = file.reshape(-1).view(np.uint8)
    offset, nbytes = INDEX.unpack_from(file, file.nbytes - INDEX.size)
    return offset + nbytes if offset == _header_end(file) else offset


_SCRATCH = "/dev/shm" if os.path.isdir("/dev/shm") else None  # memory-backed: the copy is only a hand-over


def _load_in_place(path: str, device=None):
    return ttnn_module()._ttnn.tensor.load_tensor_flatbuffer(path, device)


def _learn_in_place() -> bool:
    """Does this ttnn load a tiled chunk where it lies (no `.tensorbin` name, bytes after the payload) as the
    tensor its `.tensorbin` holds? Asked with one small file of each device dtype a cache stores."""
    rng = np.random.default_rng(71)
    probe = (rng.standard_normal((37, 70)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    ttnn = ttnn_module()
    with tempfile.TemporaryDirectory(dir=_SCRATCH) as tmp:
        for dtype in ("bfloat16", "bfloat8_b"):
            made = tiled_file(probe, dtype)
            if made is None:
                return False
            chunk, plain = os.path.join(tmp, "c.0.0"), os.path.join(tmp, f"{dtype}.tensorbin")
            made[0].tofile(chunk)
            made[0][:device_end(made[0])].tofile(plain)
            try:
                ours, theirs = _load_in_place(chunk), ttnn.load_tensor(plain)
            except (AttributeError, RuntimeError, TypeError, ValueError):
                return False
            if tuple(ours.padded_shape) != tuple(theirs.padded_shape) or ours.dtype != theirs.dtype or \
                    not bool((ttnn.to_torch(ours) == ttnn.to_torch(theirs)).all()):
                return False
    return True


def ttnn_reads_in_place() -> bool:
    """Whether ttnn loads a tiled chunk as it lies in the cache (checked once per installation)."""
    return tensorbin.learned("tiled chunks load in place", _learn_in_place)


def device_tensor(path: str, device=None):
    """A tiled chunk (checked already) as ttnn's tensor, on the host or on `device`: mapped where it lies, or,
    where this ttnn does not read it so, from a scratch `.tensorbin` of its first bytes."""
    if ttnn_reads_in_place():
        return _load_in_place(str(path), device)
    file = np.fromfile(path, np.uint8)
    with tempfile.NamedTemporaryFile(suffix=".tensorbin", dir=_SCRATCH) as fh:
        fh.write(memoryview(file[:device_end(file)]))
        fh.flush()
        return ttnn_module().load_tensor(fh.name, device=device)
