"""A fine-tune's processor against its trainer's: the state the model takes and the actions the robot gets, from the
trainer's own files, equal what Isaac-GR00T's pinned `StateActionProcessor` gives (tests/isaac_oracle.py) on seeded
random states and model outputs: the state to 1e-6, the actions to 1e-5 relative. Every case of its arithmetic:
min/max with clipping, mean/std (a joint whose std is 0 too), percentiles, sin/cos state groups, RELATIVE joint and
end-effector actions; and each bad input is one sentence."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.inputs.synth_processor import ACTION_GROUPS, STATE_GROUPS, isaac_processor_files, robot_data
from pipeline.model.processor import ProcessorError, from_files
from tests.isaac_oracle import Oracle

TAG = "new_embodiment"
SETTINGS = {
    "defaults (min/max clipped, mean/std, sin/cos, relative joint and end effector)": {},
    "percentiles": {"use_percentiles": True},
    "no clipping, no sin/cos": {"clip_outliers": False, "apply_sincos_state_encoding": False},
    "absolute actions": {"use_relative_action": False},
}


def _processor(version: str, settings: dict):
    docs = isaac_processor_files(version, TAG, {TAG: 10}, settings=settings)
    files = {name: json.dumps(doc).encode() for name, doc in docs.items()}
    return docs, from_files(files, TAG, 10, "checkpoint-1000", f"Isaac-GR00T {version}")


def _observations(rng: np.random.Generator, batch: int, steps: int = 1) -> dict[str, np.ndarray]:
    """Raw state groups `[B, T, D]`, some past the statistics' range (clipping has work to do)."""
    state, _ = robot_data(seed=int(rng.integers(1 << 30)), episodes=batch * steps)
    out = {g: v.reshape(batch, steps, -1) * (1.3 if g in ("arm", "gripper") else 1.0) for g, v in state.items()}
    return out


@pytest.mark.parametrize("version", ["n16", "n17"])
@pytest.mark.parametrize("case", list(SETTINGS))
def test_state_and_actions_equal_the_trainers_own(version, case):
    docs, processor = _processor(version, SETTINGS[case])
    oracle = Oracle(docs, TAG)
    rng = np.random.default_rng(7)
    observed = _observations(rng, batch=6, steps=2)
    ours = processor.state(observed)
    assert ours.dtype == np.float32 and ours.shape == (6, 2, processor.max_state_dim)
    for b in range(6):
        theirs = oracle.state({g: v[b] for g, v in observed.items()})
        np.testing.assert_allclose(ours[b], theirs, rtol=0, atol=1e-6)
    if SETTINGS[case].get("clip_outliers", True):
        arm = ours[..., :7]  # min/max, and fed past its range (x1.3): some values were clipped, none passed
        assert np.abs(arm).max() == 1.0 and (np.abs(arm) == 1.0).any()
    output = rng.uniform(-1.2, 1.2, (6, 40, processor.max_action_dim)).astype(np.float32)
    actions = processor.actions(output, state=observed)
    expected = oracle.actions(output, observed)
    assert list(actions) == list(ACTION_GROUPS)
    for group, values in expected.items():
        assert actions[group].shape == values.shape == (6, processor.action_horizon, ACTION_GROUPS[group])
        np.testing.assert_allclose(actions[group], values, rtol=1e-5, atol=1e-7 * np.abs(values).max())


def test_the_cases_are_there():
    """What the comparison above covers, read from the files it runs on (so that it cannot quietly stop)."""
    _, processor = _processor("n16", {})
    modes = {g.name: g.mode for g in processor.state_groups}
    assert modes == {"arm": "min_max", "hand": "mean_std", "gripper": "min_max", "wrist": "min_max",
                     "waist": "sin_cos"}
    relative = {g.name: (g.kind, g.pose) for g in processor.action_groups if g.relative}
    assert relative == {"arm": ("NON_EEF", "DEFAULT"), "wrist": ("EEF", "XYZ_ROT6D")}
    assert processor.action_horizon == 16 and processor.state_dims == STATE_GROUPS


def test_a_single_unbatched_observation():
    docs, processor = _processor("n17", {})
    observed = {g: v[0] for g, v in _observations(np.random.default_rng(3), batch=1).items()}  # [T, D]
    np.testing.assert_allclose(processor.state(observed), Oracle(docs, TAG).state(observed), atol=1e-6)


@pytest.mark.parametrize("mutate, says", [
    (lambda s: s.pop("hand"), "lacks group 'hand'"),
    (lambda s: s.update(arm=np.zeros((1, 5))), "group 'arm' has shape [1, 5], not [..., T, 7]"),
    (lambda s: s.update(arm="seven"), "group 'arm' holds <U5, not numbers"),
])
def test_a_bad_observation_is_one_sentence(mutate, says):
    _, processor = _processor("n16", {})
    observed = {g: v[0] for g, v in _observations(np.random.default_rng(1), batch=1).items()}
    mutate(observed)
    with pytest.raises(ProcessorError, match=says.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")) as e:
        processor.state(observed)
    assert "\n" not in str(e.value)


def test_an_end_effector_pose_that_is_no_rotation_is_one_sentence():
    _, processor = _processor("n16", {})
    observed = {g: v[0] for g, v in _observations(np.random.default_rng(1), batch=1).items()}
    observed["wrist"] = np.zeros_like(observed["wrist"])  # rot6d rows of zero length
    with pytest.raises(ProcessorError, match="cannot be made absolute against state group 'wrist'.*no rotation") as e:
        processor.actions(np.zeros((16, processor.max_action_dim)), state=observed)
    assert "\n" not in str(e.value)


def test_relative_actions_need_the_state():
    _, processor = _processor("n16", {})
    with pytest.raises(ProcessorError, match="trained relative to the state: pass state="):
        processor.actions(np.zeros((1, 16, processor.max_action_dim)))
    with pytest.raises(ProcessorError, match=r"not \[\.\.\., H >= 16, 29\]"):
        processor.actions(np.zeros((1, 16, 3)), state={})


@pytest.mark.parametrize("edit, says", [
    (lambda d: d["statistics.json"][TAG]["state"]["arm"].update(max=[float("nan")] * 7), "statistics.json"),
    (lambda d: d["statistics.json"].pop(TAG), "do not cover embodiment new_embodiment"),
    (lambda d: d["processor_config.json"]["processor_kwargs"].update(max_state_dim="big"), "max_state_dim is 'big'"),
    (lambda d: d["processor_config.json"]["processor_kwargs"]["modality_configs"][TAG]["action"]["action_configs"][0]
     .update(type="LEG"), "type 'LEG'"),
])
def test_files_that_cannot_make_a_processor_are_one_sentence(edit, says):
    docs = isaac_processor_files("n16", TAG, {TAG: 10})
    edit(docs)
    files = {name: json.dumps(doc).encode() for name, doc in docs.items()}
    with pytest.raises(ProcessorError, match=says) as e:
        from_files(files, TAG, 10, "checkpoint-1000", "Isaac-GR00T n16")
    assert "\n" not in str(e.value) and "checkpoint-1000" in str(e.value)
