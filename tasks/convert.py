"""The convert stage: check a target's values, build its ttnn host tensor in the device dtype/layout, and measure
what the device dtype costs against the bf16 source. The cache keeps the lossless bf16 array either way."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tasks import device
from tasks.errors import CheckpointError


@dataclass(frozen=True)
class Converted:
    name: str
    slot: int | None
    array: np.ndarray          # bf16, logical shape: what the cache stores
    device_dtype: str
    padded_shape: tuple[int, ...]
    max_abs_err: float
    pcc: float


def check_finite(array: np.ndarray, name: str, sources: tuple[str, ...]) -> None:
    """NaN/Inf in weights is a broken checkpoint: name the target and its source keys."""
    finite = np.isfinite(array)
    if not finite.all():
        bad = int(array.size - np.count_nonzero(finite))
        raise CheckpointError(", ".join(sources), f"{bad} NaN/Inf value(s) in target {name!r} (first at flat index "
                                                  f"{int(np.argmin(finite.ravel()))}); the checkpoint is corrupt", sources[0])


def convert_target(array: np.ndarray, name: str, sources: tuple[str, ...], device_dtype: str, layout: str,
                   slot: int | None = None) -> Converted:
    """Finite check, then the real ttnn host conversion, its shape checks and round-trip numerics."""
    check_finite(array, name, sources)
    host = device.to_host_tensor(array, device_dtype, layout)
    expected = device.padded_shape(array.shape, layout)
    if tuple(host.shape) != tuple(array.shape) or tuple(host.padded_shape) != expected:
        raise CheckpointError(sources[0], f"ttnn host tensor for {name!r} has shape {tuple(host.shape)} / padded "
                                          f"{tuple(host.padded_shape)}, expected {array.shape} / {expected}", sources[0])
    numerics = device.host_numerics(host, array)
    return Converted(name, slot, array, device_dtype, tuple(host.padded_shape), numerics.max_abs_err, numerics.pcc)
