"""tasks/numerics/kernels.c through ctypes: ttnn's TILE layout (bfloat16, bfloat8_b), the 2-D transpose and the float32 ->
bfloat16 rounding, one pass each (ctypes lets go of the GIL, so the graph's two threads run them side by side).

Built on first use with the system C compiler, for this CPU, into a file named by the source, flags and CPU (so an
edited source or another machine never gets a stale build); `make` builds it up front. Without a compiler,
`available()` is False and the callers keep their numpy paths, which give the same bytes (tests/test_tensorbin.py
holds both to ttnn); GR00T_TT_KERNELS=0 chooses them on purpose.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

import ml_dtypes
import numpy as np

SOURCE = Path(__file__).with_name("kernels.c")
_BF16_BITS = (np.dtype(np.uint16), np.dtype(ml_dtypes.bfloat16))  # the only element type the C loops take
_I64, _PTR = ctypes.c_int64, ctypes.c_void_p


FLAGS = ["-O3", "-march=native", "-shared", "-fPIC"]  # built on the machine that runs it, for its own CPU


def _cpu() -> bytes:
    """What `-march=native` compiles for: the CPU's model and feature flags."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return b""
    return "\n".join(sorted({l for l in lines if l.startswith(("model name", "flags"))})).encode()


def _library_name() -> str:
    """Named by the source, the flags and the CPU: an edited source or another machine never gets a stale build."""
    return f"_kernels-{hashlib.sha256(SOURCE.read_bytes() + ' '.join(FLAGS).encode() + _cpu()).hexdigest()[:16]}.so"


def homes() -> list[Path]:
    """Where per-machine build products go: beside the source (a checkout), else the user's cache (an installed
    package may sit read-only)."""
    return [SOURCE.parent, Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gr00t-tt"]


def keep_in_home(name: str, write: Callable[[Path], None], stale: str) -> Path | None:
    """Write the per-machine file `name` with `write(path)` into the first home that takes it, and remove that home's
    older files matching `stale` (another source, CPU or ttnn); None when no home is writable."""
    for home in homes():
        try:
            home.mkdir(parents=True, exist_ok=True)
            write(home / name)
        except OSError:
            continue  # not writable here: try the next home
        for old in home.glob(stale):
            if old.name != name:
                old.unlink(missing_ok=True)
        return home / name
    return None


class BuildFailed(RuntimeError):
    """kernels.c did not compile with a compiler that is there: a bug to report, not a machine without one."""


def _compile(cc: str, out: Path) -> None:
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:  # build beside, then rename: never a torn .so
        built = Path(tmp) / out.name
        proc = subprocess.run([cc, *FLAGS, "-o", str(built), str(SOURCE), "-lm"], capture_output=True, text=True)
        if proc.returncode:
            first = next((line for line in proc.stderr.splitlines() if "error" in line), proc.stderr.strip()[:300])
            raise BuildFailed(f"{SOURCE} does not compile with {cc} ({first.strip()}); the numpy packers are used "
                              "instead (the same bytes, slower)")
        os.replace(built, out)


def build() -> Path | None:
    """Compile kernels.c unless this exact source is already built for this CPU; None without a C compiler. A
    compiler that fails is said once on stderr (never a silent fall back to numpy)."""
    name = _library_name()
    for home in homes():
        if (home / name).exists():
            return home / name
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    try:
        return keep_in_home(name, lambda path: _compile(cc, path), "_kernels-*.so")
    except BuildFailed as e:
        print(f"warning: {e}", file=sys.stderr)
        return None


@functools.cache
def _lib() -> ctypes.CDLL | None:
    path = build()
    return None if path is None else bind(ctypes.CDLL(str(path)))


def bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Declare the kernels' signatures on a loaded build (this one, or a sanitizer build under test)."""
    lib.tilize_bf16.argtypes = [_PTR, _I64, _I64, _I64, _PTR]
    lib.untilize_bf16.argtypes = [_PTR, _I64, _I64, _I64, _PTR]
    lib.pack_bfp8.argtypes = [_PTR, _I64, _I64, _I64, _PTR, _PTR, _PTR]
    lib.transpose_u16.argtypes = [_PTR, _I64, _I64, _I64, _PTR, _I64]
    for fn in (lib.tilize_bf16, lib.untilize_bf16, lib.pack_bfp8, lib.transpose_u16):
        fn.restype = None
    lib.round_f32_bf16.argtypes = [_PTR, _I64, _PTR, ctypes.c_uint16]
    lib.round_f32_bf16.restype = _I64
    return lib


def available() -> bool:
    """Whether the C kernels are in use: built here, and not switched off with GR00T_TT_KERNELS=0 (which measures
    or bisects the numpy packers; the bytes are the same)."""
    return os.environ.get("GR00T_TT_KERNELS") != "0" and _lib() is not None


def _rows(matrix: np.ndarray) -> tuple[int, int, int]:
    """(rows, cols, row stride in elements) of a 2-D array of bf16 bits whose rows are contiguous: the one shape the
    C loops read. Anything else is refused here, before a pointer crosses into C."""
    if matrix.dtype not in _BF16_BITS or matrix.ndim != 2:
        raise ValueError(f"expected a 2-D array of bf16 bits, got {matrix.dtype} {matrix.shape}")
    rows, cols = matrix.shape
    if (cols > 1 and matrix.strides[1] != 2) or (rows > 1 and (matrix.strides[0] < 2 * cols or matrix.strides[0] % 2)):
        raise ValueError(f"expected rows of contiguous 16-bit values, got {matrix.shape} strides {matrix.strides}")
    return rows, cols, (matrix.strides[0] // 2 if rows > 1 else cols)


def _aligned(array: np.ndarray, what: str, size: int | None = None) -> None:
    """C writes an element at an address that is a multiple of its `size` (default the array's item size; UBSan's
    "misaligned address" otherwise): an output that starts mid-element (`buf[1:].view(np.uint16)`) is refused."""
    if not _is_aligned(array, size):
        raise ValueError(f"{what} starts at an address that is not a multiple of its {size or array.dtype.itemsize}"
                         "-byte elements; pass an aligned buffer (np.empty gives one)")


def _is_aligned(array: np.ndarray, size: int | None = None) -> bool:
    return array.ctypes.data % (size or array.dtype.itemsize) == 0


def _readable(array: np.ndarray) -> np.ndarray:
    """An input C may read: itself, or an aligned copy of one that starts mid-element (a Dask worker's unpickled
    buffer can: seen with the processes scheduler)."""
    return array if _is_aligned(array) else array.copy()


def _output(out: np.ndarray, nbytes: int, what: str, element: int | None = None) -> None:
    """`out` is a writable, contiguous buffer, aligned for the `element`-byte values C writes (default its own item
    size), that holds at least `nbytes`: C writes exactly that many."""
    if not (isinstance(out, np.ndarray) and out.flags.c_contiguous and out.flags.writeable):
        raise ValueError(f"{what}: the output must be a writable contiguous numpy buffer")
    _aligned(out, f"{what}: the output", element)
    if out.nbytes < nbytes:
        raise ValueError(f"{what}: the output holds {out.nbytes} bytes, the result needs {nbytes}")


def _tiles(rows: int, cols: int) -> int:
    return -(-rows // 32) * -(-cols // 32)


def tilize_bf16(matrix: np.ndarray, out: np.ndarray) -> None:
    """`out` (uint8, tiles * 2048 bytes) = the bfloat16 TILE buffer of one [rows, cols] matrix of bf16 bits."""
    matrix = _readable(matrix)
    rows, cols, stride = _rows(matrix)
    _output(out, _tiles(rows, cols) * 2048, "tilize_bf16", element=2)  # C writes bf16 values
    _lib().tilize_bf16(matrix.ctypes.data, rows, cols, stride, out.ctypes.data)


def untilize_bf16(payload: np.ndarray, out: np.ndarray) -> None:
    """`out` (a [rows, cols] matrix of bf16 bits, rows contiguous) = the logical matrix of one bfloat16 TILE buffer
    (uint8, tiles * 2048 bytes), its padding dropped: `tilize_bf16` backwards."""
    rows, cols, stride = _rows(out)
    _aligned(out, "untilize_bf16: the output")
    if not out.flags.writeable:
        raise ValueError("untilize_bf16: the output is read-only")
    if payload.dtype != np.uint8 or not payload.flags.c_contiguous or payload.nbytes < _tiles(rows, cols) * 2048:
        raise ValueError(f"untilize_bf16: the buffer must be contiguous uint8 of {_tiles(rows, cols) * 2048} bytes, "
                         f"got {payload.dtype} x {payload.size}")
    if not _is_aligned(payload, 2):
        payload = payload.copy()
    _lib().untilize_bf16(payload.ctypes.data, rows, cols, stride, out.ctypes.data)


def pack_bfp8(matrix: np.ndarray, out: np.ndarray, sums: np.ndarray, worst: np.ndarray) -> None:
    """`out` (uint8, tiles * 1088 bytes) = the bfloat8_b TILE buffer of one matrix; `sums` (float64[5]) and
    `worst` (float32[1]) accumulate the numerics of its read-back values (finite input: convert checks first)."""
    matrix = _readable(matrix)
    rows, cols, stride = _rows(matrix)
    _output(out, _tiles(rows, cols) * 1088, "pack_bfp8")
    if sums.dtype != np.float64 or sums.size < 5 or worst.dtype != np.float32 or worst.size < 1:
        raise ValueError("pack_bfp8: sums must be float64[5] and worst float32[1]")
    _output(sums, 40, "pack_bfp8 sums")
    _output(worst, 4, "pack_bfp8 worst")
    _lib().pack_bfp8(matrix.ctypes.data, rows, cols, stride, out.ctypes.data, sums.ctypes.data, worst.ctypes.data)


def transpose_into(out: np.ndarray, x: np.ndarray) -> None:
    """`out[:] = x.T` for 2-D arrays of bf16 bits with contiguous rows (`out` may be a column slice of a wider array)."""
    x = _readable(x)
    rows, cols, stride = _rows(x)
    out_rows, out_cols, out_stride = _rows(out)
    _aligned(out, "transpose_into: the output")
    if (out_rows, out_cols) != (cols, rows):
        raise ValueError(f"transpose of {x.shape} does not fit {out.shape}")
    if not out.flags.writeable:
        raise ValueError("transpose_into: the output is read-only")
    _lib().transpose_u16(x.ctypes.data, rows, cols, stride, out.ctypes.data, out_stride)


def round_f32_bf16(wide: np.ndarray, out: np.ndarray, nan: int) -> int:
    """`out` (bf16 bits, as many values) = `wide` (contiguous float32) rounded as `.to(torch.bfloat16)` rounds, every
    NaN written as `nan`; the flat index of the first finite value that rounds to ±Inf, or -1."""
    if wide.dtype != np.float32 or not wide.flags.c_contiguous:
        raise ValueError(f"round_f32_bf16: expected contiguous float32, got {wide.dtype}")
    wide = _readable(wide)
    if not isinstance(nan, (int, np.integer)) or not 0 <= nan <= 0xFFFF:  # ctypes would keep the low 16 bits silently
        raise ValueError(f"round_f32_bf16: nan must be a 16-bit pattern (0..0xffff), got {nan!r}")
    if out.dtype not in _BF16_BITS:
        raise ValueError(f"round_f32_bf16: the output must hold bf16 bits, got {out.dtype}")
    _output(out, wide.size * 2, "round_f32_bf16")
    return int(_lib().round_f32_bf16(wide.ctypes.data, wide.size, out.ctypes.data, nan))
