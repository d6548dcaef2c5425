"""A version's state dict derived from its dims: every `(key, shape)` in state-dict order, and the key → shard map.
(Not a target layout: those are tt-n16, tt-port and generic, configs/recipes.toml.)

Each architecture family is one small generator of `(suffix, shape)` relative to its container prefix, in the
order the model registers its parameters (../shared/reference/gr00t-checkpoints.md). Shards follow Hugging Face's
rule: walk the state dict, close a shard when the next tensor would push it past `max_shard_size`.
The shard assignment of the `tiny` scale is the one computed at `full` scale, so a tiny checkpoint straddles
exactly where the real one does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from typing import Iterator, Mapping

from pipeline.model.versions import SCALES, VersionConfig, load_config
from tasks.io.bulk_write import nbytes
from tasks.errors import ConfigError

Shape = tuple[int, ...]


@dataclass(frozen=True)
class TensorSpec:
    key: str
    shape: Shape
    shard: str  # file name, e.g. model-00001-of-00002.safetensors

    @property
    def nbytes(self) -> int:
        return nbytes(self.shape)  # bf16: every GR00T release is bf16 throughout


def _linear(name: str, n_out: int, n_in: int, bias: bool = True) -> Iterator[tuple[str, Shape]]:
    yield f"{name}.weight", (n_out, n_in)
    if bias:
        yield f"{name}.bias", (n_out,)


def _norm(name: str, n: int, bias: bool = True) -> Iterator[tuple[str, Shape]]:
    yield f"{name}.weight", (n,)
    if bias:
        yield f"{name}.bias", (n,)


def _siglip(d: Mapping[str, int], patch_as_conv: bool) -> Iterator[tuple[str, Shape]]:
    h, m, p = d["vision_hidden"], d["vision_mlp"], d["patch"]
    yield "embeddings.patch_embedding.weight", (h, 3, p, p) if patch_as_conv else (h, 3 * p * p)
    yield "embeddings.patch_embedding.bias", (h,)
    yield "embeddings.position_embedding.weight", (d["vision_positions"], h)
    for i in range(d["vision_layers"]):
        pre = f"encoder.layers.{i}."
        yield from _norm(pre + "layer_norm1", h)
        for proj in ("k_proj", "v_proj", "q_proj", "out_proj"):
            yield from _linear(f"{pre}self_attn.{proj}", h, h)
        yield from _norm(pre + "layer_norm2", h)
        yield from _linear(pre + "mlp.fc1", m, h)
        yield from _linear(pre + "mlp.fc2", h, m)
    yield from _norm("post_layernorm", h)
    # The attention-pooling head: stored in every release, never used by GR00T.
    yield "head.probe", (1, 1, h)
    yield "head.attention.in_proj_weight", (3 * h, h)
    yield "head.attention.in_proj_bias", (3 * h,)
    yield from _linear("head.attention.out_proj", h, h)
    yield from _norm("head.layernorm", h)
    yield from _linear("head.mlp.fc1", m, h)
    yield from _linear("head.mlp.fc2", h, m)


def _qwen3_vl_vision(d: Mapping[str, int]) -> Iterator[tuple[str, Shape]]:
    h, m, p, out = d["vision_hidden"], d["vision_mlp"], d["patch"], d["llm_hidden"]
    merged = 4 * h  # 2x2 spatial merge
    yield "patch_embed.proj.weight", (h, 3, d["temporal_patch"], p, p)
    yield "patch_embed.proj.bias", (h,)
    yield "pos_embed.weight", (d["vision_positions"], h)
    for i in range(d["vision_layers"]):
        pre = f"blocks.{i}."
        yield from _norm(pre + "norm1", h)
        yield from _norm(pre + "norm2", h)
        yield from _linear(pre + "attn.qkv", 3 * h, h)
        yield from _linear(pre + "attn.proj", h, h)
        yield from _linear(pre + "mlp.linear_fc1", m, h)
        yield from _linear(pre + "mlp.linear_fc2", h, m)
    yield from _norm("merger.norm", h)
    yield from _linear("merger.linear_fc1", merged, merged)
    yield from _linear("merger.linear_fc2", out, merged)
    for i in range(d["deepstack_mergers"]):
        pre = f"deepstack_merger_list.{i}."
        yield from _norm(pre + "norm", merged)
        yield from _linear(pre + "linear_fc1", merged, merged)
        yield from _linear(pre + "linear_fc2", out, merged)


def _qwen3(d: Mapping[str, int]) -> Iterator[tuple[str, Shape]]:
    h, f, hd = d["llm_hidden"], d["llm_intermediate"], d["llm_head_dim"]
    yield "embed_tokens.weight", (d["llm_vocab"], h)
    for i in range(d["llm_layers"]):
        pre = f"layers.{i}."
        yield from _linear(pre + "self_attn.q_proj", d["llm_heads"] * hd, h, bias=False)
        yield from _linear(pre + "self_attn.k_proj", d["llm_kv_heads"] * hd, h, bias=False)
        yield from _linear(pre + "self_attn.v_proj", d["llm_kv_heads"] * hd, h, bias=False)
        yield from _linear(pre + "self_attn.o_proj", h, d["llm_heads"] * hd, bias=False)
        yield from _norm(pre + "self_attn.q_norm", hd, bias=False)
        yield from _norm(pre + "self_attn.k_norm", hd, bias=False)
        yield from _linear(pre + "mlp.gate_proj", f, h, bias=False)
        yield from _linear(pre + "mlp.up_proj", f, h, bias=False)
        yield from _linear(pre + "mlp.down_proj", h, f, bias=False)
        yield from _norm(pre + "input_layernorm", h, bias=False)
        yield from _norm(pre + "post_attention_layernorm", h, bias=False)
    yield from _norm("norm", h, bias=False)


def _projector(kind: str, d: Mapping[str, int]) -> Iterator[tuple[str, Shape]]:
    if kind == "mlp1_linear":
        yield from _linear("0", d["llm_hidden"], d["vision_hidden"])
    elif kind == "mlp1_pixel_shuffle":  # LayerNorm(4h) -> Linear(4h, llm) -> GELU -> Linear(llm, llm)
        shuffled = 4 * d["vision_hidden"]
        yield from _norm("0", shuffled)
        yield from _linear("1", d["llm_hidden"], shuffled)
        yield from _linear("3", d["llm_hidden"], d["llm_hidden"])
    else:
        raise ConfigError(f"unknown projector family {kind!r}")


def _dit_block(pre: str, inner: int, kv_in: int, ff: int) -> Iterator[tuple[str, Shape]]:
    yield from _linear(pre + "norm1.linear", 2 * inner, inner)
    yield from _linear(pre + "attn1.to_q", inner, inner)
    yield from _linear(pre + "attn1.to_k", inner, kv_in)
    yield from _linear(pre + "attn1.to_v", inner, kv_in)
    yield from _linear(pre + "attn1.to_out.0", inner, inner)
    yield from _linear(pre + "ff.net.0.proj", ff, inner)
    yield from _linear(pre + "ff.net.2", inner, ff)


def _bank(name: str, slots: int, n_in: int, n_out: int) -> Iterator[tuple[str, Shape]]:
    yield f"{name}.W", (slots, n_in, n_out)
    yield f"{name}.b", (slots, n_out)


def _action_head(kind: str, d: Mapping[str, int]) -> Iterator[tuple[str, Shape]]:
    inner, e, hid = d["dit_heads"] * d["dit_head_dim"], d["embodiments"], d["hidden_size"]
    yield from _linear("model.timestep_encoder.timestep_embedder.linear_1", inner, d["timestep_dim"])
    yield from _linear("model.timestep_encoder.timestep_embedder.linear_2", inner, inner)
    for i in range(d["dit_layers"]):  # even blocks cross-attend to the backbone, odd blocks self-attend
        kv_in = d["backbone_dim"] if i % 2 == 0 else inner
        yield from _dit_block(f"model.transformer_blocks.{i}.", inner, kv_in, 4 * inner)
    yield from _linear("model.proj_out_1", 2 * inner, inner)
    yield from _linear("model.proj_out_2", d["output_dim"], inner)
    yield from _bank("state_encoder.layer1", e, d["state_dim"], hid)
    yield from _bank("state_encoder.layer2", e, hid, inner)
    yield from _bank("action_encoder.W1", e, d["action_dim"], inner)
    yield from _bank("action_encoder.W2", e, 2 * inner, inner)
    yield from _bank("action_encoder.W3", e, inner, inner)
    yield from _bank("action_decoder.layer1", e, hid, hid)
    yield from _bank("action_decoder.layer2", e, hid, d["action_dim"])
    if kind == "dit_vlsa_future":
        yield "future_tokens.weight", (d["future_tokens"], inner)
    yield from _norm("vlln", d["backbone_dim"])
    if kind in ("dit_vlsa", "dit_vlsa_future"):
        dim = d["vlsa_heads"] * d["vlsa_head_dim"]
        for i in range(d["vlsa_layers"]):
            pre = f"vl_self_attention.transformer_blocks.{i}."
            yield from _norm(pre + "norm1", dim)
            for proj in ("to_q", "to_k", "to_v", "to_out.0"):
                yield from _linear(f"{pre}attn1.{proj}", dim, dim)
            yield from _norm(pre + "norm3", dim)
            yield from _linear(pre + "ff.net.0.proj", 4 * dim, dim)
            yield from _linear(pre + "ff.net.2", dim, 4 * dim)
    elif kind != "dit":
        raise ConfigError(f"unknown action-head family {kind!r}")
    yield "position_embedding.weight", (d["max_seq_len"], inner)


def _state_dict(cfg: VersionConfig, dims: Mapping[str, int]) -> list[tuple[str, Shape]]:
    """Every (key, shape) in state-dict (save) order: vision, LLM, lm_head, projector, action head."""
    c, arch = cfg.containers, cfg.architecture
    vision = {"siglip_conv": lambda: _siglip(dims, True), "siglip_linear": lambda: _siglip(dims, False),
              "qwen3_vl": lambda: _qwen3_vl_vision(dims)}[arch["vision"]]()
    parts = [(c["vision"], vision), (c["llm"], _qwen3(dims)),
             (c["lm_head"], iter([("weight", (dims["llm_vocab"], dims["llm_hidden"]))]))]
    if "projector" in arch:
        parts.append((c["projector"], _projector(arch["projector"], dims)))
    parts.append((c["action_head"], _action_head(arch["action_head"], dims)))
    return [(prefix + suffix, shape) for prefix, gen in parts for suffix, shape in gen]


def shard_names(n: int) -> list[str]:
    return [f"model-{k:05d}-of-{n:05d}.safetensors" for k in range(1, n + 1)]


def _assign_shards(entries: list[tuple[str, Shape]], max_bytes: int) -> list[int]:
    """Hugging Face's rule: a new shard starts when the next tensor would overflow a non-empty one."""
    shard_of, current, used = [], 0, 0
    for _, shape in entries:
        size = nbytes(shape)
        if used and used + size > max_bytes:
            current, used = current + 1, 0
        shard_of.append(current)
        used += size
    return shard_of


@cache
def tensor_specs(version: str, scale: str = "full") -> tuple[TensorSpec, ...]:
    """The ordered tensor list of `version` at `scale`, each with its shard file name: the shard its key has at
    full scale (a scale with fewer layers keeps a subset of the keys)."""
    cfg = load_config(version)
    full = _state_dict(cfg, cfg.dims)
    assignment = _assign_shards(full, cfg.max_shard_size)
    names = shard_names(max(assignment) + 1)
    shard_of = {k: names[i] for (k, _), i in zip(full, assignment, strict=True)}
    entries = full if scale == "full" else _state_dict(cfg, cfg.dims_for(scale))
    return tuple(TensorSpec(k, s, shard_of[k]) for k, s in entries)


def scale_of(cfg: VersionConfig, shapes: Mapping[str, Shape]) -> str:
    """The scale (full, or a synthetic stand-in's) whose shapes most of these keys have: one odd tensor does not
    move a checkpoint to other dims (its own check names it)."""
    def matching(scale: str) -> tuple[int, bool]:
        specs = tensor_specs(cfg.version, scale)
        found = sum(tuple(shapes.get(s.key, ())) == s.shape for s in specs)
        return found, found == len(specs)  # a tie goes to the scale with none missing (micro's keys are tiny's too)
    return max(SCALES, key=matching)  # and then to `full`, listed first


def dims_of(cfg: VersionConfig, shapes: Mapping[str, Shape]) -> Mapping[str, int]:
    """The dims a checkpoint was made with (those of `scale_of`). Recipes read head counts and head sizes from them."""
    return cfg.dims_for(scale_of(cfg, shapes))


_NUMBERED_UNIT = re.compile(r"^(.*?\.(?:layers|blocks|transformer_blocks|deepstack_merger_list)\.\d+)\.")


def unit_of(cfg: VersionConfig, key: str) -> str:
    """The unit a key belongs to: a numbered layer/block, else the first module below its container."""
    numbered = _NUMBERED_UNIT.match(key)
    if numbered:
        return numbered.group(1)
    for prefix in sorted(cfg.containers.values(), key=len, reverse=True):
        if key.startswith(prefix):
            parts = key[len(prefix):].split(".")
            depth = 2 if parts[0] == "model" else 1  # the DiT sits under `model.`: split it into its modules
            return prefix + ".".join(parts[:depth])
    return key.rsplit(".", 1)[0]


def short_key(cfg: VersionConfig, key: str, table: str) -> str:
    """`<name>.<the key below it>`: the longest prefix of configs/<version>.toml `[table]` that the key starts with,
    replaced by its name. `containers`: role names (`vision.`, `llm.`: the generic layout); `components`: the N1.6
    port's weight groups (`vision.`, `language.`, `dit.`: the Tenstorrent layouts)."""
    prefixes: Mapping[str, str] = getattr(cfg, table)
    for name, prefix in sorted(prefixes.items(), key=lambda np_: len(np_[1]), reverse=True):
        if key.startswith(prefix):
            return f"{name}.{key[len(prefix):]}"
    raise ConfigError(f"key {key!r} is under none of {cfg.version}'s {table} ({', '.join(prefixes.values())})")


def straddling_unit(version: str) -> str:
    """The unit whose tensors sit in two shards, as derived from the layout (checked against the config)."""
    cfg = load_config(version)
    shards_by_unit: dict[str, set[str]] = {}
    for spec in tensor_specs(version):
        shards_by_unit.setdefault(unit_of(cfg, spec.key), set()).add(spec.shard)
    split = [u for u, s in shards_by_unit.items() if len(s) > 1]
    if len(split) != 1:
        raise ConfigError(f"{version}: expected exactly one straddling unit, found {split}")
    return split[0]
