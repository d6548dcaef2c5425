"""The convert stage: check a target's values, build its ttnn host tensor in the device dtype/layout, and measure
what the device dtype costs against the bf16 source. The cache keeps the lossless bf16 array either way.

A bf16 target converts to a bf16 device tensor by relayout only (tilize + zero padding), which cannot change a
value; building it on the host just to compare it with itself would cost more than the rest of the conversion.
So bf16 targets get the shape arithmetic and exact numerics, and go through ttnn only when `check_bf16` asks
(the test suite does, on every target of every version) or when they are uploaded. Packed dtypes (bfloat8_b,
bfloat4_b) always go through ttnn, their error is measured, and ttnn's own serialization of the packed tensor
is kept: ttnn cannot rebuild a packed tensor from raw bytes, and repacking on every reload runs at ~0.2 GB/s.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tasks import device
from tasks.errors import CheckpointError

_EXPONENT = np.uint16(0x7F80)  # bf16 exponent bits: all ones means Inf or NaN
_BLOCK = 1 << 18               # elements per finite-check block: temporaries stay in L2


@dataclass(frozen=True)
class Converted:
    name: str
    slot: int | None
    array: np.ndarray          # bf16, logical shape: what the cache stores
    device_dtype: str
    layout: str
    padded_shape: tuple[int, ...]
    max_abs_err: float
    pcc: float
    packed: bytes | None = None  # `.tensorbin` of a packed-dtype target: reloads without repacking


def check_finite(array: np.ndarray, name: str, sources: tuple[str, ...], origin: str = "") -> None:
    """NaN/Inf in weights is a broken checkpoint: name the file, the target and its source keys (checked on the
    bits). `origin` names the shard file(s) the sources came from."""
    bits = array.reshape(-1).view(np.uint16)
    scratch = np.empty(min(_BLOCK, bits.size), np.uint16)
    count, first = 0, -1
    for i in range(0, bits.size, _BLOCK):
        block = bits[i:i + _BLOCK]
        masked = np.bitwise_and(block, _EXPONENT, out=scratch[:block.size])
        if masked.max(initial=0) == _EXPONENT:  # cheap scan; count exactly only when something is wrong
            bad = masked == _EXPONENT
            count += int(np.count_nonzero(bad))
            first = first if first >= 0 else i + int(np.argmax(bad))
    if count:
        raise CheckpointError(origin or ", ".join(sources), f"{count} NaN/Inf value(s) in target {name!r} (first at flat index "
                                                  f"{first}); the checkpoint is corrupt or was saved mid-divergence", sources[0])


def convert_target(array: np.ndarray, name: str, sources: tuple[str, ...], device_dtype: str, layout: str,
                   slot: int | None = None, check_bf16: bool = False, origin: str = "",
                   device_file: bool = False, min_pcc: float = 0.0) -> Converted:
    """Finite check, then (for packed dtypes, device files, or when asked) the real ttnn host conversion and its
    shape checks; round-trip numerics for packed dtypes (and bf16 when asked); the `.tensorbin` when kept."""
    check_finite(array, name, sources, origin)
    expected = device.padded_shape(array.shape, layout)
    if layout == "HOST":  # kept on the host as float32: widening bf16 is exact, and nothing goes through ttnn
        return Converted(name, slot, array, device_dtype, layout, expected, 0.0, 1.0)
    exact = device_dtype == "bfloat16"
    if exact and not check_bf16 and not device_file:
        return Converted(name, slot, array, device_dtype, layout, expected, 0.0, 1.0)
    host = device.to_host_tensor(array, device_dtype, layout)
    if tuple(host.shape) != tuple(array.shape) or tuple(host.padded_shape) != expected:
        raise CheckpointError(sources[0], f"ttnn host tensor for {name!r} has shape {tuple(host.shape)} / padded "
                                          f"{tuple(host.padded_shape)}, expected {array.shape} / {expected}", sources[0])
    numerics = device.host_numerics(host, array) if not exact or check_bf16 else device.Numerics(0.0, 1.0)
    if numerics.pcc < min_pcc:
        raise CheckpointError(origin or sources[0], f"target {name!r} keeps PCC {numerics.pcc:.6f} against its bf16 "
                                                    f"source in {device_dtype}, below the recipe's {min_pcc} (max abs "
                                                    f"error {numerics.max_abs_err:.3g}); use a wider dtype for it in "
                                                    "configs/recipes.toml", sources[0])
    packed = device.packed_bytes(host) if device_file or not exact else None
    return Converted(name, slot, array, device_dtype, layout, expected, numerics.max_abs_err, numerics.pcc, packed)
