"""ttnn's `.tensorbin` of a TILE host tensor, made in numpy: bfloat16 tilized, or bfloat8_b packed, plus the values
ttnn would hand back (`to_torch`) for the numerics check. No ttnn on the hot path; ttnn only to take the header.

Format (ttnn 0.81.1, ../shared/reference/bfp8-format.md): a little-endian u64 header size N, an N-byte flatbuffer
header that, for a given rank, differs only in the logical shape and the payload size, then the host buffer.
The buffer is the tensor zero-padded to multiples of 32 in its last two dims, cut into 32x32 tiles (row-major over
the leading dims, tile rows, tile columns), each tile as four 16x16 faces (top-left, top-right, bottom-left,
bottom-right), each face row-major.
- bfloat16: a face is its 256 bf16 values.
- bfloat8_b: per tile, 64 exponent bytes (the 16 rows of face 0, then faces 1-3), then 1024 codes (the faces in
  the same order, row-major). A face row of 16 shares the largest float32 exponent field E among its values;
  each code is sign << 7 | magnitude, where the magnitude is the 24-bit significand shifted right by E - e (the
  bits shifted out are lost), rounded to 7 bits to nearest-even and saturated at 127; exponent field 0 gives 0,
  and a zero magnitude drops its sign. A code reads back as magnitude * 2**(E - 133).

The header is taken from ttnn itself (one tiny `dump_tensor` per rank), patched for the shape and size, and the
whole file is checked once per rank and dtype against `dump_tensor` of a test tensor, once per ttnn installation
(`_Headers`); when they differ (another ttnn), `header_for` gives None and the caller uses ttnn's own path.
Measured: see `pack` below.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import math
import mmap
import struct
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from tasks.numerics import kernels
from tasks.io.bulk_write import aligned_empty, write_bytes_atomic
from tasks.device.ttnn_edge import packed_bytes, padded_shape, pcc_from_sums, to_host_tensor, ttnn_module  # ttnn itself stays lazy there
from tasks.numerics.precision import bf16_bits

TILE, FACE = 32, 16
_BLOCK_ELEMENTS = 1 << 18  # per numpy pass (whole tile rows): temporaries stay in cache whatever the tensor


def _faces(bits: np.ndarray) -> np.ndarray:
    """[rows, cols] (multiples of 32) -> [tiles, 4 faces, 16, 16] in ttnn's tile order (a copy)."""
    rows, cols = bits.shape
    t = bits.reshape(rows // TILE, 2, FACE, cols // TILE, 2, FACE)  # tile row, face row, r, tile col, face col, c
    return np.ascontiguousarray(t.transpose(0, 3, 1, 4, 2, 5)).reshape(-1, 4, FACE, FACE)


def _blocks(bits: np.ndarray):
    """The tensor as 2-D [rows, cols] padded blocks of whole tile rows (about _BLOCK_ELEMENTS values), in payload order."""
    shape = padded_shape(bits.shape, "TILE")
    flat = bits.reshape(-1, bits.shape[-1]) if bits.ndim > 1 else bits.reshape(1, -1)
    rows_per_matrix, cols = (bits.shape[-2] if bits.ndim > 1 else 1), bits.shape[-1]
    step = TILE * max(1, _BLOCK_ELEMENTS // (TILE * shape[-1]))
    for m in range(flat.shape[0] // rows_per_matrix):
        matrix = flat[m * rows_per_matrix:(m + 1) * rows_per_matrix]
        for r0 in range(0, shape[-2], step):
            r1 = min(r0 + step, shape[-2])
            if r1 <= rows_per_matrix and cols == shape[-1]:  # nothing to pad: _faces copies it anyway
                yield matrix[r0:r1]
                continue
            block = np.zeros((r1 - r0, shape[-1]), np.uint16)
            src = matrix[r0:min(r1, rows_per_matrix)]
            block[:src.shape[0], :cols] = src
            yield block


TILE_BYTES = {"bfloat16": 2 * TILE * TILE, "bfloat8_b": 64 + TILE * TILE}


def payload_size(shape: tuple[int, ...], dtype: str) -> int:
    p = padded_shape(shape, "TILE")
    return int(np.prod(p[:-2], dtype=np.int64)) * (p[-2] // TILE) * (p[-1] // TILE) * TILE_BYTES[dtype]


@dataclass
class Packed:
    payload: np.ndarray   # uint8: the host buffer ttnn would hold
    max_abs_err: float    # of the values ttnn reads back, against the bf16 source
    pcc: float


def _reference_codes(bits: np.ndarray, gap: np.ndarray) -> np.ndarray:
    """The rule, spelled out: codes of bf16 `bits` whose face row's shared exponent is `gap` above their own.

    In bf16 the 24-bit significand is the 8-bit one followed by 16 zeros, so shifting right by `gap` and rounding
    away 17 bits is rounding away gap + 1 bits of the 8-bit significand; past 8 nothing is left and nothing
    rounds up. Exponent field 0 gives 0, a zero magnitude drops its sign."""
    exp = (bits >> 7) & 0xFF
    significand = np.where(exp > 0, (bits & 0x7F) | 0x80, 0).astype(np.uint16)
    drop = np.minimum(gap + 1, 9).astype(np.uint16)
    kept = significand >> drop
    rest = significand & ((np.uint16(1) << drop) - np.uint16(1))
    half = np.uint16(1) << (drop - np.uint16(1))
    up = (rest > half) | ((rest == half) & (kept & 1).astype(bool))          # to nearest, ties to even
    magnitude = np.minimum(kept + up, 127).astype(np.uint8)                  # saturated, never carried
    return magnitude | (((bits >> 8) & 0x80).astype(np.uint8) * (magnitude > 0))


def _decoded(codes: np.ndarray, shared: np.ndarray) -> np.ndarray:
    """The float32 values ttnn reads back for bfloat8_b codes: magnitude * 2**(E - 133), signed; in a row whose
    shared exponent is 255 (it held an Inf or NaN) a full-width magnitude is Inf if it is exactly 64, else NaN."""
    magnitude, shared = (codes & 0x7F), shared.astype(np.int32)
    with np.errstate(over="ignore"):
        values = np.ldexp(magnitude.astype(np.float32), shared - 133).astype(np.float32)
    values = np.where((shared == 255) & (magnitude > 64), np.float32(np.nan), values)
    return np.where(codes & 0x80, -values, values)


_GAPS = 9  # a gap of 8 or more leaves nothing: one table row serves them all


@functools.cache
def _tables() -> tuple[np.ndarray, np.ndarray]:
    """Every (gap, bf16 pattern) -> its code and the float32 value it reads back as: packing is two gathers."""
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    codes = np.stack([_reference_codes(bits, np.full(bits.shape, g, np.uint16)) for g in range(_GAPS)])
    shared = ((bits >> 7) & 0xFF).astype(np.int32)[None, :] + np.arange(_GAPS, dtype=np.int32)[:, None]
    return codes.reshape(-1), _decoded(codes, shared).reshape(-1)


def _bfp8_block(faces: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Pack [tiles, 4, 16, 16] bf16 bits into `out` ([tiles, 1088] uint8); returns the read-back float32 values."""
    codes, values = _tables()
    exp7 = faces & 0x7F80                                                    # exponent field, left in place
    shared7 = exp7.max(axis=-1, keepdims=True)                               # per face row of 16
    gap = np.minimum((shared7 - exp7) >> 7, _GAPS - 1).astype(np.uint32)
    index = (gap << 16) | faces
    tiles = faces.shape[0]
    out[:, :64] = (shared7 >> 7).reshape(tiles, 64)
    out[:, 64:] = codes.take(index.reshape(tiles, 1024))
    return values.take(index)


def pack(array: np.ndarray, dtype: str, out: np.ndarray | None = None) -> Packed:
    """The TILE host buffer of a bf16 array (numpy bfloat16 or its uint16 bits) in `dtype`, written into `out`
    (or a new buffer), and the numerics of the values it reads back as. bfloat16 is a relayout (exact);
    bfloat8_b's read-back values are measured in the same pass, without a round trip through ttnn."""
    if dtype not in TILE_BYTES:
        raise ValueError(f"no numpy packer for {dtype}")
    bits = bf16_bits(array, "pack")  # a wider source is rounded when it is read, never here
    size = payload_size(bits.shape, dtype)
    out = np.empty(size, np.uint8) if out is None else out
    if out.dtype != np.uint8 or out.size < size:
        raise ValueError(f"pack needs a uint8 buffer of {size} bytes, got {out.dtype} x {out.size}")
    if kernels.available():
        return _pack_c(bits, dtype, out)
    pos, sums, worst = 0, np.zeros(5), 0.0
    for block in _blocks(bits):
        faces = _faces(block)                                        # [tiles, 4, 16, 16] bf16 bits
        n = faces.shape[0] * TILE_BYTES[dtype]
        view = out[pos:pos + n].reshape(faces.shape[0], -1)
        pos += n
        if dtype == "bfloat16":
            view.view(np.uint16)[:] = faces.reshape(faces.shape[0], -1)
            continue
        back = _bfp8_block(faces, view).reshape(-1)
        ref = (faces.astype(np.uint32) << 16).view(np.float32).reshape(-1)
        worst = max(worst, float(np.abs(back - ref).max(initial=0.0)))
        # float64 dot products: float32 ones were 1e-6 off the exact PCC on CPUs without AVX-512 (and overflow)
        b64, r64 = back.astype(np.float64), ref.astype(np.float64)
        block_sums = np.array([b64.sum(), r64.sum(), b64 @ b64, r64 @ r64, b64 @ r64])
        sums += block_sums
    if dtype == "bfloat16":
        return Packed(out, 0.0, 1.0)
    # padding is zero on both sides, so sums over the padded tiles equal sums over the tensor itself
    return Packed(out, worst, pcc_from_sums(sums, max(1, bits.size)))


def _pack_c(bits: np.ndarray, dtype: str, out: np.ndarray) -> Packed:
    """`pack` through tasks/numerics/kernels.c, matrix by matrix: the same bytes in one pass (about 10x numpy's bfloat8_b
    here), and the numerics accumulated in float64."""
    matrices = bits.reshape(-1, bits.shape[-2], bits.shape[-1]) if bits.ndim > 1 else bits.reshape(1, 1, -1)
    step = payload_size(matrices.shape[1:], dtype)
    sums, worst = np.zeros(5), np.zeros(1, np.float32)
    for i, matrix in enumerate(matrices):
        view = out[i * step:(i + 1) * step]
        if dtype == "bfloat16":
            kernels.tilize_bf16(matrix, view)
        else:
            kernels.pack_bfp8(matrix, view, sums, worst)
    if dtype == "bfloat16":
        return Packed(out, 0.0, 1.0)
    return Packed(out, float(worst[0]), pcc_from_sums(sums, max(1, bits.size)))


_HUGE = 2 << 20  # a transparent huge page: where the kernel gives them on request (madvise), one fault per 2 MiB


def _fresh(shape: tuple[int, ...]) -> np.ndarray:
    """A new uint16 array for untilized values, asking for huge pages when it spans several: every page of it is
    written at once, and on this VM first-touch faults of 4 KiB pages made untilizing into fresh memory half as
    fast (2.25 against 4-4.5 GB/s for a 100 MB matrix)."""
    nbytes = math.prod(shape) * 2
    if nbytes < 4 * _HUGE or not hasattr(mmap, "MADV_HUGEPAGE"):
        return np.empty(shape, np.uint16)
    memory = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    memory.madvise(mmap.MADV_HUGEPAGE)
    return np.frombuffer(memory, np.uint16).reshape(shape)


def untilize(payload: np.ndarray, shape: tuple[int, ...], out: np.ndarray | None = None) -> np.ndarray:
    """The logical bf16 bits (uint16, `shape`) of a bfloat16 TILE buffer (`pack` backwards), written into `out` when
    given (a contiguous uint16 array of `shape`): what `ttnn.to_torch` of the tensor holds. (Plain integer
    arithmetic: a load untilizes every chunk, a thousand of them for a tiny N1.6.)"""
    if len(shape) < 2:
        raise ValueError(f"a TILE buffer of rank {len(shape)}: untilize takes rank 2 or more")
    rows, cols = -(-shape[-2] // TILE) * TILE, -(-shape[-1] // TILE) * TILE
    step = rows * cols * 2  # bytes of one padded matrix
    matrices = math.prod(shape[:-2])
    payload = payload.reshape(-1).view(np.uint8)
    if payload.nbytes < step * matrices:
        raise ValueError(f"a bfloat16 TILE buffer of {tuple(shape)} needs {step * matrices} bytes, got {payload.nbytes}")
    out = _fresh(shape) if out is None else out
    in_rows = out.reshape(matrices, shape[-2], shape[-1])
    fast = kernels.available()
    for i in range(matrices):
        view = payload[i * step:(i + 1) * step]
        if fast:
            kernels.untilize_bf16(view, in_rows[i])
            continue
        grid = view.view(np.uint16).reshape(rows // TILE, cols // TILE, 2, 2, FACE, FACE)
        in_rows[i] = grid.transpose(0, 2, 4, 1, 3, 5).reshape(rows, cols)[:shape[-2], :shape[-1]]
    return out


def unpack_bfp8(payload: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The logical float32 values of a bfloat8_b TILE buffer (what `ttnn.to_torch` returns); for checks."""
    p = padded_shape(shape, "TILE")
    tiles = payload.reshape(-1, TILE_BYTES["bfloat8_b"])
    shared = tiles[:, :64].reshape(-1, 4, FACE, 1).astype(np.int32)
    values = _decoded(tiles[:, 64:].reshape(-1, 4, FACE, FACE), shared)
    lead, th, tw = int(np.prod(p[:-2], dtype=np.int64)), p[-2] // TILE, p[-1] // TILE
    grid = values.reshape(lead, th, tw, 2, 2, FACE, FACE).transpose(0, 1, 3, 5, 2, 4, 6).reshape(lead, p[-2], p[-1])
    full = (1, *shape) if len(shape) == 1 else shape
    return np.ascontiguousarray(grid[:, :full[-2], :full[-1]]).reshape(shape)


class _Headers:
    """Per (rank, dtype): ttnn's header with the positions of the shape and payload size, checked against ttnn
    once per ttnn installation. Checking imports ttnn (~1.8 s of one core here, ~0.5 GB of RSS with torch), so
    what was learned is kept beside this file, named by ttnn's version, the size and mtime of its library and
    this file's and the C packer's source (like tasks/numerics/kernels.py's library): a convert that makes every device
    file itself then never imports ttnn, and another ttnn, or another packer, is checked again."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # learning a fact may need a header (the same thread asks again)
        self._known: dict = {}  # (rank, dtype) -> header template or None; a fact's name -> what was found
        self._loaded = False

    def _learn(self, rank: int, dtype: str) -> tuple[bytes, int, int] | None:
        rng = np.random.default_rng(rank)
        probe_shape = (1,) * (rank - 2) + (37, 70) if rank >= 2 else (70,)
        probe = (rng.standard_normal(probe_shape).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        blob = packed_bytes(to_host_tensor(probe, dtype, "TILE"))
        size = struct.unpack_from("<Q", blob)[0]
        header = blob[8:8 + size]
        payload = pack(probe, dtype).payload
        if blob[8 + size:] != payload.tobytes():
            return None
        shape_at = header.find(struct.pack(f"<{len(probe_shape)}I", *probe_shape))
        size_at = header.find(struct.pack("<Q", payload.nbytes))
        if shape_at < 0 or size_at < 0:
            return None
        template = (header, shape_at, size_at)
        check_shape = (1,) * (rank - 2) + (64, 33) if rank >= 2 else (33,)
        check = (rng.standard_normal(check_shape).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        return template if _assemble(template, check.shape, pack(check, dtype).payload) == packed_bytes(to_host_tensor(check, dtype, "TILE")) else None

    def get(self, rank: int, dtype: str) -> tuple[bytes, int, int] | None:
        return self._kept((rank, dtype), lambda: self._learn(rank, dtype))

    def fact(self, name: str, learn: Callable[[], bool]) -> bool:
        """Another behaviour of this ttnn a reader relies on, learned once per installation as the headers are."""
        return bool(self._kept(name, learn))

    def _kept(self, key, learn: Callable[[], object]):
        with self._lock:
            if not self._loaded:
                self._known.update(_read_learned())
                self._loaded = True
            if key not in self._known:
                self._known[key] = learn()
                _write_learned(self._known)
            return self._known[key]


def _learned_name() -> str | None:
    """The file this ttnn's checked headers are kept in (None without ttnn). Finding ttnn does not import it."""
    spec = importlib.util.find_spec("ttnn")
    if spec is None or not spec.submodule_search_locations:
        return None
    libraries = sorted(Path(spec.submodule_search_locations[0]).glob("_ttnn*.so"))
    identity = [importlib.metadata.version("ttnn")] + [f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}"
                                                       for p in libraries]
    digest = hashlib.sha256(json.dumps(identity).encode() + Path(__file__).read_bytes() + kernels.SOURCE.read_bytes())
    return f"_ttnn-headers-{digest.hexdigest()[:16]}.json"


_FACT = "fact:"  # a learned fact's key in the kept file; a header's is "<rank>:<dtype>"


def _read_learned() -> dict:
    try:
        name = _learned_name()
    except (OSError, importlib.metadata.PackageNotFoundError):
        return {}
    for home in kernels.homes() if name else ():
        try:
            doc = json.loads((home / name).read_text())
            return {key[len(_FACT):] if key.startswith(_FACT) else (int(key.split(":")[0]), key.split(":")[1]):
                    v if key.startswith(_FACT) or v is None else (bytes.fromhex(v[0]), v[1], v[2])
                    for key, v in doc.items()}
        except (OSError, ValueError, TypeError, IndexError):  # unreadable or damaged: learned again, and kept again
            continue
    return {}


def _write_learned(known: dict) -> None:
    doc = {f"{_FACT}{key}" if isinstance(key, str) else f"{key[0]}:{key[1]}":
           value if isinstance(key, str) or value is None else [value[0].hex(), value[1], value[2]]
           for key, value in known.items()}
    try:
        name = _learned_name()
    except (OSError, importlib.metadata.PackageNotFoundError):
        return
    if name:  # (no home writable: the next process checks again)
        kernels.keep_in_home(name, lambda path: write_bytes_atomic(path, json.dumps(doc, indent=1, sort_keys=True).encode()),
                             "_ttnn-headers-*.json")


_HEADERS = _Headers()


def check_formats() -> str:
    """Check the headers the GR00T layouts need (2-D weights, 3-D position tables; bfloat16 and bfloat8_b) now, so
    that no convert imports ttnn for them; `make` runs this once per install. Returns a line for the log."""
    checked = [f"{rank}-D {dtype}" for rank in (2, 3) for dtype in ("bfloat16", "bfloat8_b")
               if header_for(rank, dtype) is not None]
    return ", ".join(checked) or "none match this ttnn: converts use ttnn's own path"


def header_for(rank: int, dtype: str) -> tuple[bytes, int, int] | None:
    """ttnn's `.tensorbin` header template for this rank and dtype, checked against ttnn once per install (None
    when this ttnn writes another format: then ttnn's own path is used)."""
    return _HEADERS.get(rank, dtype) if dtype in TILE_BYTES and rank >= 2 else None


def _header(template: tuple[bytes, int, int], shape: tuple[int, ...], nbytes: int) -> bytes:
    header, shape_at, size_at = bytearray(template[0]), template[1], template[2]
    struct.pack_into(f"<{len(shape)}I", header, shape_at, *shape)
    struct.pack_into("<Q", header, size_at, nbytes)
    return struct.pack("<Q", len(header)) + bytes(header)


def _assemble(template: tuple[bytes, int, int], shape: tuple[int, ...], payload: np.ndarray) -> bytes:
    return _header(template, shape, payload.nbytes) + payload.tobytes()


def tensorbin(array: np.ndarray, dtype: str, spare: int = 0) -> tuple[np.ndarray, Packed] | None:
    """The `.tensorbin` bytes `ttnn.dump_tensor` writes for this bf16 array in `dtype`, TILE (one buffer, header
    then payload), and its numerics; None when this ttnn's format is not the one checked (then use ttnn).
    `spare`: bytes left (unwritten) at the end of the buffer, for what a cache file keeps after the payload."""
    if dtype not in TILE_BYTES or array.ndim < 2:
        return None
    template = header_for(array.ndim, dtype)
    if template is None:
        return None
    size = payload_size(array.shape, dtype)
    head = _header(template, tuple(array.shape), size)
    out = aligned_empty(len(head) + size + spare, np.uint8)  # written to the cache without a bounce copy
    out[:len(head)] = np.frombuffer(head, np.uint8)
    packed = pack(array, dtype, out[len(head):len(head) + size])
    return out, packed


_SCRATCH = Path("/dev/shm") if Path("/dev/shm").is_dir() else None  # memory-backed: the file is only a hand-over


def host_tensor(array: np.ndarray, dtype: str, layout: str):
    """A ttnn host tensor of a bf16 array in `dtype`/`layout`: for TILE, our `.tensorbin` (tasks/numerics/kernels.c, or
    numpy) handed to `ttnn.load_tensor` through a memory-backed file; else ttnn's own conversion.
    `ttnn.from_torch` of the bf16 values tilizes faster in isolation (6.6-6.9 GB/s against 1.4 on a 2048x6144
    matrix) but a whole bf16-plan reload then peaked at 12.2 GB RSS against 7.4 (full N1.6, one embodiment, no
    faster end to end on this VM), so it is not used."""
    made = tensorbin(array, dtype) if layout == "TILE" else None
    if made is None:
        return to_host_tensor(array, dtype, layout)
    with tempfile.NamedTemporaryFile(suffix=".tensorbin", dir=_SCRATCH) as fh:
        fh.write(memoryview(made[0]))
        fh.flush()
        return ttnn_module().load_tensor(fh.name)


def learned(fact: str, learn: Callable[[], bool]) -> bool:
    """Whether this ttnn behaves so (`learn()` asks it), found out once per installation and kept with the headers."""
    return _HEADERS.fact(fact, learn)
