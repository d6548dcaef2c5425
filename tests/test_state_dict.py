"""The derived state dicts (tensor_specs) reproduce every published/reference fact (../shared/reference/gr00t-checkpoints.md)."""

from __future__ import annotations

import json
import re

import pytest

from pipeline.model.state_dict import tensor_specs, straddling_unit
from pipeline.model.versions import load_config
from tasks.source.safetensors_file import frame_header

FACTS = {  # tensors, shards, total_size, straddling unit — literal reference numbers, not computed here
    "n15": (899, 3, 5_448_327_040, "backbone.eagle_model.language_model.model.layers.5"),
    "n16": (1106, 2, 6_573_217_664, "action_head.model.transformer_blocks.18"),
    "n17": (1031, 2, 6_910_361_856, "action_head.model.transformer_blocks.19"),
}


@pytest.mark.parametrize("version", FACTS)
def test_counts_shards_total_size_and_straddle(version):
    tensors, shards, total, unit = FACTS[version]
    specs = tensor_specs(version)
    assert len(specs) == tensors
    assert len({s.shard for s in specs}) == shards
    assert sum(s.nbytes for s in specs) == total
    assert straddling_unit(version) == unit == load_config(version).expected["straddling_unit"]


@pytest.mark.parametrize("version", FACTS)
def test_tiny_keeps_keys_order_shards_and_slot_count(version):
    full, tiny = tensor_specs(version, "full"), tensor_specs(version, "tiny")
    assert [(s.key, s.shard) for s in full] == [(s.key, s.shard) for s in tiny]
    assert sum(s.nbytes for s in tiny) < 50e6
    cfg = load_config(version)
    for key in cfg.embodiment_keys:
        assert next(s for s in tiny if s.key == key).shape[0] == 32



@pytest.mark.parametrize("version", FACTS)
def test_micro_is_tiny_with_a_few_layers_and_is_told_from_it_by_its_keys(version):
    """micro (for tests whose cost is the number of files): tiny's keys, shapes and shards for two LLM layers and two
    DiT blocks, every slot; a checkpoint of either is read as its own scale, though micro's keys are all tiny's."""
    from pipeline.model.state_dict import scale_of

    tiny, micro = tensor_specs(version, "tiny"), tensor_specs(version, "micro")
    assert set(micro) < set(tiny) and 50 < len(micro) < len(tiny) / 5
    blocks = {re.search(r"transformer_blocks\.(\d+)\.", s.key).group(1) for s in micro if "transformer_blocks." in s.key}
    assert blocks == {"0", "1"}
    cfg = load_config(version)
    assert all(next(s for s in micro if s.key == k).shape[0] == 32 for k in cfg.embodiment_keys)
    for scale, specs in (("tiny", tiny), ("micro", micro)):
        assert scale_of(cfg, {s.key: s.shape for s in specs}) == scale

def _straddle_split(version):
    unit = FACTS[version][3] + "."
    split = {}
    for s in tensor_specs(version):
        if s.key.startswith(unit):
            split.setdefault(s.shard[:11], []).append(s.key[len(unit):])
    return split


def test_n15_layer5_qkv_in_shard1_rest_in_shard2():
    split = _straddle_split("n15")
    assert split["model-00001"] == ["self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"]
    assert len(split["model-00002"]) == 8 and "self_attn.o_proj.weight" in split["model-00002"]


@pytest.mark.parametrize("version", ["n16", "n17"])
def test_dit_straddle_attention_in_shard1_ff_in_shard2(version):
    split = _straddle_split(version)
    assert len(split["model-00001"]) == 10 and all(k.startswith(("norm1.", "attn1.")) for k in split["model-00001"])
    assert split["model-00002"] == ["ff.net.0.proj.weight", "ff.net.0.proj.bias", "ff.net.2.weight", "ff.net.2.bias"]


@pytest.mark.parametrize("version", FACTS)
def test_embodiment_tensors_and_traps(version):
    cfg, specs = load_config(version), {s.key: s.shape for s in tensor_specs(version)}
    banks = [k for k, shape in specs.items() if k.startswith("action_head.") and len(shape) >= 2 and shape[0] == 32
             and k.endswith((".W", ".b"))]
    assert sorted(banks) == sorted(cfg.embodiment_keys) and len(banks) == 14
    assert cfg.containers["lm_head"] + "weight" in specs  # stored although tied
    if version == "n15":  # [32, 1536] but 32 vision tokens, not embodiment slots
        assert specs["action_head.future_tokens.weight"] == (32, 1536)
        assert "action_head.future_tokens.weight" not in cfg.embodiment_keys


def test_n16_full_layout_reproduces_published_file_sizes():
    specs = tensor_specs("n16")
    sizes = []
    for shard in sorted({s.shard for s in specs}):
        head, plan = frame_header([(s.key, "BF16", s.shape) for s in specs if s.shard == shard], {"format": "pt"})
        sizes.append(len(head) + plan[-1][2])
    assert sizes == [4_991_091_456, 1_582_283_096]
    index = json.dumps({"metadata": {"total_size": 6_573_217_664}, "weight_map": {s.key: s.shard for s in specs}},
                       indent=2, sort_keys=True) + "\n"
    assert len(index) == 121_820
