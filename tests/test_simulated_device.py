"""Uploads on a simulated device (devkit/simulator; a Wormhole N150, and in tests/test_blackhole.py a Blackhole P150): what lands on the device, read back, is bit for bit the
host tensor the entry holds. The reference is ttnn itself: each readback is serialized by `ttnn.dump_tensor` and
compared with the entry's `.tensorbin` file (dtype, layout, shape, padded shape and packed bytes in one file), or,
for targets without one, with a host tensor ttnn builds from the source checkpoint read by safetensors."""

from __future__ import annotations

import json
import os
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest

from pipeline.jobs.convert import ConvertOptions, convert
from pipeline.jobs.load import load
from tasks.device import one_file, ttnn_edge as tt
from tasks.entries.entry import open_entry
from tasks.errors import CacheError
from tasks.entries.store import LocalStore
from tests.conftest import run_cli



def dumped(tensor) -> bytes:
    """ttnn's own serialization of a host tensor (a device tensor is read back first)."""
    import ttnn

    host = ttnn.from_device(tensor) if tensor.storage_type() == ttnn.StorageType.DEVICE else tensor
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.tensorbin"
        ttnn.dump_tensor(str(path), host)
        return path.read_bytes()


def entry_files(root: Path, name: str) -> dict[tuple[str, int | None], Path]:
    """(target, slot) -> the entry's device file: its `.tensorbin`, or its tiled chunk (format 7)."""
    entry = open_entry(LocalStore(root), name)
    return {(a, s): root / entry.device_object(a, s) for a, arr in entry.manifest.arrays.items()
            for s, rec in arr.chunks.items() if entry.has_device_file(a, s)}


def holds(file: Path, dumped: bytes) -> bool:
    """Whether a device file holds exactly what ttnn dumped: a `.tensorbin` is those bytes; a tiled chunk starts
    with them and ends with a Zarr index pointing at its bf16 tiles: ttnn's own payload for bfloat16 (ending where
    the dump ends), else the bytes right after the dump, up to the index."""
    data = file.read_bytes()
    if data == dumped:
        return not file.name.startswith("c.")
    offset, nbytes = struct.unpack("<QQ", data[-16:])
    return data[:len(dumped)] == dumped and (offset + nbytes == len(dumped) == len(data) - 16 or
                                             offset == len(dumped) == len(data) - 16 - nbytes)


def test_convert_uploads_every_target_bit_exact(simulated_device, hf_cache, tmp_path):
    summary = convert(ConvertOptions("n16", embodiments="gr1,new_embodiment", hf_cache=hf_cache, synthetic="tiny",
                                     cache_root=tmp_path, progress=False, device=simulated_device))
    on_device = summary["device_tensors"]
    files = entry_files(tmp_path, Path(summary["cache_path"]).name)
    assert summary["layout"] == "tt-n16" and summary["profile"] == "port"
    assert set(on_device) == set(files) and len(on_device) > 900  # every device target (host-only ones excluded)
    for key, tensor in on_device.items():
        assert tensor.storage_type().name == "DEVICE", key
        assert holds(files[key], dumped(tensor)), key


@pytest.fixture(scope="module")
def port_entry(hf_cache, tmp_path_factory):
    root = tmp_path_factory.mktemp("device-cache")
    summary = convert(ConvertOptions("n16", embodiments="gr1", hf_cache=hf_cache, synthetic="tiny", cache_root=root,
                                     progress=False))
    return root, Path(summary["cache_path"]).name


def test_load_to_device_comes_from_the_device_files(simulated_device, port_entry, monkeypatch):
    root, name = port_entry
    monkeypatch.setattr(tt, "upload_array", lambda *a, **k: pytest.fail("a packed target was re-converted"))
    loaded = load("n16", root, embodiment="gr1", into=simulated_device)
    files = entry_files(root, name)
    device_targets = {n for n, _ in files}
    assert set(loaded.tensors) - device_targets == {n for n in loaded.tensors if "_norm." in n or "embed_tokens" in n}
    for target, tensor in loaded.tensors.items():
        if target not in device_targets:  # q_norm, k_norm, embed_tokens: torch float32, on the host
            import torch

            assert isinstance(tensor, torch.Tensor) and tensor.dtype == torch.float32, target
            continue
        slot = 20 if (target, 20) in files else None
        assert holds(files[(target, slot)], dumped(tensor)), target


def test_one_embodiment_on_device_is_that_slot_of_the_source(simulated_device, port_entry, snapshots):
    import torch
    import ttnn
    from safetensors import safe_open

    root, _ = port_entry
    loaded = load("n16", root, embodiment="gr1", into=simulated_device)
    shard = next(p for p in snapshots["n16"].glob("*.safetensors")
                 if "action_head.action_encoder.W2.W" in safe_open(str(p), "pt").keys())
    with safe_open(str(shard), "pt") as f:
        source = f.get_tensor("action_head.action_encoder.W2.W")[20]  # gr1 is slot 20; [in, out], never transposed
    reference = ttnn.from_torch(source, dtype=ttnn.bfloat16, layout=ttnn.TILE_LAYOUT)
    assert dumped(loaded.tensors["action_encoder.W2.W"]) == dumped(reference)


def test_a_device_file_damaged_after_publish_is_refused_before_any_upload(simulated_device, port_entry, tmp_path,
                                                                          monkeypatch):
    import shutil

    root, name = port_entry
    copy = tmp_path / "cache"
    shutil.copytree(root, copy)
    victim = sorted(entry_files(copy, name).values())[-1]
    data = bytearray(victim.read_bytes())
    data[400] ^= 0x40  # in the payload ttnn reads (its header is 384 bytes)
    victim.write_bytes(bytes(data))
    uploads = []
    real = tt.load_packed
    monkeypatch.setattr(tt, "load_packed", lambda path, device=None: uploads.append(path) or real(path, device))
    in_place = one_file.device_tensor
    monkeypatch.setattr(one_file, "device_tensor", lambda path, device=None: uploads.append(path) or
                        in_place(path, device))
    with pytest.raises(CacheError, match="device file [(]what ttnn loads[)] does not match its manifest checksum"):
        load("n16", copy, embodiment="gr1", into=simulated_device)
    assert uploads == []


ARCHES = {"wh": ("Arch.WORMHOLE_B0", "Wormhole"), "bh": ("Arch.BLACKHOLE", "Blackhole")}


def test_the_simulated_device_is_the_architecture_asked_for(simulated_device):
    assert str(simulated_device.arch()) == ARCHES[os.environ["GR00T_TEST_DEVICE"]][0]


def test_device_choices_on_the_command_line(simulated_device, port_entry):
    root, _ = port_entry
    env = dict(os.environ)
    auto = run_cli("load", "--version", "n16", "--embodiment", "gr1", "--cache", str(root), "--device", "auto", "--json",
                env=env)
    assert auto.returncode == 0, auto.stderr
    assert f"--device auto: a simulated device (TT_METAL_SIMULATOR={env['TT_METAL_SIMULATOR']})" in auto.stderr
    assert f"--device auto: opened {ARCHES[env['GR00T_TEST_DEVICE']][1]}, 1 chip" in auto.stderr
    assert json.loads(auto.stdout)["tensors"] > 900
    missing = run_cli("load", "--version", "n16", "--embodiment", "gr1", "--cache", str(root), "--device", "7", env=env)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert missing.stderr.strip().splitlines()[-1].startswith(
        "error: --device 7: the Tenstorrent device could not be opened (Physical chip id 7 not found")
    host = {k: v for k, v in env.items() if k != tt.SIMULATOR_ENV}
    none = run_cli("load", "--version", "n16", "--embodiment", "gr1", "--cache", str(root), "--device", "auto", "--json",
                env=host)
    if tt.hardware_present():
        pytest.skip("this machine has Tenstorrent hardware: auto does not fall back to the host")
    assert none.returncode == 0 and "--device auto: no device: host only" in none.stderr, none.stderr


def test_upload_keeps_values_of_every_dtype_and_layout(simulated_device):
    import ml_dtypes
    import torch
    import ttnn

    x = (np.random.default_rng(1).standard_normal((40, 70)) * 0.02).astype(ml_dtypes.bfloat16)
    for dtype, layout in (("bfloat16", "TILE"), ("bfloat8_b", "TILE"), ("bfloat16", "ROW_MAJOR")):
        on_device = tt.upload_array(x, dtype, layout, "matmul", simulated_device)
        reference = ttnn.from_torch(torch.from_numpy(x.view(np.int16)).view(torch.bfloat16), dtype=getattr(ttnn, dtype),
                                    layout=ttnn.TILE_LAYOUT if layout == "TILE" else ttnn.ROW_MAJOR_LAYOUT)
        assert dumped(on_device) == dumped(reference), (dtype, layout)
