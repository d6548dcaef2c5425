"""An oracle of tt-metal's GR00T N1.6 port (tenstorrent/tt-metal models/experimental/gr00t_n1_6/), written from
reading its files, in torch, sharing no code with the converter: HF tensors from `load_file`, then the port's
preprocessing, giving what its constructors hand to `ttnn.from_torch` (with the dtype they pass, TILE layout) or
keep on the host as float32.

Files read: common/weight_loader.py @ 2426d3215a34 (the component prefixes), tt/ttnn_common.py (preprocess_linear_weight
= w.T, bfloat8_b unless told; bias and norm helpers = [1, n] bf16), tt/ttnn_siglip2.py @ 1848703b045a (fused q|k|v,
heads padded 72 -> 96, out_proj input padded), tt/ttnn_qwen3.py @ 27d1f0c873f9 (separate bf16 projections;
q_norm/k_norm/embed_tokens float32 on the host), tt/ttnn_dit.py and tt/ttnn_dit_optimized.py @ 2426d3215a34
(to_q/k/v padded 48 -> 64, to_out.0 input padded, the rest bfloat8_b), tt/ttnn_embodiment.py @ 2426d3215a34 (W[e]
as stored, b[e] as [1, out], bf16), tt/ttnn_groot_n16_model.py @ b0e433734eb8 (connector, vlln, position embedding).

N1.5 and N1.7 have no port. For them the oracle states the port's conventions applied family by family, from the
checkpoint facts (../shared/reference/gr00t-checkpoints.md §2.3, §4.3), written here on their own: N1.5's SigLIP is
N1.6's (its Conv2d patch embedding flattened to the N1.6 linear's [1152, 588]); the Qwen3-VL vision tower is
SigLIP2's family (qkv stored fused in q|k|v order with 64-wide heads, so no padding; the Conv3d patch embedding
flattened to a linear over c*t*h*w inputs; pos_embed like position_embedding); `vl_self_attention` is the DiT
attention's (heads padded to 64, a no-op at 64) with DiT FFN linears; N1.5's connector is the N1.6 connector's
linear, `future_tokens` a position table.
Used by tests/test_port_layout.py (conformance) and by the bench (the port's own load path as a contender).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

BF8, BF16 = "bfloat8_b", "bfloat16"
HOST = "host"
PREFIXES = {  # the port's weight groups (common/weight_loader.py), and where each version keeps them
    "n15": {"vision": "backbone.eagle_model.vision_model.vision_model.", "language": "backbone.eagle_model.language_model.",
            "connector": "backbone.eagle_model.mlp1."},
    "n16": {"vision": "backbone.model.vision_model.vision_model.", "language": "backbone.model.language_model.",
            "connector": "backbone.model.mlp1."},
    "n17": {"vision": "backbone.model.model.visual.", "language": "backbone.model.model.language_model."},
}


def hf_state(snapshot: Path) -> dict[str, torch.Tensor]:
    index = json.loads((snapshot / "model.safetensors.index.json").read_text())
    state: dict[str, torch.Tensor] = {}
    for shard in sorted(set(index["weight_map"].values())):
        state.update(load_file(str(snapshot / shard)))
    return state


def _group(state: dict, prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


def _linear(w):             # preprocess_linear_weight: [out, in] -> [in, out]; a conv flattened to [out, c*k*k...] first
    return w.reshape(w.shape[0], -1).t().contiguous().to(torch.bfloat16)


def _row(b):                # preprocess_linear_bias, preprocess_layernorm_params, preprocess_rmsnorm_params
    return b.unsqueeze(0).to(torch.bfloat16)


def _table(t):              # position tables: unsqueeze(0), bf16 TILE
    return t.unsqueeze(0).to(torch.bfloat16)


def _pad_out_heads(w, heads, hd, padded):   # q/k/v: each head's output rows followed by zeros
    return F.pad(w.reshape(heads, hd, -1), (0, 0, 0, padded - hd)).reshape(heads * padded, -1)


def _pad_in_heads(w, heads, hd, padded):    # output projection: each head's input columns followed by zeros
    return F.pad(w.reshape(w.shape[0], heads, hd), (0, padded - hd)).reshape(w.shape[0], heads * padded)


def _pad_bias(b, heads, hd, padded):
    return F.pad(b.reshape(heads, hd), (0, padded - hd)).reshape(-1)


def _linear_and_bias(out: dict, name: str, group: dict, key: str, dtype: str = BF8) -> None:
    out[f"{name}.weight"] = (_linear(group[f"{key}.weight"]), dtype)
    out[f"{name}.bias"] = (_row(group[f"{key}.bias"]), BF16)


def _norm(out: dict, name: str, group: dict, key: str) -> None:
    for part in ("weight", "bias"):
        out[f"{name}.{part}"] = (_row(group[f"{key}.{part}"]), BF16)


def _padded_attention(out: dict, name: str, group: dict, key: str, heads: int, hd: int, padded: int) -> None:
    """The DiT attention's convention: to_q/to_k/to_v each padded per head, to_out.0's input padded, all bf16."""
    for x in ("to_q", "to_k", "to_v"):
        out[f"{name}{x}_padded.weight"] = (_linear(_pad_out_heads(group[f"{key}{x}.weight"], heads, hd, padded)), BF16)
        out[f"{name}{x}_padded.bias"] = (_row(_pad_bias(group[f"{key}{x}.bias"], heads, hd, padded)), BF16)
    out[f"{name}to_out_padded.0.weight"] = (_linear(_pad_in_heads(group[f"{key}to_out.0.weight"], heads, hd, padded)), BF16)
    out[f"{name}to_out.0.bias"] = (_row(group[f"{key}to_out.0.bias"]), BF16)


def _siglip(out: dict, vision: dict, dims: dict) -> None:
    heads, hd = dims["vision_heads"], dims["vision_head_dim"]
    _linear_and_bias(out, "vision.embeddings.patch_embedding", vision, "embeddings.patch_embedding")
    out["vision.embeddings.position_embedding.weight"] = (_table(vision["embeddings.position_embedding.weight"]), BF16)
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
            _norm(out, n + norm, vision, p + norm)
        for fc in ("mlp.fc1", "mlp.fc2"):
            _linear_and_bias(out, n + fc, vision, p + fc)
    _norm(out, "vision.post_layernorm", vision, "post_layernorm")


def _qwen3_vl_vision(out: dict, vision: dict, dims: dict) -> None:
    _linear_and_bias(out, "vision.patch_embed.proj", vision, "patch_embed.proj")
    out["vision.pos_embed.weight"] = (_table(vision["pos_embed.weight"]), BF16)
    for i in range(dims["vision_layers"]):
        p = f"blocks.{i}."
        for norm in ("norm1", "norm2"):
            _norm(out, f"vision.{p}{norm}", vision, p + norm)
        for lin in ("attn.qkv", "attn.proj", "mlp.linear_fc1", "mlp.linear_fc2"):
            _linear_and_bias(out, f"vision.{p}{lin}", vision, p + lin)
    mergers = ["merger."] + [f"deepstack_merger_list.{j}." for j in range(dims["deepstack_mergers"])]
    for m in mergers:
        _norm(out, f"vision.{m}norm", vision, m + "norm")
        for lin in ("linear_fc1", "linear_fc2"):
            _linear_and_bias(out, f"vision.{m}{lin}", vision, m + lin)


def _qwen3(out: dict, language: dict, dims: dict, inner: str) -> None:
    """`inner` is "model." where the group holds the CausalLM (N1.5, N1.6), "" where it holds the text model."""
    n = "language." + inner
    out[n + "embed_tokens.weight"] = (language[inner + "embed_tokens.weight"].to(torch.float32), HOST)
    for i in range(dims["llm_layers"]):
        p = f"{inner}layers.{i}."
        for proj in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                     "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
            out[f"language.{p}{proj}.weight"] = (_linear(language[f"{p}{proj}.weight"]), BF16)
        for norm in ("self_attn.q_norm", "self_attn.k_norm"):
            out[f"language.{p}{norm}.weight"] = (language[f"{p}{norm}.weight"].to(torch.float32), HOST)
        for norm in ("input_layernorm", "post_attention_layernorm"):
            out[f"language.{p}{norm}.weight"] = (_row(language[f"{p}{norm}.weight"]), BF16)
    out[n + "norm.weight"] = (_row(language[inner + "norm.weight"]), BF16)


def _dit(out: dict, dit: dict, dims: dict) -> None:
    heads, hd = dims["dit_heads"], dims["dit_head_dim"]
    for i in range(dims["dit_layers"]):
        p = f"transformer_blocks.{i}."
        for lin in ("norm1.linear", "ff.net.0.proj", "ff.net.2"):
            _linear_and_bias(out, f"dit.{p}{lin}", dit, p + lin)
        _padded_attention(out, f"dit.{p}attn1.", dit, p + "attn1.", heads, hd, 64)
    for lin in ("proj_out_1", "proj_out_2", "timestep_encoder.timestep_embedder.linear_1",
                "timestep_encoder.timestep_embedder.linear_2"):
        _linear_and_bias(out, f"dit.{lin}", dit, lin)


def _vl_self_attention(out: dict, vlsa: dict, dims: dict) -> None:
    for i in range(dims["vlsa_layers"]):
        p = f"transformer_blocks.{i}."
        n = "vl_self_attention." + p
        for norm in ("norm1", "norm3"):
            _norm(out, n + norm, vlsa, p + norm)
        _padded_attention(out, n + "attn1.", vlsa, p + "attn1.", dims["vlsa_heads"], dims["vlsa_head_dim"], 64)
        for lin in ("ff.net.0.proj", "ff.net.2"):
            _linear_and_bias(out, n + lin, vlsa, p + lin)


def _action_head(out: dict, state: dict, slots) -> None:
    for component, layers in (("state_encoder", ("layer1", "layer2")), ("action_encoder", ("W1", "W2", "W3")),
                              ("action_decoder", ("layer1", "layer2"))):
        group = _group(state, f"action_head.{component}.")
        for layer in layers:  # one device tensor per slot: W[e] as stored (never transposed), b[e] as [1, out]
            out[f"{component}.{layer}.W"] = ([group[f"{layer}.W"][e].to(torch.bfloat16) for e in slots], BF16)
            out[f"{component}.{layer}.b"] = ([_row(group[f"{layer}.b"][e]) for e in slots], BF16)
    _norm(out, "vlln", _group(state, "action_head."), "vlln")
    out["position_embedding.weight"] = (_table(state["action_head.position_embedding.weight"]), BF16)


def port_oracle(state: dict, dims: dict, slots, version: str = "n16") -> dict[str, tuple[torch.Tensor | list[torch.Tensor], str]]:
    """name -> (tensor the port hands to ttnn.from_torch (bf16) or keeps on the host (float32), dtype); an
    embodiment bank gives one tensor per slot in `slots`, as the port builds one device tensor per slot."""
    out: dict[str, tuple[torch.Tensor, str]] = {}
    groups = {name: _group(state, prefix) for name, prefix in PREFIXES[version].items()}
    if version == "n17":
        _qwen3_vl_vision(out, groups["vision"], dims)
        _qwen3(out, groups["language"], dims, inner="")
    else:
        _siglip(out, groups["vision"], dims)
        _qwen3(out, groups["language"], dims, inner="model.")
    connector = groups.get("connector", {})
    if version == "n16":  # LayerNorm over the pixel-shuffled features, then two linears
        _norm(out, "connector.0", connector, "0")
        for layer in ("1", "3"):
            _linear_and_bias(out, f"connector.{layer}", connector, layer)
    elif version == "n15":  # one linear
        _linear_and_bias(out, "connector.0", connector, "0")
        out["future_tokens.weight"] = (_table(state["action_head.future_tokens.weight"]), BF16)
    _dit(out, _group(state, "action_head.model."), dims)
    if version != "n16":
        _vl_self_attention(out, _group(state, "action_head.vl_self_attention."), dims)
    _action_head(out, state, slots)
    return out
