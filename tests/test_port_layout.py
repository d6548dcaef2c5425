"""Each version's default Tenstorrent layout against an oracle of tt-metal's GR00T N1.6 port (devkit/port_oracle.py),
bit for bit: N1.6 takes the port's own tensors, N1.5 and N1.7 its conventions extended family by family.

Every target must equal the oracle's tensor (bf16 values before packing, and the ttnn host tensor: dtype, layout,
shapes, `to_torch`), and the oracle must have no tensor the converter lacks. Then, in float32 on the host, the laid-out
weights must compute the same function as the HF modules: attention with padded heads, fused q|k|v, and patch
embeddings (Conv2d, Conv3d) used as linears.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import ttnn
import zarr
from diffusers.models.attention import BasicTransformerBlock

from pipeline.jobs.convert import ConvertOptions, convert
from pipeline.inputs.embodiments import Embodiments
from pipeline.jobs.load import load
from pipeline.model.recipe import build_plan
from pipeline.inputs.snapshot import resolve_snapshot
from pipeline.inputs.synth import synthesize
from pipeline.model.versions import load_config
from tasks.errors import ConfigError
from devkit.port_oracle import HOST, PREFIXES, hf_state, port_oracle
from tests.zarr_values import values

DEFAULT_LAYOUT = {"n15": "tt-port", "n16": "tt-n16", "n17": "tt-port"}


def _cached(group, name: str) -> torch.Tensor:
    """Our stored values, read through zarr-python (an independent reader of the cache format): bf16 bits, or a
    host table's float32."""
    stored = torch.from_numpy(np.ascontiguousarray(values(group[name])))
    return stored if stored.dtype == torch.float32 else stored.view(torch.bfloat16)


@dataclass(frozen=True)
class Converted:
    version: str
    scale: str
    snapshot: Path
    root: Path
    entry: Path
    slots: list[int]   # the slots converted
    slot: int          # the one the ttnn host tensors are loaded for


@pytest.fixture(scope="module")
def converted(snapshots, tmp_path_factory):
    """(version, scale) -> that synthetic snapshot converted with the version's defaults, once per module. tiny:
    every key and all 32 slots; attn: the real attention shapes, one or two layers per stack, two slots."""
    made: dict[tuple[str, str], Converted] = {}

    def get(version: str, scale: str) -> Converted:
        if (version, scale) not in made:
            if scale == "tiny":
                snapshot, slots, slot = snapshots[version], list(range(32)), 20
            else:
                hf = tmp_path_factory.mktemp(f"hf-{scale}-{version}")
                synthesize(version, hf, scale)
                snapshot, slots, slot = resolve_snapshot(load_config(version), hf_cache=hf, synthetic=scale), [0, 1], 1
            root = tmp_path_factory.mktemp(f"cache-{scale}-{version}")
            summary = convert(ConvertOptions(version, embodiments=",".join(map(str, slots)), snapshot=snapshot,
                                             cache_root=root, progress=False))
            assert (summary["layout"], summary["profile"]) == (DEFAULT_LAYOUT[version], "port")  # the defaults
            made[version, scale] = Converted(version, scale, snapshot, root, Path(summary["cache_path"]), slots, slot)
        return made[version, scale]
    return get


def _conformance(c: Converted) -> int:
    """Every target of the entry against the oracle, bit for bit; returns how many there are."""
    slots, slot = c.slots, c.slot
    oracle = port_oracle(hf_state(c.snapshot), dict(load_config(c.version).dims_for(c.scale)), slots, c.version)
    manifest = json.loads((c.entry / "MANIFEST.json").read_text())["arrays"]
    assert sorted(manifest) == sorted(oracle)  # the same tensors, no more and no fewer
    host = load(c.version, c.root, embodiment=slot, into="ttnn")
    group = zarr.open_group(str(c.entry), mode="r")
    assert sorted(host.tensors) == sorted(oracle)
    for name, (expected, dtype) in oracle.items():
        attrs = manifest[name]["attributes"]
        ours = _cached(group, name)
        if attrs["embodiment_bank"]:
            expected = torch.stack(expected)
        if dtype == HOST:  # stored as the port's float32, and handed out as it is
            assert attrs["host_only"] and attrs["device_layout"] == "HOST", name
            assert host.tensors[name].dtype == torch.float32 and torch.equal(host.tensors[name], expected), name
            assert ours.dtype == torch.float32 and torch.equal(ours, expected), name
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


# Targets at tiny scale (it keeps every key), counted from ../shared/reference/gr00t-checkpoints.md: N1.6 986 as
# the port builds it; N1.5 899 keys less the 11-tensor SigLIP head and lm_head, with q|k|v fused in each of 27
# SigLIP layers (weights and biases: 4 fewer each); N1.7 1031 keys less lm_head (its qkv is stored fused).
@pytest.mark.parametrize("version,targets", [("n15", 899 - 11 - 1 - 27 * 4), ("n16", 986), ("n17", 1031 - 1)])
def test_the_default_layout_equals_the_port_oracle_at_tiny_scale(converted, version, targets):
    assert _conformance(converted(version, "tiny")) == targets


@pytest.mark.parametrize("version", ["n15", "n16", "n17"])
def test_the_default_layout_equals_the_port_oracle_at_real_attention_shapes(converted, version):
    assert _conformance(converted(version, "attn")) > 80


def _weights(version: str, root: Path) -> dict[str, torch.Tensor]:
    return {k: v.float() for k, v in load(version, root, embodiment=0).tensors.items()}


def _hf(snapshot: Path) -> dict[str, torch.Tensor]:
    return {k: v.float() for k, v in hf_state(snapshot).items()}


def _attention(q, k, v, heads, scale):
    """Multi-head attention over [seq, heads*d] projections, heads split on the last dim."""
    split = lambda x: x.reshape(x.shape[0], heads, -1).transpose(0, 1)  # noqa: E731
    ctx = F.scaled_dot_product_attention(split(q), split(k), split(v), scale=scale)
    return ctx.transpose(0, 1).reshape(q.shape[0], -1)


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    # float32 on both sides; zero padding adds exact zeros, so only summation order differs
    assert a.shape == b.shape, (a.shape, b.shape)
    assert torch.allclose(a, b, rtol=1e-4, atol=1e-5 * float(b.abs().max())), float((a - b).abs().max())


@pytest.mark.parametrize("version", ["n15", "n16"])
def test_padded_siglip_attention_computes_the_same_function(converted, version):
    c = converted(version, "attn")
    ours, hf = _weights(version, c.root), _hf(c.snapshot)
    p = PREFIXES[version]["vision"] + "encoder.layers.0.self_attn."
    x = torch.randn(64, 1152, generator=torch.Generator().manual_seed(0))
    q, k, v = (x @ hf[f"{p}{n}_proj.weight"].T + hf[f"{p}{n}_proj.bias"] for n in "qkv")
    reference = _attention(q, k, v, 16, 1 / math.sqrt(72)) @ hf[p + "out_proj.weight"].T + hf[p + "out_proj.bias"]
    n = "vision.encoder.layers.0.self_attn."
    qkv = x @ ours[n + "qkv_padded.weight"] + ours[n + "qkv_padded.bias"]
    assert qkv.shape == (64, 3 * 16 * 96)
    q, k, v = qkv.split(16 * 96, dim=1)
    padded = _attention(q, k, v, 16, 1 / math.sqrt(72)) @ ours[n + "out_proj_padded.weight"] + ours[n + "out_proj.bias"]
    _close(padded, reference)


def test_siglip_conv2d_patch_embedding_is_the_laid_out_linear(converted):
    """N1.5 stores a Conv2d [1152, 3, 14, 14]; the N1.6 port takes a linear over each patch's (c, h, w) pixels."""
    c = converted("n15", "attn")
    ours, hf = _weights("n15", c.root), _hf(c.snapshot)
    p = PREFIXES["n15"]["vision"] + "embeddings.patch_embedding."
    assert hf[p + "weight"].shape == (1152, 3, 14, 14)
    image = torch.randn(1, 3, 56, 56, generator=torch.Generator().manual_seed(2))   # a 4 x 4 grid of patches
    reference = F.conv2d(image, hf[p + "weight"], hf[p + "bias"], stride=14).flatten(2)[0].T   # [16, 1152]
    patches = image.unfold(2, 14, 14).unfold(3, 14, 14).permute(0, 2, 3, 1, 4, 5).reshape(16, 3 * 14 * 14)
    n = "vision.embeddings.patch_embedding."
    _close(patches @ ours[n + "weight"] + ours[n + "bias"], reference)


def test_qwen3_vl_conv3d_patch_embedding_is_the_laid_out_linear(converted):
    """N1.7 stores a Conv3d [1024, 3, 2, 16, 16] that HF applies to patches given flat, [N, 3 * 2 * 16 * 16]."""
    c = converted("n17", "attn")
    ours, hf = _weights("n17", c.root), _hf(c.snapshot)
    p = PREFIXES["n17"]["vision"] + "patch_embed.proj."
    assert hf[p + "weight"].shape == (1024, 3, 2, 16, 16)
    flat = torch.randn(24, 1536, generator=torch.Generator().manual_seed(3))
    # Qwen3VLVisionPatchEmbed.forward: view as [N, c, t, h, w], Conv3d with stride = kernel, view as [N, 1024]
    reference = F.conv3d(flat.view(-1, 3, 2, 16, 16), hf[p + "weight"], hf[p + "bias"], stride=(2, 16, 16)).view(-1, 1024)
    _close(flat @ ours["vision.patch_embed.proj.weight"] + ours["vision.patch_embed.proj.bias"], reference)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on [seq, heads, d] (rotate-half, as Qwen3-VL's vision tower applies it to q and k)."""
    half = x.shape[-1] // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + turned * sin[:, None, :]


def test_qwen3_vl_fused_qkv_attention_computes_the_same_function(converted):
    """16 heads x 64 in q|k|v order: the port's fused-qkv convention with nothing to pad (64 is tile-aligned)."""
    c = converted("n17", "attn")
    ours, hf = _weights("n17", c.root), _hf(c.snapshot)
    p = PREFIXES["n17"]["vision"] + "blocks.0.attn."
    assert hf[p + "qkv.weight"].shape == (3072, 1024)
    gen = torch.Generator().manual_seed(4)
    x, angles = torch.randn(48, 1024, generator=gen), torch.rand(48, 32, generator=gen) * 6
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)

    def attend(q, k, v):  # [seq, heads, 64] each -> [seq, 1024]
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        ctx = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1))
        return ctx.transpose(0, 1).reshape(48, 1024)
    # Qwen3VLVisionAttention.forward: qkv(x).reshape(seq, 3, heads, -1).permute(1, 0, 2, 3).unbind(0)
    q, k, v = (x @ hf[p + "qkv.weight"].T + hf[p + "qkv.bias"]).reshape(48, 3, 16, 64).permute(1, 0, 2, 3).unbind(0)
    reference = attend(q, k, v) @ hf[p + "proj.weight"].T + hf[p + "proj.bias"]
    n = "vision.blocks.0.attn."
    q, k, v = ((x @ ours[n + "qkv.weight"] + ours[n + "qkv.bias"]).split(1024, dim=1))   # the port: split, then heads
    laid_out = attend(*(t.reshape(48, 16, 64) for t in (q, k, v))) @ ours[n + "proj.weight"] + ours[n + "proj.bias"]
    _close(laid_out, reference)


@pytest.mark.parametrize("version,scale", [("n15", "attn"), ("n17", "attn"), ("n17", "tiny")],
                         ids=["n15-32x64", "n17-32x64", "n17-tiny-4x16-padded"])
def test_vl_self_attention_block_computes_what_diffusers_computes(converted, version, scale):
    """One `vl_self_attention` block (a diffusers BasicTransformerBlock) with the HF weights, against the same block
    computed from the laid-out ones. At 32 x 64 the head padding is a no-op; at tiny scale (4 x 16) it pads to 64."""
    c = converted(version, scale)
    ours, hf = _weights(version, c.root), _hf(c.snapshot)
    dims = load_config(version).dims_for(scale)
    heads, hd = dims["vlsa_heads"], dims["vlsa_head_dim"]
    p = "action_head.vl_self_attention.transformer_blocks.0."
    block = BasicTransformerBlock(heads * hd, heads, hd, activation_fn="gelu-approximate", attention_bias=True,
                                  norm_type="layer_norm", norm_elementwise_affine=True)
    block.load_state_dict({k[len(p):]: v for k, v in hf.items() if k.startswith(p)}, strict=True)
    x = torch.randn(1, 40, heads * hd, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        reference = block(x)[0]

    n, h = "vl_self_attention.transformer_blocks.0.", x[0]
    norm = lambda t, name: F.layer_norm(t, (heads * hd,), ours[n + name + ".weight"][0], ours[n + name + ".bias"][0])  # noqa: E731
    a = n + "attn1."
    y = norm(h, "norm1")
    q, k, v = (y @ ours[f"{a}to_{proj}_padded.weight"] + ours[f"{a}to_{proj}_padded.bias"] for proj in "qkv")
    assert q.shape == (40, heads * 64)
    h = h + _attention(q, k, v, heads, 1 / math.sqrt(hd)) @ ours[a + "to_out_padded.0.weight"] + ours[a + "to_out.0.bias"]
    y = norm(h, "norm3")
    y = F.gelu(y @ ours[n + "ff.net.0.proj.weight"] + ours[n + "ff.net.0.proj.bias"], approximate="tanh")
    _close(h + y @ ours[n + "ff.net.2.weight"] + ours[n + "ff.net.2.bias"], reference)


@pytest.mark.parametrize("block,kv_dim", [(0, 2048), (1, 1536)], ids=["cross-attention", "self-attention"])
def test_padded_dit_attention_computes_the_same_function(converted, block, kv_dim):
    c = converted("n16", "attn")
    ours, hf = _weights("n16", c.root), _hf(c.snapshot)
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


@pytest.mark.parametrize("version", ["n15", "n16", "n17"])
def test_the_hidden_traps_hold_in_the_default_layout(version):
    """Bank slots keep [in, out] (never transposed), N1.5's future_tokens [32, 1536] is a table and not a bank, the
    tied lm_head is skipped with its reason, and N1.7 knows only its own tags."""
    cfg = load_config(version)
    shapes = {k: tuple(v) for k, v in _full_shapes(version).items()}
    plan = build_plan(version, shapes)
    targets = {t.sources[0]: t for t in plan.targets}
    for key in cfg.embodiment_keys:
        t = targets[key]
        assert t.embodiment and t.transform in ("slot", "slot_row"), key
        assert t.shape == shapes[key][1:] if key.endswith(".W") else t.shape == (1, shapes[key][1]), key
    assert "tied" in plan.skipped[cfg.containers["lm_head"] + "weight"]
    if version == "n15":
        future = targets["action_head.future_tokens.weight"]
        assert not future.embodiment and future.shape == (1, 32, 1536)
    if version == "n17":  # its tags are its own: N1.6's gr1 (slot 24 there) is no N1.7 tag
        with pytest.raises(ConfigError, match="unknown embodiment tag 'gr1' for n17"):
            Embodiments.parse("gr1").slots(cfg)
        assert Embodiments.parse("oxe_droid_relative_eef_relative_joint").slots(cfg) == (24,)


def _full_shapes(version: str) -> dict[str, tuple[int, ...]]:
    from pipeline.model.state_dict import tensor_specs
    return {s.key: s.shape for s in tensor_specs(version)}


def test_without_device_files_the_reload_builds_the_same_ttnn_tensors(snapshots, tmp_path):
    """The bf16 plan keeps no .tensorbin: a reload builds the ttnn host tensors from the bf16 chunks. Each must
    hold the plain reload's values, and equal ttnn's own `from_torch` of them, serialized byte for byte."""
    convert(ConvertOptions("n16", profile="bf16", embodiments="gr1", snapshot=snapshots["n16"], cache_root=tmp_path, progress=False))
    host = load("n16", tmp_path, "gr1", profile="bf16", into="ttnn")
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
