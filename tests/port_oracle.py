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


def hf_state(snapshot: Path) -> dict[str, torch.Tensor]:
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


def port_oracle(state: dict, dims: dict, slots) -> dict[str, tuple[torch.Tensor | list[torch.Tensor], str]]:
    """name -> (tensor the port hands to ttnn.from_torch (bf16) or keeps on the host (float32), dtype); an
    embodiment bank gives one tensor per slot in `slots`, as the port builds one device tensor per slot."""
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
            out[f"{component}.{layer}.W"] = ([group[f"{layer}.W"][e].to(torch.bfloat16) for e in slots], BF16)
            out[f"{component}.{layer}.b"] = ([_row(group[f"{layer}.b"][e]) for e in slots], BF16)
    out["position_embedding.weight"] = (state["action_head.position_embedding.weight"].unsqueeze(0).to(torch.bfloat16), BF16)
    return out
