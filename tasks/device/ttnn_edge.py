"""ttnn at the edge: host tensors in the device dtype/layout, their numerics, and upload to a real device.

Without Tenstorrent hardware ttnn still does real host conversion (tilize, padding to 32x32 tiles, bfloat8_b /
bfloat4_b packing) once `TT_METAL_MOCK_CLUSTER_DESC_PATH` names a cluster descriptor; we ship one (Wormhole
N150) and set it only when no device is present and the user has not set their own. A simulated device
(Tenstorrent's ttsim, `TT_METAL_SIMULATOR` naming its `libttsim.so`) counts as a device: a mock descriptor would
hide it. Conversion goes through
numpy (bf16 bits widened exactly to float32), which gives the same bytes as `ttnn.from_torch` on bf16.
"""

from __future__ import annotations

import functools
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import MutableMapping

import numpy as np

from tasks.config_files import CONFIG_DIR
from tasks.numerics.precision import widen_bf16

MOCK_DESCRIPTOR = CONFIG_DIR / "tt" / "wormhole_N150.yaml"
MOCK_ENV = "TT_METAL_MOCK_CLUSTER_DESC_PATH"
SIMULATOR_ENV = "TT_METAL_SIMULATOR"
QUIET_ENV = {"LOGURU_LEVEL": "INFO", "TT_METAL_LOGGER_LEVEL": "ERROR"}
TILE = 32


def hardware_present() -> bool:
    """A Tenstorrent PCIe device node exists (the kernel driver creates /dev/tenstorrent/<n>)."""
    return Path("/dev/tenstorrent").exists()


def simulator_present(environ: MutableMapping[str, str] = os.environ) -> bool:
    """`TT_METAL_SIMULATOR` names a simulator library that exists (tt-metal then opens it instead of a card)."""
    return bool(environ.get(SIMULATOR_ENV)) and Path(environ[SIMULATOR_ENV]).is_file()


def device_present() -> bool:
    """A device ttnn can open: silicon, or a simulated one."""
    return hardware_present() or simulator_present()


def describe_devices() -> str:
    """What `--device auto` finds, for the line it prints."""
    if hardware_present():
        return "Tenstorrent hardware (/dev/tenstorrent)"
    return f"a simulated device ({SIMULATOR_ENV}={os.environ[SIMULATOR_ENV]})"


def describe_opened(device) -> str:
    """What was opened, for the line `--device auto` prints: the architecture ttnn reports, and how many chips."""
    arch = str(device.arch()).split(".")[-1].replace("_B0", "").capitalize()
    n = mesh_size(device)
    return f"{arch}, {n} chip{'s' if n > 1 else ''}"


def configure_ttnn_env(environ: MutableMapping[str, str], has_device: bool) -> str | None:
    """Point ttnn at the shipped mock descriptor unless a device (hardware or simulator) is present or the user
    chose one. Returns the descriptor in use (None with a device). Must run before the first ttnn conversion."""
    for name, value in QUIET_ENV.items():
        environ.setdefault(name, value)
    if MOCK_ENV in environ:
        return environ[MOCK_ENV]
    if has_device or simulator_present(environ):
        return None
    environ[MOCK_ENV] = str(MOCK_DESCRIPTOR)
    return environ[MOCK_ENV]


@functools.cache
def ttnn_module():
    """ttnn, imported on first use (2-5 s with torch: only the convert and upload stages need it), its environment
    set first, once per process (ttnn reads it at import; a hand-off asks for ttnn once per tensor)."""
    configure_ttnn_env(os.environ, device_present())
    import ttnn

    return ttnn


def to_host_tensor(array: np.ndarray, dtype: str, layout: str):
    """A ttnn host tensor of `array` (bf16) in `dtype` (bfloat16 | bfloat8_b | bfloat4_b) and `layout`."""
    ttnn = ttnn_module()
    return ttnn.Tensor(tensor=widen_bf16(array), data_type=getattr(ttnn, dtype),
                       layout=ttnn.TILE_LAYOUT if layout == "TILE" else ttnn.ROW_MAJOR_LAYOUT)


def packed_bytes(host) -> bytes:
    """The `.tensorbin` bytes ttnn writes for a host tensor (its own serialization: the only way ttnn can restore
    a packed bfloat8_b/bfloat4_b tensor without repacking)."""
    ttnn = ttnn_module()
    with tempfile.TemporaryDirectory(prefix="tensorbin-") as tmp:
        path = Path(tmp) / "t.tensorbin"
        ttnn.dump_tensor(str(path), host)
        return path.read_bytes()


def load_packed(path: Path, device=None):
    """A tensor from a `.tensorbin` file, on the host or (`device`) uploaded from it as ttnn stored it, dtype,
    layout and packing included (the caller has already read and checked its bytes)."""
    return ttnn_module().load_tensor(str(path), device=device)


def mapped_files(paths) -> dict[str, memoryview]:
    """Where this process maps each of these files whole, from offset 0 (ttnn's `load_tensor` maps a `.tensorbin`
    read-only and reads it lazily): path -> the mapped bytes, read in place. A file mapped otherwise, or not at all,
    is left out (the caller reads it instead)."""
    import ctypes

    wanted = set(map(str, paths))  # as the kernel names them: real paths
    found: dict[str, list[memoryview]] = {}
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) < 6 or fields[5].strip() not in wanted:
                continue
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if int(fields[2], 16) == 0 and "r" in fields[1]:
                found.setdefault(fields[5].strip(), []).append(
                    memoryview((ctypes.c_char * (hi - lo)).from_address(lo)).cast("B"))
    return {path: views[0] for path, views in found.items() if len(views) == 1}


def padded_shape(shape: tuple[int, ...], layout: str) -> tuple[int, ...]:
    """The shape ttnn stores: TILE pads the last two dims up to multiples of 32 (1-D becomes [32, n])."""
    if layout != "TILE":
        return tuple(shape)
    full = (1, *shape) if len(shape) == 1 else tuple(shape)
    up = lambda n: -(-n // TILE) * TILE  # noqa: E731
    return (*full[:-2], up(full[-2]), up(full[-1]))


@dataclass(frozen=True)
class Numerics:
    max_abs_err: float
    pcc: float


PCC_BLOCK = 1 << 16  # float64 within small blocks: float32 BLAS sums were 1e-6 off on some CPUs (no AVX-512)


def pcc(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson correlation of two equally shaped arrays (1.0 when identical), accumulated in float64 over
    blocks so that a 300M-element table needs megabytes, not gigabytes."""
    a, b = a.reshape(-1), b.reshape(-1)
    if np.array_equal(a, b):
        return 1.0
    n, sums = a.size, np.zeros(5)
    for i in range(0, n, PCC_BLOCK):
        x, y = a[i:i + PCC_BLOCK].astype(np.float64), b[i:i + PCC_BLOCK].astype(np.float64)
        sums += (x.sum(dtype=np.float64), y.sum(dtype=np.float64), float(x @ x), float(y @ y), float(x @ y))
    return pcc_from_sums(sums, n)


def pcc_from_sums(sums: np.ndarray, n: int) -> float:
    """Pearson correlation from (sum x, sum y, sum x², sum y², sum xy) over n values (1.0 for identical data)."""
    sx, sy, sxx, syy, sxy = sums
    cov, vx, vy = sxy - sx * sy / n, sxx - sx * sx / n, syy - sy * sy / n
    if vx <= 0 or vy <= 0:
        return 1.0 if sxx == syy == sxy else 0.0
    return float(min(1.0, cov / np.sqrt(vx * vy)))


def host_numerics(host, reference: np.ndarray) -> Numerics:
    """Round-trip the host tensor back to float32 and compare it with the bf16 reference."""
    ttnn = ttnn_module()
    back = host if host.dtype == ttnn.float32 else ttnn.typecast(host, ttnn.float32)
    if back.layout == ttnn.TILE_LAYOUT:
        back = ttnn.to_layout(back, ttnn.ROW_MAJOR_LAYOUT)
    values = np.asarray(back.to_numpy(), dtype=np.float32).reshape(reference.shape)
    ref = widen_bf16(reference)
    return Numerics(float(np.abs(values - ref).max()) if ref.size else 0.0, pcc(values, ref))


def open_device(device_id: int | None):
    """Open one device, or (None) every available device as a 1 x N mesh (hardware or simulator)."""
    ttnn = ttnn_module()
    if device_id is None:
        return ttnn.open_mesh_device(ttnn.MeshShape(1, ttnn.GetNumAvailableDevices()))
    return ttnn.open_device(device_id=device_id)


def mesh_size(device) -> int:
    return device.get_num_devices() if hasattr(device, "get_num_devices") else 1


def upload_array(array: np.ndarray, dtype: str, layout: str, kind: str, device):
    """Put one bf16 target on the device (DRAM) in its device dtype and layout. On a mesh, large matmul weights
    are split on their output dim across devices and everything else is replicated, as tt-metal does.
    Hardware only."""
    import torch  # lazy: 1-2 s to import; only a real upload needs it

    ttnn = ttnn_module()
    mapper, n = None, mesh_size(device)
    if n > 1:
        split = kind == "matmul" and array.shape[-1] % (TILE * n) == 0
        mapper = ttnn.ShardTensorToMesh(device, dim=-1) if split else ttnn.ReplicateTensorToMesh(device)
    host = torch.from_numpy(np.ascontiguousarray(array).view(np.int16)).view(torch.bfloat16)
    return ttnn.from_torch(host, dtype=getattr(ttnn, dtype),
                           layout=ttnn.TILE_LAYOUT if layout == "TILE" else ttnn.ROW_MAJOR_LAYOUT,
                           device=device, mesh_mapper=mapper, memory_config=ttnn.DRAM_MEMORY_CONFIG)


def close_device(device) -> None:
    ttnn = ttnn_module()
    (ttnn.close_mesh_device if hasattr(device, "get_num_devices") else ttnn.close_device)(device)


@dataclass(frozen=True)
class Uploaded:
    """A staged target that is also on the device (the upload stage's record)."""
    staged: object             # its tasks.entries.manifest.Staged
    tensor: object             # the ttnn device tensor


def upload_staged(staged, converted, kind: str, device) -> Uploaded:
    """The upload stage: put a staged target on the device; returns its stage record with the device tensor."""
    return Uploaded(staged, upload_array(converted.array, converted.device_dtype, converted.layout, kind, device))
