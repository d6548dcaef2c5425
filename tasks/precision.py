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
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from tasks.errors import CheckpointError

FLOAT_SOURCES = ("BF16", "F16", "F32")  # what a GR00T weight may be stored as
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


def _round_f32_bits(bits: np.ndarray) -> np.ndarray:
    """float32 bits -> bf16 bits, round to nearest even (c10's `round_to_nearest_even`; finite input)."""
    bias = ((bits >> np.uint32(16)) & np.uint32(1)) + np.uint32(0x7FFF)
    return ((bits + bias) >> np.uint32(16)).astype(np.uint16)


def to_bf16(array: np.ndarray, key: str, origin: object) -> np.ndarray:
    """`array` (BF16, F16 or F32 values of source `key`) as torch's `.to(torch.bfloat16)` gives it. A finite value
    that rounds to ±Inf is refused, naming the key and the value; NaN/Inf of the source pass through unchanged
    for the finite check to name. A BF16 array is returned as it is."""
    if array.dtype == ml_dtypes.bfloat16:
        return array
    if array.dtype not in (np.float16, np.float32):
        raise CheckpointError(origin, f"dtype {array.dtype} has no bf16 rounding here", key)
    wide = np.ascontiguousarray(array, dtype=np.float32)  # F16 -> F32 is exact (torch converts through float too)
    out = np.empty(wide.shape, ml_dtypes.bfloat16)
    flat_in, flat_out = wide.reshape(-1), out.reshape(-1).view(np.uint16)
    for i in range(0, flat_in.size, 1 << 18):  # blocks: temporaries stay in cache
        block = flat_in[i:i + (1 << 18)]
        finite = np.isfinite(block)
        rounded = _round_f32_bits(block.view(np.uint32))
        if not finite.all():  # Inf stays Inf, NaN stays NaN (quiet): the finite check names them
            bad = block[~finite]
            rounded[~finite] = (bad.view(np.uint32) >> np.uint32(16)).astype(np.uint16) | \
                np.where(np.isnan(bad), np.uint16(0x40), np.uint16(0))
        overflow = finite & ((rounded & np.uint16(0x7F80)) == np.uint16(0x7F80))
        if overflow.any():
            at = int(np.argmax(overflow))
            raise CheckpointError(origin, f"value {float(block[at]):.9g} (flat index {i + at}) rounds to "
                                          f"{'-' if block[at] < 0 else '+'}Inf in bf16, past its largest finite value "
                                          f"{_BF16_MAX:.6g}; the checkpoint diverged or was saved wrongly", key)
        flat_out[i:i + block.size] = rounded
    return out


def to_float32(array: np.ndarray) -> np.ndarray:
    """A host table as `.to(torch.float32)` keeps it: BF16 and F16 widened (exact), F32 as it is."""
    if array.dtype == ml_dtypes.bfloat16:
        out = np.empty(array.shape, np.uint32)
        widen_bf16(array.reshape(-1).view(np.uint16), out.reshape(-1))
        return out.view(np.float32)
    return array if array.dtype == np.float32 else array.astype(np.float32)


def widen_bf16(bits: np.ndarray, out: np.ndarray) -> None:
    """bf16 bits (uint16) as float32 bits into `out` (uint32, as many values), exactly as `.to(torch.float32)`:
    bf16 is float32's top half, so a shift, not a conversion loop, and no temporary."""
    np.copyto(out, bits)
    np.left_shift(out, np.uint32(16), out=out)
