"""pipeline/inputs/trainer_files.py's embodiment rules read directly, without a convert: LeRobot's pack step as each LeRobot
release saves it (0.5.1's `groot_pack_inputs_v3` for N1.5, 0.6.1's `groot_n1_7_pack_inputs_v1` for N1.7), the map
it wins with, and the built-in tables against the trainers' own (configs/<version>.toml)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.inputs.embodiments import Embodiments
from pipeline.inputs.trainer_files import embodiment_map, lerobot_pack, trained_tags
from pipeline.model.versions import load_config
from tasks.errors import CheckpointError, ConfigError

# LeRobot 0.5.1 policies/groot/processor_groot.py GrootPackInputsStep.embodiment_mapping (its default), as read
LEROBOT_051 = {"new_embodiment": 31, "oxe_droid": 17, "agibot_genie1": 26, "gr1": 24, "so100": 2, "unitree_g1": 3}


def _preprocessor(folder: Path, step: str, config: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    steps = [{"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
             {"registry_name": step, "config": config},
             {"registry_name": "device_processor", "config": {"device": "cpu"}}]
    (folder / "policy_preprocessor.json").write_text(json.dumps({"name": "policy_preprocessor", "steps": steps}))
    return folder


def test_lerobot_051s_n15_pack_step_gives_its_tag_and_map(tmp_path):
    folder = _preprocessor(tmp_path / "pretrained_model", "groot_pack_inputs_v3",
                           {"embodiment_tag": "so100", "embodiment_mapping": LEROBOT_051, "max_state_dim": 64})
    pack = lerobot_pack(folder)
    assert pack.tag == "so100" and dict(pack.mapping) == LEROBOT_051
    assert trained_tags(folder, pack).value == ("so100",)
    tags, overridden, note = embodiment_map(folder, load_config("n15"), pack)
    assert Embodiments.parse("trained").with_trained(("so100",), "").slots(load_config("n15"), 32, tags) == (2,)
    assert Embodiments.parse("my_arm").slots(load_config("n15"), 32, tags) == (0,)  # outside it: slot 0
    assert overridden == {} and note is None


def test_the_pack_steps_map_is_taken_as_it_is_and_differences_are_named(tmp_path):
    mapping = {"new_embodiment": 12, "libero_sim": 2}  # a base checkpoint's own embodiment_id.json, as LeRobot saved it
    folder = _preprocessor(tmp_path / "p", "groot_n1_7_pack_inputs_v1",
                           {"embodiment_tag": "new_embodiment", "embodiment_mapping": mapping})
    tags, overridden, _ = embodiment_map(folder, load_config("n17"), lerobot_pack(folder))
    assert dict(tags.ids) == mapping and tags.unknown_slot == 0  # nothing of ours merged in: LeRobot merges nothing
    assert overridden == {"new_embodiment": (10, 12)}
    assert Embodiments.parse("unitree_g1_sonic").slots(load_config("n17"), 32, tags) == (0,)
    assert Embodiments.parse("11").slots(load_config("n17"), 32, tags) == (11,)


def test_a_pipeline_without_a_pack_step_records_nothing_and_a_bad_one_is_refused(tmp_path):
    assert lerobot_pack(_preprocessor(tmp_path / "a", "normalizer_processor", {"eps": 1e-8})) is None
    bad = _preprocessor(tmp_path / "b", "groot_n1_7_pack_inputs_v1", {"embodiment_tag": ""})
    with pytest.raises(CheckpointError, match="embodiment_tag must be a tag name"):
        lerobot_pack(bad)
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "policy_preprocessor.json").write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="not a LeRobot processor pipeline"):
        lerobot_pack(tmp_path / "c")


def test_a_pipeline_with_two_pack_steps_or_a_config_that_is_no_object_is_refused(tmp_path):
    """Two pack steps that map the trained tag to two slots: which packed the batches the policy trained on is not
    ours to guess (the first one's slot was taken before, silently)."""
    folder = _preprocessor(tmp_path / "two", "groot_n1_7_pack_inputs_v1",
                           {"embodiment_tag": "new_embodiment", "embodiment_mapping": {"new_embodiment": 10}})
    doc = json.loads((folder / "policy_preprocessor.json").read_text())
    doc["steps"].append({"registry_name": "groot_n1_7_pack_inputs_v1",
                         "config": {"embodiment_tag": "new_embodiment", "embodiment_mapping": {"new_embodiment": 11}}})
    (folder / "policy_preprocessor.json").write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match="holds 2 GR00T pack steps, and a pipeline packs once"):
        lerobot_pack(folder)
    folder = _preprocessor(tmp_path / "str", "groot_n1_7_pack_inputs_v1", "new_embodiment")
    with pytest.raises(CheckpointError, match="its pack step's config must be an object, found str"):
        lerobot_pack(folder)


def test_a_tag_its_map_puts_past_the_banks_names_the_map(tmp_path):
    folder = _preprocessor(tmp_path / "p", "groot_n1_7_pack_inputs_v1",
                           {"embodiment_tag": "new_embodiment", "embodiment_mapping": {"new_embodiment": 99}})
    tags, _, _ = embodiment_map(folder, load_config("n17"), lerobot_pack(folder))
    with pytest.raises(ConfigError, match=rf"new_embodiment \(slot 99, as {folder / 'policy_preprocessor.json'} maps "
                                        r"it\) is out of range .* pass a slot id 0..31"):
        Embodiments.parse("new_embodiment").slots(load_config("n17"), 32, tags)


def test_a_map_that_is_not_utf8_is_said_to_be_unreadable_once(tmp_path):
    """A tag table saved as UTF-16: one sentence naming the file and why, not the same refusal nested in 'invalid
    JSON' with the path twice."""
    (tmp_path / "embodiment_id.json").write_bytes('{"new_embodiment": 10}'.encode("utf-16"))
    with pytest.raises(CheckpointError) as err:
        embodiment_map(tmp_path, load_config("n16"), None)
    assert str(err.value).count(str(tmp_path)) == 1 and "cannot be read ('utf-8' codec" in str(err.value)
    assert "not valid JSON" not in str(err.value)


@pytest.mark.parametrize("version", ["n15", "n17"])
def test_the_built_in_table_agrees_with_lerobots_own_where_both_have_a_tag(version):
    """configs/<version>.toml: the built-in table is the union of the trainers' tables, Isaac-GR00T's slot kept
    where two differ; today LeRobot's table agrees with it on every tag it has (an independent copy for N1.5)."""
    cfg = load_config(version)
    lerobot = dict(cfg.lerobot["embodiments"])
    if version == "n15":
        assert lerobot == LEROBOT_051
    assert all(cfg.embodiment_ids[tag] == slot for tag, slot in lerobot.items())


def test_tie_tables_says_what_to_tie_and_changes_nothing_and_read_folder_ties_it(snapshots, tmp_path):
    """Issue 50 item 5: the rule returns what to tie (key -> twin, and who said so); the caller applies it."""
    import torch
    from safetensors.torch import load_file, save_file

    from pipeline.inputs.folder import read_folder
    from pipeline.inputs.tensors import tie_tables
    from tasks.source.checkpoint import Checkpoint

    cfg = load_config("n16")
    embed, head = f"{cfg.containers['llm']}embed_tokens.weight", f"{cfg.containers['lm_head']}weight"
    tensors = {}
    for shard in sorted(snapshots["n16"].glob("*.safetensors")):
        tensors.update(load_file(str(shard)))
    tensors.pop(embed)  # as a trainer's tie de-duplication saves it, with nothing in __metadata__ or config.json
    (tmp_path / "ft").mkdir()
    save_file(tensors, str(tmp_path / "ft" / "model.safetensors"))
    ck = Checkpoint(tmp_path / "ft")
    said = tie_tables(ck, cfg)
    assert said.value == {embed: head} and "every release ties them" in said.source
    assert embed not in ck  # the rule changed nothing
    folder = read_folder(tmp_path / "ft", "n16")
    assert embed in folder.checkpoint and torch.equal(
        torch.from_numpy(folder.checkpoint.get(embed).view("uint16").copy()),
        tensors[head].view(torch.uint16))
