"""The tt-n16 layout against an oracle of tt-metal's GR00T N1.6 port (tests/port_oracle.py), bit for bit.

Every target must equal the oracle's tensor (bf16 values before packing, and the ttnn host tensor: dtype, layout,
shapes, `to_torch`), and the oracle must have no tensor the converter lacks. Then, in float32 on the host, the
padded weights must compute the same attention as the unpadded HF ones.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import ttnn
import zarr

from pipeline.convert import ConvertOptions, convert
from pipeline.load import load
from pipeline.snapshot import resolve_snapshot
from pipeline.synth import synthesize
from pipeline.versions import load_config
from tests.port_oracle import HOST, hf_state, port_oracle

def _cached_bf16(group, name: str) -> torch.Tensor:
    """Our stored values, read through zarr-python (an independent reader of the cache format)."""
    return torch.from_numpy(np.ascontiguousarray(group[name][...])).view(torch.bfloat16)


def _conformance(version: str, snapshot: Path, cache_root: Path, scale: str, slots: list[int], slot: int) -> int:
    summary = convert(ConvertOptions(version, embodiments=",".join(map(str, slots)), snapshot=snapshot,
                                     cache_root=cache_root, progress=False))
    assert (summary["layout"], summary["profile"]) == ("tt-n16", "port")  # n16's defaults
    entry = Path(summary["cache_path"])
    oracle = port_oracle(hf_state(snapshot), dict(load_config(version).dims_for(scale)), slots)
    manifest = json.loads((entry / "MANIFEST.json").read_text())["arrays"]
    assert sorted(manifest) == sorted(oracle)  # the same tensors, no more and no fewer
    host = load(version, cache_root, embodiment=slot, ttnn_host=True)
    group = zarr.open_group(str(entry), mode="r")
    assert sorted(host.tensors) == sorted(oracle)
    for name, (expected, dtype) in oracle.items():
        attrs = manifest[name]["attributes"]
        ours = _cached_bf16(group, name)
        if attrs["embodiment_bank"]:
            expected = torch.stack(expected)
        if dtype == HOST:  # stored bf16, handed out as the port's float32
            assert attrs["host_only"] and attrs["device_layout"] == "HOST", name
            assert host.tensors[name].dtype == torch.float32 and torch.equal(host.tensors[name], expected), name
            assert torch.equal(ours.float(), expected), name
            continue
        assert torch.equal(ours.view(torch.int16), expected.contiguous().view(torch.int16)), name
        assert attrs["device_dtype"] == dtype and attrs["device_layout"] == "TILE", name
        one = expected[slots.index(slot)] if attrs["embodiment_bank"] else expected  # the port: one tensor per slot
        theirs = ttnn.from_torch(one, dtype=getattr(ttnn, dtype), layout=ttnn.TILE_LAYOUT)
        mine = host.tensors[name]
        assert (mine.dtype, mine.layout) == (theirs.dtype, theirs.layout), name
        assert tuple(mine.shape) == tuple(theirs.shape) and tuple(mine.padded_shape) == tuple(theirs.padded_shape), name
        assert torch.equal(ttnn.to_torch(mine).view(torch.int16), ttnn.to_torch(theirs).view(torch.int16)), name
    return len(oracle)


def test_tt_n16_equals_the_port_at_tiny_scale(snapshots, cache_root):
    assert _conformance("n16", snapshots["n16"], cache_root, "tiny", list(range(32)), 20) == 986


@pytest.fixture(scope="module")
def attn_snapshot(tmp_path_factory) -> Path:
    """n16 with the real attention shapes (SigLIP2 16 x 72, DiT 32 x 48), one or two layers per stack."""
    hf = tmp_path_factory.mktemp("hf-attn")
    synthesize("n16", hf, "attn")
    return resolve_snapshot(load_config("n16"), hf_cache=hf, synthetic="attn")


@pytest.fixture(scope="module")
def attn_entry(attn_snapshot, tmp_path_factory):
    root = tmp_path_factory.mktemp("cache-attn")
    count = _conformance("n16", attn_snapshot, root, "attn", [0, 1], 1)
    return root, count


def test_tt_n16_equals_the_port_at_real_attention_shapes(attn_entry):
    root, count = attn_entry
    assert count == 89


def _weights(root: Path) -> dict[str, torch.Tensor]:
    return {k: v.float() for k, v in load("n16", root, embodiment=0).tensors.items()}


def _attention(q, k, v, heads, scale):
    """Multi-head attention over [seq, heads*d] projections, heads split on the last dim."""
    split = lambda x: x.reshape(x.shape[0], heads, -1).transpose(0, 1)  # noqa: E731
    ctx = F.scaled_dot_product_attention(split(q), split(k), split(v), scale=scale)
    return ctx.transpose(0, 1).reshape(q.shape[0], -1)


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    # float32 on both sides; zero padding adds exact zeros, so only summation order differs
    assert torch.allclose(a, b, rtol=1e-4, atol=1e-5 * float(b.abs().max())), float((a - b).abs().max())


def test_padded_siglip2_attention_computes_the_same_function(attn_entry, attn_snapshot):
    root, _ = attn_entry
    ours, hf = _weights(root), {k: v.float() for k, v in hf_state(attn_snapshot).items()}
    p = "backbone.model.vision_model.vision_model.encoder.layers.0.self_attn."
    x = torch.randn(64, 1152, generator=torch.Generator().manual_seed(0))
    q, k, v = (x @ hf[f"{p}{n}_proj.weight"].T + hf[f"{p}{n}_proj.bias"] for n in "qkv")
    reference = _attention(q, k, v, 16, 1 / math.sqrt(72)) @ hf[p + "out_proj.weight"].T + hf[p + "out_proj.bias"]
    n = "vision.encoder.layers.0.self_attn."
    qkv = x @ ours[n + "qkv_padded.weight"] + ours[n + "qkv_padded.bias"]
    assert qkv.shape == (64, 3 * 16 * 96)
    q, k, v = qkv.split(16 * 96, dim=1)
    padded = _attention(q, k, v, 16, 1 / math.sqrt(72)) @ ours[n + "out_proj_padded.weight"] + ours[n + "out_proj.bias"]
    _close(padded, reference)


@pytest.mark.parametrize("block,kv_dim", [(0, 2048), (1, 1536)], ids=["cross-attention", "self-attention"])
def test_padded_dit_attention_computes_the_same_function(attn_entry, attn_snapshot, block, kv_dim):
    root, _ = attn_entry
    ours, hf = _weights(root), {k: v.float() for k, v in hf_state(attn_snapshot).items()}
    p, n = f"action_head.model.transformer_blocks.{block}.attn1.", f"dit.transformer_blocks.{block}.attn1."
    gen = torch.Generator().manual_seed(block)
    x, context = torch.randn(17, 1536, generator=gen), torch.randn(40, 2048, generator=gen)
    kv_source = context if kv_dim == 2048 else x
    assert hf[p + "to_k.weight"].shape == (1536, kv_dim)  # even blocks cross-attend to the backbone
    q = x @ hf[p + "to_q.weight"].T + hf[p + "to_q.bias"]
    k, v = (kv_source @ hf[f"{p}to_{c}.weight"].T + hf[f"{p}to_{c}.bias"] for c in "kv")
    reference = _attention(q, k, v, 32, 1 / math.sqrt(48)) @ hf[p + "to_out.0.weight"].T + hf[p + "to_out.0.bias"]
    q = x @ ours[n + "to_q_padded.weight"] + ours[n + "to_q_padded.bias"]
    k, v = (kv_source @ ours[f"{n}to_{c}_padded.weight"] + ours[f"{n}to_{c}_padded.bias"] for c in "kv")
    assert q.shape == (17, 32 * 64) and k.shape == (40 if kv_dim == 2048 else 17, 32 * 64)
    padded = _attention(q, k, v, 32, 1 / math.sqrt(48)) @ ours[n + "to_out_padded.0.weight"] + ours[n + "to_out.0.bias"]
    _close(padded, reference)


def test_without_device_files_the_reload_builds_the_same_ttnn_tensors(snapshots, tmp_path):
    """The bf16 plan keeps no .tensorbin: a reload builds the ttnn host tensors from the bf16 chunks. Each must
    hold the plain reload's values, and equal ttnn's own `from_torch` of them, serialized byte for byte."""
    convert(ConvertOptions("n16", "bf16", embodiments="gr1", snapshot=snapshots["n16"], cache_root=tmp_path, progress=False))
    host = load("n16", tmp_path, "gr1", profile="bf16", ttnn_host=True)
    values = load("n16", tmp_path, "gr1", profile="bf16").tensors
    checked = 0
    for name, mine in host.tensors.items():
        if isinstance(mine, torch.Tensor):  # host-only targets stay torch float32
            continue
        bits = values[name].view(torch.int16).numpy().view(np.uint16)
        assert (mine.dtype, mine.layout) == (ttnn.bfloat16, ttnn.TILE_LAYOUT), name
        assert torch.equal(ttnn.to_torch(mine).view(torch.int16), values[name].view(torch.int16)), name
        theirs = ttnn.from_torch(torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16), dtype=ttnn.bfloat16,
                                 layout=ttnn.TILE_LAYOUT)
        ttnn.dump_tensor(str(tmp_path / "mine.tensorbin"), mine)
        ttnn.dump_tensor(str(tmp_path / "theirs.tensorbin"), theirs)
        assert (tmp_path / "mine.tensorbin").read_bytes() == (tmp_path / "theirs.tensorbin").read_bytes(), name
        checked += 1
    assert checked > 900
