"""The tt-n16 layout against an oracle of tt-metal's GR00T N1.6 port, bit for bit.

The oracle below is written from reading the port (tenstorrent/tt-metal models/experimental/gr00t_n1_6/:
common/weight_loader.py, tt/ttnn_common.py, tt/ttnn_siglip2.py, tt/ttnn_qwen3.py, tt/ttnn_dit.py,
tt/ttnn_dit_optimized.py, tt/ttnn_embodiment.py, tt/ttnn_groot_n16_model.py): HF tensors from `load_file`, the
port's preprocessing in torch, then `ttnn.from_torch` with the port's dtype and TILE layout. It shares no code with
the converter. Every target must equal the oracle's tensor (bf16 values before packing, and the ttnn host tensor:
dtype, layout, shapes, `to_torch`), and the oracle must have no tensor the converter lacks.
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
from safetensors.torch import load_file

from pipeline.convert import ConvertOptions, convert
from pipeline.load import load
from pipeline.snapshot import resolve_snapshot
from pipeline.synth import synthesize
from pipeline.versions import load_config

BF8, BF16 = "bfloat8_b", "bfloat16"
HOST = "host"


def _hf_state(snapshot: Path) -> dict[str, torch.Tensor]:
    index = json.loads((snapshot / "model.safetensors.index.json").read_text())
    state: dict[str, torch.Tensor] = {}
    for shard in sorted(set(index["weight_map"].values())):
        state.update(load_file(str(snapshot / shard)))
    return state


def _group(state: dict, prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


def _linear(w):             # preprocess_linear_weight: [out, in] -> [in, out]
    return w.t().contiguous().to(torch.bfloat16)


def _row(b):                # preprocess_linear_bias, preprocess_layernorm_params, preprocess_rmsnorm_params
    return b.unsqueeze(0).to(torch.bfloat16)


def _pad_out_heads(w, heads, hd, padded):   # q/k/v: each head's output rows followed by zeros
    return F.pad(w.reshape(heads, hd, -1), (0, 0, 0, padded - hd)).reshape(heads * padded, -1)


def _pad_in_heads(w, heads, hd, padded):    # output projection: each head's input columns followed by zeros
    return F.pad(w.reshape(w.shape[0], heads, hd), (0, padded - hd)).reshape(w.shape[0], heads * padded)


def _pad_bias(b, heads, hd, padded):
    return F.pad(b.reshape(heads, hd), (0, padded - hd)).reshape(-1)


def port_oracle(state: dict, dims: dict, slots: list[int]) -> dict[str, tuple[torch.Tensor, str]]:
    """name -> (tensor the port hands to ttnn.from_torch (bf16) or keeps on the host (float32), dtype)."""
    out: dict[str, tuple[torch.Tensor, str]] = {}
    vision = _group(state, "backbone.model.vision_model.vision_model.")
    heads, hd = dims["vision_heads"], dims["vision_head_dim"]
    out["vision.embeddings.patch_embedding.weight"] = (_linear(vision["embeddings.patch_embedding.weight"]), BF8)
    out["vision.embeddings.patch_embedding.bias"] = (_row(vision["embeddings.patch_embedding.bias"]), BF16)
    out["vision.embeddings.position_embedding.weight"] = (
        vision["embeddings.position_embedding.weight"].unsqueeze(0).to(torch.bfloat16), BF16)
    for i in range(dims["vision_layers"]):
        p, n = f"encoder.layers.{i}.", f"vision.encoder.layers.{i}."
        a = p + "self_attn."
        qkv = torch.cat([_pad_out_heads(vision[f"{a}{x}_proj.weight"], heads, hd, 96) for x in "qkv"])
        qkv_b = torch.cat([_pad_bias(vision[f"{a}{x}_proj.bias"], heads, hd, 96) for x in "qkv"])
        out[n + "self_attn.qkv_padded.weight"] = (_linear(qkv), BF8)
        out[n + "self_attn.qkv_padded.bias"] = (_row(qkv_b), BF16)
        out[n + "self_attn.out_proj_padded.weight"] = (_linear(_pad_in_heads(vision[a + "out_proj.weight"], heads, hd, 96)), BF8)
        out[n + "self_attn.out_proj.bias"] = (_row(vision[a + "out_proj.bias"]), BF16)
        for norm in ("layer_norm1", "layer_norm2"):
            for part in ("weight", "bias"):
                out[f"{n}{norm}.{part}"] = (_row(vision[f"{p}{norm}.{part}"]), BF16)
        for fc in ("mlp.fc1", "mlp.fc2"):
            out[f"{n}{fc}.weight"] = (_linear(vision[f"{p}{fc}.weight"]), BF8)
            out[f"{n}{fc}.bias"] = (_row(vision[f"{p}{fc}.bias"]), BF16)
    for part in ("weight", "bias"):
        out[f"vision.post_layernorm.{part}"] = (_row(vision[f"post_layernorm.{part}"]), BF16)

    language = _group(state, "backbone.model.language_model.")
    out["language.model.embed_tokens.weight"] = (language["model.embed_tokens.weight"].to(torch.float32), HOST)
    for i in range(dims["llm_layers"]):
        p = f"model.layers.{i}."
        for proj in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                     "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
            out[f"language.{p}{proj}.weight"] = (_linear(language[f"{p}{proj}.weight"]), BF16)
        for norm in ("self_attn.q_norm", "self_attn.k_norm"):
            out[f"language.{p}{norm}.weight"] = (language[f"{p}{norm}.weight"].to(torch.float32), HOST)
        for norm in ("input_layernorm", "post_attention_layernorm"):
            out[f"language.{p}{norm}.weight"] = (_row(language[f"{p}{norm}.weight"]), BF16)
    out["language.model.norm.weight"] = (_row(language["model.norm.weight"]), BF16)

    connector = _group(state, "backbone.model.mlp1.")
    out["connector.0.weight"], out["connector.0.bias"] = (_row(connector["0.weight"]), BF16), (_row(connector["0.bias"]), BF16)
    for layer in ("1", "3"):
        out[f"connector.{layer}.weight"] = (_linear(connector[f"{layer}.weight"]), BF8)
        out[f"connector.{layer}.bias"] = (_row(connector[f"{layer}.bias"]), BF16)
    vlln = _group(state, "action_head.vlln.")
    out["vlln.weight"], out["vlln.bias"] = (_row(vlln["weight"]), BF16), (_row(vlln["bias"]), BF16)

    dit = _group(state, "action_head.model.")
    heads, hd = dims["dit_heads"], dims["dit_head_dim"]
    for i in range(dims["dit_layers"]):
        p = f"transformer_blocks.{i}."
        for lin in ("norm1.linear", "ff.net.0.proj", "ff.net.2"):
            out[f"dit.{p}{lin}.weight"] = (_linear(dit[f"{p}{lin}.weight"]), BF8)
            out[f"dit.{p}{lin}.bias"] = (_row(dit[f"{p}{lin}.bias"]), BF16)
        for x in ("to_q", "to_k", "to_v"):
            out[f"dit.{p}attn1.{x}_padded.weight"] = (_linear(_pad_out_heads(dit[f"{p}attn1.{x}.weight"], heads, hd, 64)), BF16)
            out[f"dit.{p}attn1.{x}_padded.bias"] = (_row(_pad_bias(dit[f"{p}attn1.{x}.bias"], heads, hd, 64)), BF16)
        out[f"dit.{p}attn1.to_out_padded.0.weight"] = (_linear(_pad_in_heads(dit[f"{p}attn1.to_out.0.weight"], heads, hd, 64)), BF16)
        out[f"dit.{p}attn1.to_out.0.bias"] = (_row(dit[f"{p}attn1.to_out.0.bias"]), BF16)
    for lin in ("proj_out_1", "proj_out_2", "timestep_encoder.timestep_embedder.linear_1",
                "timestep_encoder.timestep_embedder.linear_2"):
        out[f"dit.{lin}.weight"] = (_linear(dit[f"{lin}.weight"]), BF8)
        out[f"dit.{lin}.bias"] = (_row(dit[f"{lin}.bias"]), BF16)

    for component, layers in (("state_encoder", ("layer1", "layer2")), ("action_encoder", ("W1", "W2", "W3")),
                              ("action_decoder", ("layer1", "layer2"))):
        group = _group(state, f"action_head.{component}.")
        for layer in layers:  # one device tensor per slot: W[e] as stored (never transposed), b[e] as [1, out]
            out[f"{component}.{layer}.W"] = (torch.stack([group[f"{layer}.W"][e].to(torch.bfloat16) for e in slots]), BF16)
            out[f"{component}.{layer}.b"] = (torch.stack([_row(group[f"{layer}.b"][e]) for e in slots]), BF16)
    out["position_embedding.weight"] = (state["action_head.position_embedding.weight"].unsqueeze(0).to(torch.bfloat16), BF16)
    return out


def _cached_bf16(group, name: str) -> torch.Tensor:
    """Our stored values, read through zarr-python (an independent reader of the cache format)."""
    return torch.from_numpy(np.ascontiguousarray(group[name][...])).view(torch.bfloat16)


def _conformance(version: str, snapshot: Path, cache_root: Path, scale: str, slots: list[int], slot: int) -> int:
    summary = convert(ConvertOptions(version, embodiments=",".join(map(str, slots)), snapshot=snapshot,
                                     cache_root=cache_root, progress=False))
    assert (summary["layout"], summary["profile"]) == ("tt-n16", "port")  # n16's defaults
    entry = Path(summary["cache_path"])
    oracle = port_oracle(_hf_state(snapshot), dict(load_config(version).dims_for(scale)), slots)
    manifest = json.loads((entry / "MANIFEST.json").read_text())["arrays"]
    assert sorted(manifest) == sorted(oracle)  # the same tensors, no more and no fewer
    host = load(version, cache_root, embodiment=slot, ttnn_host=True)
    group = zarr.open_group(str(entry), mode="r")
    assert sorted(host.tensors) == sorted(oracle)
    for name, (expected, dtype) in oracle.items():
        attrs = manifest[name]["attributes"]
        ours = _cached_bf16(group, name)
        if dtype == HOST:  # stored bf16, handed out as the port's float32
            assert attrs["host_only"] and attrs["device_layout"] == "HOST", name
            assert host.tensors[name].dtype == torch.float32 and torch.equal(host.tensors[name], expected), name
            assert torch.equal(ours.float(), expected), name
            continue
        assert torch.equal(ours.view(torch.int16), expected.contiguous().view(torch.int16)), name
        assert attrs["device_dtype"] == dtype and attrs["device_layout"] == "TILE", name
        one = expected[slots.index(slot)] if attrs["embodiment_bank"] else expected
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
    return resolve_snapshot(load_config("n16"), hf_cache=hf)


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
    ours, hf = _weights(root), {k: v.float() for k, v in _hf_state(attn_snapshot).items()}
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
    ours, hf = _weights(root), {k: v.float() for k, v in _hf_state(attn_snapshot).items()}
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
