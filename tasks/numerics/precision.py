"""Source precision: what each safetensors dtype of a checkpoint becomes in the cache. Pure numpy; no I/O.

GR00T releases are BF16 throughout; fine-tunes are not (Isaac-GR00T keeps the action head in F32, some exports
store F16). The consumer decides what a source becomes, so this module does what the tt-metal N1.6 port does
(../shared/reference/fine-tunes.md):
- a device weight is `.to(torch.bfloat16)` of the source (`tt/ttnn_common.py:26`): round to nearest even, then
  packed or tilized. `to_bf16` is that rounding, bit for bit (tests/test_precision.py holds it to torch);
- a host table (q_norm, k_norm, embed_tokens) is `.to(torch.float32)` of the source (`tt/ttnn_qwen3.py:143`), and
  the cache stores exactly that float32 (widening BF16 or F16 is exact; F32 keeps its bits): the port takes the
  mapped file as it is, with no widening at every start (embed_tokens, 622 MB as bf16: widened as read 0.63 s
  and 1.24 CPU-s; its float32 file mapped and checked 0.18-0.20 s, one core).

Any other dtype is refused by name before anything is read, and so is a value that the rounding would turn into
±Inf (finite in the file, infinite on the device). NaN and Inf already in the file are refused by the convert
stage's finite check, as for BF16.

This module is the rule's one room: `kept_as_stored` says which sources are the cache's bytes as they are,
`convert_block` turns any other block into what the cache stores, and `bf16_bits` is what every later step
(the finite check, the packers, ttnn) takes, refusing any array that is not bf16 rather than reading its bits as
bf16. tasks/source/shards.py only reads bytes and asks this module what they become.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from tasks.numerics import kernels
from tasks.errors import CheckpointError

FLOAT_SOURCES = ("BF16", "F16", "F32")  # what a GR00T weight may be stored as


def source_dtypes(recorded, count: int) -> list[str]:
    """Each of `count` sources' safetensors dtype as recorded; none recorded means BF16, as every release (plans of
    a bf16 checkpoint, entries before cache format 5)."""
    return list(recorded or ["BF16"] * count)
BF16, F32 = "bfloat16", "float32"       # what the cache stores (an array's `attributes.dtype`)
_BF16_MAX = float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)


def check_dtype(path: object, key: str, dtype: str) -> None:
    """A source key's safetensors dtype must be one a GR00T weight can have."""
    if dtype not in FLOAT_SOURCES:
        raise CheckpointError(path, f"dtype {dtype} is not a weight dtype (GR00T weights are {', '.join(FLOAT_SOURCES)}); "
                                    "the checkpoint was saved wrongly or this tensor is not a model weight", key)


def stored_dtype(host: bool) -> str:
    """What the cache stores a target as: bf16, except a host table (float32, as the port keeps it)."""
    return F32 if host else BF16


def kept_as_stored(source_dtype: str, host: bool) -> bool:
    """Whether a source of this safetensors dtype is already what the cache stores: BF16 for a device weight, F32
    for a host table. Such bytes are read straight into their target; every other source goes through
    `convert_block`."""
    return source_dtype == ("F32" if host else "BF16")


def convert_block(block: np.ndarray, out: np.ndarray, host: bool, key: str, origin: object, first: int = 0) -> None:
    """A block of source values as stored (numpy bfloat16, float16 or float32) into `out` as the cache stores them
    (flat, as many values): a host table's float32 (`.to(torch.float32)`: widened exactly, or copied), a device
    weight's bf16 bits (uint16; `.to(torch.bfloat16)`: rounded by `round_into`, or copied). `first`: the block's
    flat index in its tensor, for a refusal's message."""
    values = block.reshape(-1)
    if host:
        if values.dtype == ml_dtypes.bfloat16:
            widen_bf16(values, out)
        else:
            out.view(np.float32)[:] = values  # F16 -> F32 is exact, F32 a copy
    elif values.dtype == ml_dtypes.bfloat16:
        out.view(np.uint16)[:] = values.view(np.uint16)
    else:
        round_into(values, out.view(np.uint16), key, origin, first)


def bf16_bits(array: np.ndarray, what: str) -> np.ndarray:
    """The uint16 bits of bf16 values (numpy bfloat16, or their bits already): what the finite check, the packers
    and ttnn take. Any other dtype is a caller's mistake (a wider source is rounded when it is read), refused
    rather than its bits read as bf16."""
    if array.dtype not in (np.dtype(ml_dtypes.bfloat16), np.dtype(np.uint16)):
        raise ValueError(f"{what} takes bf16 values (numpy bfloat16 or their uint16 bits), got {array.dtype}")
    return np.ascontiguousarray(array).view(np.uint16)


def _round_f32_bits(bits: np.ndarray) -> np.ndarray:
    """float32 bits -> bf16 bits, round to nearest even (c10's `round_to_nearest_even`; finite input)."""
    bias = ((bits >> np.uint32(16)) & np.uint32(1)) + np.uint32(0x7FFF)
    return ((bits + bias) >> np.uint32(16)).astype(np.uint16)


def to_bf16(array: np.ndarray, key: str, origin: object) -> np.ndarray:
    """`array` (BF16, F16 or F32 values of source `key`) as torch's `.to(torch.bfloat16)` gives it. A finite value
    that rounds to ±Inf is refused, naming the key and the value; ±Inf and NaN of the source stay ±Inf and NaN
    (torch's own NaN) for the finite check to name. A BF16 array is returned as it is."""
    if array.dtype == ml_dtypes.bfloat16:
        return array
    out = np.empty(array.shape, ml_dtypes.bfloat16)
    convert_block(array, out.reshape(-1), False, key, origin)
    return out


_BLOCK = 1 << 18  # values rounded at a time on the numpy path, and F16 values widened at a time: in cache
# The NaN torch's `.to(torch.bfloat16)` writes for any NaN (measured, torch 2.14 on x86: its vectorised float32
# path blends in 0xFFFF; float16 goes through c10's scalar conversion, 0x7FC0). A NaN weight is refused later
# by name (tasks/device/host_tensors.py's finite check), so only its NaN-ness reaches anyone.
NAN_FROM = {np.dtype(np.float32): 0xFFFF, np.dtype(np.float16): 0x7FC0}


def round_into(array: np.ndarray, out: np.ndarray, key: str, origin: object, first: int = 0) -> None:
    """`out` (uint16, flat, as many values) = `array` (F16 or F32) rounded as `.to(torch.bfloat16)` rounds: in C
    where the kernels are built (tasks/numerics/kernels.c), else in numpy, to the same bits. `first`: the flat index of
    `array`'s first value in its tensor, for the refusal's message."""
    if array.dtype not in (np.float16, np.float32):
        raise CheckpointError(origin, f"dtype {array.dtype} has no bf16 rounding here", key)
    flat, in_c, nan = array.reshape(-1), kernels.available(), NAN_FROM[array.dtype]
    step = flat.size if in_c and array.dtype == np.float32 else _BLOCK
    for i in range(0, flat.size, step or 1):
        block = np.ascontiguousarray(flat[i:i + step], dtype=np.float32)  # F16 -> F32 is exact (as torch's)
        at = kernels.round_f32_bf16(block, out[i:i + block.size], nan) if in_c else \
            _round_numpy(block, out[i:i + block.size], nan)
        if at >= 0:
            raise CheckpointError(origin, f"value {float(block[at]):.9g} (flat index {first + i + at}) rounds to "
                                          f"{'-' if block[at] < 0 else '+'}Inf in bf16, past its largest finite value "
                                          f"{_BF16_MAX:.6g}; the checkpoint diverged or was saved wrongly", key)


def _round_numpy(block: np.ndarray, out: np.ndarray, nan: int) -> int:
    """round_f32_bf16 of tasks/numerics/kernels.c in numpy: the same bits, or the index of the first finite value that
    rounds to ±Inf (-1 when none does)."""
    finite = np.isfinite(block)
    rounded = _round_f32_bits(block.view(np.uint32))
    if not finite.all():  # Inf stays Inf; every NaN becomes torch's one NaN
        rounded[~finite] = np.where(np.isnan(block[~finite]), np.uint16(nan),
                                    (block[~finite].view(np.uint32) >> np.uint32(16)).astype(np.uint16))
    overflow = finite & ((rounded & np.uint16(0x7F80)) == np.uint16(0x7F80))
    out[:] = rounded
    return int(np.argmax(overflow)) if overflow.any() else -1


def widen_bf16(values: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """bf16 values (or their uint16 bits) as float32, exactly as `.to(torch.float32)`: bf16 is float32's top half,
    so a shift, not a conversion loop; into `out` (float32 or uint32, as many values) with no temporary."""
    bits = bf16_bits(values, "widen_bf16")
    wide = (np.empty(bits.shape, np.float32) if out is None else out).view(np.uint32)
    np.copyto(wide, bits.reshape(wide.shape))
    np.left_shift(wide, np.uint32(16), out=wide)
    return wide.view(np.float32)
