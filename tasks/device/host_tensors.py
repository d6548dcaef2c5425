"""The convert stage: check a target's values, build its ttnn host tensor in the device dtype/layout, and measure
what the device dtype costs against the bf16 source. The cache keeps the lossless bf16 array either way.

A bf16 target converts to a bf16 device tensor by relayout only (tilize + zero padding), which cannot change a
value, so without a device file it gets the shape arithmetic and exact numerics only. TILE targets that keep a
device file (every packed target, and every target of a device_files profile) get ttnn's `.tensorbin` made in
numpy (tasks/device/tensorbin.py: byte-identical to `dump_tensor`, checked against ttnn once per rank and dtype), with
bfloat8_b's read-back values measured in the same pass: ~4x ttnn's packing, and no `to_torch` round trip. ttnn's
own path remains for what the numpy packer does not cover (bfloat4_b, ROW_MAJOR device files, another ttnn) and
for `check_bf16` (the test suite round-trips every target through ttnn). The file is kept because ttnn cannot
rebuild a packed tensor from raw bytes.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tasks.device import one_file, ttnn_edge, tensorbin
from tasks.errors import CheckpointError
from tasks.plan import HOST, HostTable, Target
from tasks.numerics.precision import bf16_bits

_EXPONENT = {2: np.uint16(0x7F80), 4: np.uint32(0x7F800000)}  # bf16's, float32's: all ones means Inf or NaN
_BLOCK = 1 << 18               # elements per finite-check block: temporaries stay in L2


@dataclass(frozen=True, kw_only=True)
class Converted:
    name: str
    slot: int | None
    array: np.ndarray | HostTable  # bf16, logical shape; a host table: left in its file, streamed as float32
    device_dtype: str
    layout: str
    padded_shape: tuple[int, ...]
    max_abs_err: float
    pcc: float
    packed: bytes | np.ndarray | None = None  # `.tensorbin` of a target with a device file: reloads without repacking
    tiled: bool = False  # `packed` is the whole tiled chunk, values included (tasks/device/one_file.py): stored alone
    sources: tuple[str, ...] = ()  # a streamed host table's source keys and shard(s), for the stage's finite check
    origin: str = ""


def _count_nonfinite(bits: np.ndarray) -> tuple[int, int]:
    """(Inf/NaN count, first flat index or -1) of bf16 or float32 bits, in blocks (~18 GB/s here for bf16; a C loop
    gains ~0.15 s on a full N1.6, measured and left out)."""
    exponent = _EXPONENT[bits.dtype.itemsize]
    scratch = np.empty(min(_BLOCK, bits.size), bits.dtype)
    count, first = 0, -1
    for i in range(0, bits.size, _BLOCK):
        block = bits[i:i + _BLOCK]
        masked = np.bitwise_and(block, exponent, out=scratch[:block.size])
        if masked.max(initial=0) == exponent:  # cheap scan; count exactly only when something is wrong
            bad = masked == exponent
            count += int(np.count_nonzero(bad))
            first = first if first >= 0 else i + int(np.argmax(bad))
    return count, first


class NonFinite:
    """Inf/NaN found in a target's values as they pass, block by block (a streamed host table is checked as the
    stage writes it: read once)."""

    def __init__(self) -> None:
        self.count, self.first = 0, -1

    def add(self, first: int, bits: np.ndarray) -> None:
        """`bits`: bf16 or float32 bits of the flat values from index `first`."""
        n, at = _count_nonfinite(bits)
        self.count += n
        self.first = self.first if self.first >= 0 or at < 0 else first + at

    def check(self, name: str, sources: tuple[str, ...], origin: str = "") -> None:
        """NaN/Inf in weights is a broken checkpoint: name the file, the target and its source keys."""
        if self.count:
            raise CheckpointError(origin or ", ".join(sources), f"{self.count} NaN/Inf value(s) in target {name!r} "
                                                                f"(first at flat index {self.first}); the checkpoint is "
                                                                "corrupt or was saved mid-divergence", sources[0])


def check_finite(array: np.ndarray, name: str, sources: tuple[str, ...], origin: str = "") -> None:
    """NaN/Inf in weights is a broken checkpoint (checked on the bits: bf16, or a host table's float32). `origin`
    names the shard file(s) the sources came from."""
    found = NonFinite()
    bits = array.view(np.uint32) if array.dtype == np.float32 else bf16_bits(array, "the finite check")
    found.add(0, bits.reshape(-1))
    found.check(name, sources, origin)


def _floor(pcc: float, max_abs_err: float, name: str, sources: tuple[str, ...], device_dtype: str, origin: str,
           min_pcc: float) -> None:
    if pcc < min_pcc:
        raise CheckpointError(origin or sources[0], f"target {name!r} keeps PCC {pcc:.6f} against its bf16 source in "
                                                    f"{device_dtype}, below the recipe's {min_pcc} (max abs error "
                                                    f"{max_abs_err:.3g}); use a wider dtype for it in "
                                                    "configs/recipes.toml", sources[0])


def convert_target(array: np.ndarray | HostTable, target: Target, slot: int | None = None, check_bf16: bool = False,
                   origin: str = "") -> Converted:
    """Finite check, then (for packed dtypes, device files, or when asked) the ttnn host tensor of `target` (one
    slot of a bank) and its shape checks and numerics; the `.tensorbin` when kept. `origin` names the shard
    file(s) for errors; `check_bf16` also round-trips bf16 targets through ttnn."""
    name, sources, device_dtype, layout = target.name, target.sources, target.device_dtype, target.device_layout
    device_file, min_pcc = target.device_file, target.min_pcc
    expected = ttnn_edge.padded_shape(array.shape, layout)
    if layout == HOST:  # kept on the host as the float32 the port holds: nothing goes through ttnn
        if not isinstance(array, HostTable):  # a streamed table is checked as the stage writes it (read once)
            check_finite(array, name, sources, origin)
        return Converted(name=name, slot=slot, array=array, device_dtype=device_dtype, layout=layout,
                         padded_shape=expected, max_abs_err=0.0, pcc=1.0, sources=sources, origin=origin)
    check_finite(array, name, sources, origin)
    exact = device_dtype == "bfloat16"
    if exact and not check_bf16 and not device_file:
        return Converted(name=name, slot=slot, array=array, device_dtype=device_dtype, layout=layout,
                         padded_shape=expected, max_abs_err=0.0, pcc=1.0)
    tiled = one_file.is_tiled(target)
    made = None if layout != "TILE" or check_bf16 else \
        one_file.tiled_file(array, device_dtype) if tiled else tensorbin.tensorbin(array, device_dtype)
    if made is not None:  # ttnn's bytes made in numpy (checked against ttnn once per rank and dtype)
        blob, packed = made
        _floor(packed.pcc, packed.max_abs_err, name, sources, device_dtype, origin, min_pcc)
        return Converted(name=name, slot=slot, array=array, device_dtype=device_dtype, layout=layout,
                         padded_shape=expected, max_abs_err=packed.max_abs_err, pcc=packed.pcc, packed=blob,
                         tiled=tiled)
    host = ttnn_edge.to_host_tensor(array, device_dtype, layout)
    if tuple(host.shape) != tuple(array.shape) or tuple(host.padded_shape) != expected:
        raise CheckpointError(sources[0], f"ttnn host tensor for {name!r} has shape {tuple(host.shape)} / padded "
                                          f"{tuple(host.padded_shape)}, expected {array.shape} / {expected}", sources[0])
    numerics = ttnn_edge.host_numerics(host, array) if not exact or check_bf16 else ttnn_edge.Numerics(0.0, 1.0)
    _floor(numerics.pcc, numerics.max_abs_err, name, sources, device_dtype, origin, min_pcc)
    packed = ttnn_edge.packed_bytes(host) if device_file or not exact else None
    if tiled:
        packed = one_file.around(packed, array, device_dtype)
    return Converted(name=name, slot=slot, array=array, device_dtype=device_dtype, layout=layout, padded_shape=expected,
                     max_abs_err=numerics.max_abs_err, pcc=numerics.pcc, packed=packed, tiled=tiled)
