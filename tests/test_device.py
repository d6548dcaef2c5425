"""Real ttnn host conversion (mock cluster descriptor, no hardware); device upload is in test_simulated_device.py."""

from __future__ import annotations

import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from pipeline.jobs.convert import ConvertOptions, convert
from pipeline.model.versions import VERSIONS
from tasks.device import ttnn_edge

from tests.conftest import ROOT


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("profile", ["bf16", "bfp8"])
def test_every_target_converts_with_real_ttnn(hf_cache, tmp_path, version, profile):
    summary = convert(ConvertOptions(version, profile=profile, embodiments="new_embodiment", hf_cache=hf_cache, synthetic="tiny",
                                     cache_root=tmp_path, progress=False, check_bf16=True))
    numerics = summary["numerics"]
    assert len(numerics) == summary["targets"]  # one slot per bank
    for n in numerics:
        if profile == "bf16" or not n["name"].endswith(".weight") and not n["name"].endswith(".W"):
            assert n["max_abs_err"] == 0.0 and n["pcc"] == 1.0, n
    packed = [n for n in numerics if n["pcc"] < 1.0]
    if profile == "bfp8":
        assert len(packed) > 100 and min(n["pcc"] for n in packed) >= 0.999
        assert max(n["max_abs_err"] for n in packed) <= 2 ** -7  # weights ~N(0, 0.02): 7 mantissa bits per block


@pytest.mark.parametrize("shape", [(1152, 4304), (3, 1024), (32, 64, 1024), (4304,), (132, 1536)])
@pytest.mark.parametrize("dtype", ["bfloat16", "bfloat8_b"])
def test_padding_keeps_the_logical_shape(shape, dtype):
    x = (np.random.default_rng(0).standard_normal(shape) * 0.02).astype(ml_dtypes.bfloat16)
    host = ttnn_edge.to_host_tensor(x, dtype, "TILE")
    assert tuple(host.shape) == shape
    assert tuple(host.padded_shape) == ttnn_edge.padded_shape(shape, "TILE")
    assert all(d % 32 == 0 for d in tuple(host.padded_shape)[-2:])
    n = ttnn_edge.host_numerics(host, x)
    if dtype == "bfloat16":
        assert n == ttnn_edge.Numerics(0.0, 1.0)
    else:
        assert n.pcc >= 0.999 and 0 < n.max_abs_err <= 2 ** -7


def test_pcc_matches_numpy_corrcoef():
    rng = np.random.default_rng(3)
    a = rng.standard_normal(10_000_003).astype(np.float32)
    b = a + 0.1 * rng.standard_normal(a.size).astype(np.float32)
    assert abs(ttnn_edge.pcc(a, b) - np.corrcoef(a, b)[0, 1]) < 1e-9  # float64 throughout, in blocks


def test_mock_descriptor_only_without_hardware_and_without_a_user_choice():
    env: dict[str, str] = {}
    assert ttnn_edge.configure_ttnn_env(env, has_device=False) == str(ttnn_edge.MOCK_DESCRIPTOR)
    assert env[ttnn_edge.MOCK_ENV] == str(ttnn_edge.MOCK_DESCRIPTOR)
    mine = {ttnn_edge.MOCK_ENV: "/opt/my/t3k.yaml"}
    assert ttnn_edge.configure_ttnn_env(mine, has_device=False) == "/opt/my/t3k.yaml"
    assert mine[ttnn_edge.MOCK_ENV] == "/opt/my/t3k.yaml"
    on_hardware: dict[str, str] = {}
    assert ttnn_edge.configure_ttnn_env(on_hardware, has_device=True) is None
    assert ttnn_edge.MOCK_ENV not in on_hardware


def test_shipped_descriptor_really_enables_packing_in_a_fresh_process():
    code = ("import numpy as np, os; from tasks.device import ttnn_edge; "
            "h = ttnn_edge.to_host_tensor(np.zeros((32, 32), np.uint16), 'bfloat8_b', 'TILE'); "
            " print(os.environ['TT_METAL_MOCK_CLUSTER_DESC_PATH'], h.dtype)")
    env = {k: v for k, v in os.environ.items() if k not in (ttnn_edge.MOCK_ENV, ttnn_edge.SIMULATOR_ENV)}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == f"{ttnn_edge.MOCK_DESCRIPTOR} DataType.BFLOAT8_B"


def test_bfp8_reload_restores_packed_tensors_without_repacking(hf_cache, tmp_path, snapshots):
    import torch
    from safetensors import safe_open

    from pipeline.jobs.load import load

    summary = convert(ConvertOptions("n17", profile="bfp8", embodiments="new_embodiment", hf_cache=hf_cache, synthetic="tiny",
                                     cache_root=tmp_path, progress=False, layout="generic"))  # (norms ROW_MAJOR)
    loaded = load("n17", tmp_path, embodiment="new_embodiment", profile="bfp8", into="ttnn", layout="generic")
    assert len(loaded.tensors) == summary["targets"]
    w2 = loaded.tensors["action_head.action_encoder.W2.W"]
    assert str(w2.dtype) == "DataType.BFLOAT8_B" and str(w2.layout) == "Layout.TILE"
    with safe_open(str(snapshots["n17"] / "model-00002-of-00002.safetensors"), "pt") as f:
        source = f.get_tensor("action_head.action_encoder.W2.W")[10]
    fresh = ttnn_edge.to_host_tensor(source.view(torch.int16).numpy().view(np.uint16), "bfloat8_b", "TILE")
    import ttnn

    assert torch.equal(ttnn.to_torch(w2), ttnn.to_torch(fresh))  # packing is deterministic: identical values
    norm = loaded.tensors["llm.norm.weight"]
    assert str(norm.dtype) == "DataType.BFLOAT16" and str(norm.layout) == "Layout.ROW_MAJOR"


def _target(dtype: str, min_pcc: float):
    from tasks.plan import Target

    return Target(name="t.weight", sources=("k.weight",), transform="identity", kind="matmul", device_dtype=dtype,
                  device_layout="TILE", shape=(64, 64), device_file=True, min_pcc=min_pcc)


def test_a_target_below_the_recipe_pcc_fails_naming_it():
    from tasks.device.host_tensors import convert_target
    from tasks.errors import CheckpointError

    rng = np.random.default_rng(5)
    x = (rng.standard_normal((64, 64)) * 0.02).astype(ml_dtypes.bfloat16)  # bfloat8_b keeps PCC ~0.99997
    with pytest.raises(CheckpointError) as err:
        convert_target(x, _target("bfloat8_b", 0.99999), origin="shard.safetensors")
    assert "shard.safetensors, key 'k.weight': target 't.weight' keeps PCC" in str(err.value)
    assert "below the recipe's 0.99999" in str(err.value)
    ok = convert_target(x, _target("bfloat8_b", 0.999))
    assert 0.999 <= ok.pcc < 0.99999


@pytest.mark.parametrize("wrong", [np.float16, np.int16, np.float64])
def test_a_target_that_is_not_bf16_is_refused_not_read_as_bf16(wrong):
    """A wider source is rounded when it is read (tasks/numerics/precision.py); the convert stage never reinterprets bits."""
    from tasks.device.host_tensors import convert_target

    for dtype in ("bfloat16", "bfloat8_b"):
        with pytest.raises(ValueError, match=rf"takes bf16 values .*, got {np.dtype(wrong)}"):
            convert_target(np.zeros((64, 64), wrong), _target(dtype, 0.999))
