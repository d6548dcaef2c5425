"""A LeRobot GR00T N1.7 fine-tune acts from the cache alone, as LeRobot's own saved pipeline makes it act (issue 68).

The oracle is LeRobot itself: tests/fixtures/lerobot-n17/processor_cases.json holds what LeRobot 0.6.1's pipelines,
loaded from the folders it saved, made of seeded states (its preprocessor's pack step) and of seeded model outputs
(its postprocessor), written by processor_cases.py in LeRobot's own venv. `pretrained_model/` is what
`lerobot-train` saved (generate.py); `processors-libero/` is LeRobot's pipelines for a 7-wide LIBERO action, with a
joint whose min equals its max and one whose min is above its max."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from pipeline import ProcessorError
from pipeline.inputs.processor_files import read_processor_files
from pipeline.jobs.convert import ConvertOptions, convert
from pipeline.jobs.load import load
from pipeline.model.lerobot_processor import from_lerobot_files
from tests.conftest import ROOT, run_cli

FIXTURE = ROOT / "tests" / "fixtures" / "lerobot-n17"
CASES = json.loads((FIXTURE / "processor_cases.json").read_text())


def _case(folder: str) -> dict[str, np.ndarray]:
    return {k: np.asarray(v, dtype=np.float32) for k, v in CASES["folders"][folder].items() if k.endswith("s")
            and k not in ("post_steps",)}


def _acts_as_lerobot(processor, case: dict[str, np.ndarray]) -> None:
    state = processor.state({"observation.state": case["states"][:, None, :]})
    assert state.dtype == np.float32 and state.shape == case["packed_states"].shape
    np.testing.assert_allclose(state, case["packed_states"], rtol=0, atol=1e-6)
    actions = processor.actions(case["outputs"])
    assert list(actions) == ["action"] and actions["action"].shape == case["actions"].shape
    np.testing.assert_allclose(actions["action"], case["actions"], rtol=1e-5, atol=1e-6)


def test_a_lerobot_fine_tune_acts_from_the_cache_as_lerobots_own_pipeline(tmp_path):
    """What `lerobot-train` saved, converted with `--embodiments trained`, the folder then deleted: the entry's
    processor gives the state LeRobot's pack step gives and the actions its postprocessor gives, on the same seeded
    inputs; and a CLI load says which processor the entry keeps."""
    folder = tmp_path / "pretrained_model"
    shutil.copytree(FIXTURE / "pretrained_model", folder)
    done = convert(ConvertOptions(None, embodiments="trained", snapshot=folder, cache_root=tmp_path / "cache",
                                  progress=False))
    shutil.rmtree(folder)
    loaded = load("n17", tmp_path / "cache", "new_embodiment", entry=Path(done["cache_path"]).name, synthetic=True)
    processor = loaded.processor
    assert (processor.trainer, processor.embodiment, processor.embodiment_id) == ("LeRobot", "new_embodiment", 10)
    assert processor.state_dims == {"observation.state": 6} and processor.action_dims == {"action": 6}
    assert (processor.action_horizon, processor.max_state_dim, processor.max_action_dim) == (40, 132, 132)
    _acts_as_lerobot(processor, _case("pretrained_model"))
    said = run_cli("load", "--version", "n17", "--cache", str(tmp_path / "cache"), "--embodiment", "new_embodiment",
                   "--json")
    assert said.returncode == 0, said.stderr
    assert json.loads(said.stdout)["processor"]["trainer"] == "LeRobot"


def test_lerobots_libero_pipeline_with_a_joint_of_no_spread():
    """LeRobot's own pipelines for a LIBERO action (its gripper flipped and binarized), a state 8 wide, a joint whose
    min equals its max (0 in, min out) and one whose min is above its max."""
    kept = read_processor_files(FIXTURE / "processors-libero")
    assert kept is not None and kept.trainer == "LeRobot"
    processor = from_lerobot_files(kept.files, None, None, kept.where)
    assert processor.state_dims == {"observation.state": 8} and processor.action_dims == {"action": 7}
    assert processor.libero_gripper is True and processor.clip_actions
    _acts_as_lerobot(processor, _case("processors-libero"))


@pytest.mark.parametrize(("edit", "said"), [
    (lambda files: files.pop("policy_postprocessor.json"), "holds no policy_postprocessor.json"),
    (lambda files: files.update({"policy_preprocessor.json": json.dumps({"steps": [  # LeRobot's N1.5 pipeline
        {"registry_name": "groot_pack_inputs_v3", "config": {}}]}).encode()}),
     "has no groot_n1_7_pack_inputs_v1 step (its steps: groot_pack_inputs_v3); this version reproduces LeRobot's "
     "GR00T N1.7 pipelines only"),
    (lambda files: files.update({"policy_preprocessor.json": json.dumps({"steps": [
        *json.loads(files["policy_preprocessor.json"])["steps"],
        {"registry_name": "relative_actions_processor", "config": {}}]}).encode()}),
     "also runs relative_actions_processor"),
    (lambda files: files.update({"policy_preprocessor.json": json.dumps({"steps": [
        {**s, "config": {**s["config"], "raw_stats": {"state": {}}}} if "pack" in s["registry_name"] else s
        for s in json.loads(files["policy_preprocessor.json"])["steps"]]}).encode()}),
     "normalizes by the checkpoint's grouped statistics"),
    (lambda files: files.update({"policy_postprocessor.json": json.dumps({"steps": [
        {**s, "config": {**s["config"], "clip_normalized_action": "yes"}}
        for s in json.loads(files["policy_postprocessor.json"])["steps"]]}).encode()}),
     "clip_normalized_action is 'yes', not true or false"),
])
def test_a_pipeline_it_cannot_reproduce_exactly_is_one_sentence(edit, said):
    files = dict(read_processor_files(FIXTURE / "pretrained_model").files)
    edit(files)
    with pytest.raises(ProcessorError) as caught:
        from_lerobot_files(files, None, None, "entry e (folder)")
    message = str(caught.value)
    assert said in message and "\n" not in message and message.startswith("entry e (folder)"), message


def test_an_embodiment_lerobot_did_not_train_and_a_bad_observation_are_one_sentence():
    kept = read_processor_files(FIXTURE / "pretrained_model")
    with pytest.raises(ProcessorError, match=r"for embodiment new_embodiment \(slot 10\) only, not gr1; load that one"):
        from_lerobot_files(kept.files, "gr1", None, "entry e")
    processor = from_lerobot_files(kept.files, None, 10, "entry e")
    with pytest.raises(ProcessorError, match=r"lacks group 'observation.state'"):
        processor.state({"state": np.zeros((1, 6))})
    with pytest.raises(ProcessorError, match=r"has shape \[1, 5\], not \[..., T, 6\]"):
        processor.state({"observation.state": np.zeros((1, 5))})
