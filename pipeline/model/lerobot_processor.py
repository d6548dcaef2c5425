"""A LeRobot GR00T N1.7 fine-tune's processor, read from what `lerobot-train` saved beside the weights:
`policy_preprocessor.json` and `policy_postprocessor.json` (the pipelines' steps and their settings), each step's
`policy_*processor_step_<k>_<name>.safetensors` (its normalizer statistics, flat: `observation.state.min`, …) and
`config.json` (the policy's input and output features).

Two steps act on numbers, and only those are reproduced (lerobot 0.6.1, policies/groot/processor_groot.py):
- `groot_n1_7_pack_inputs_v1`: the flat `observation.state` `[B, D]`, min/max normalized with the step's own
  statistics when `normalize_min_max`, clipped when `clip_outliers`, zero-padded to `max_state_dim`, `[B, 1, max]`;
- `groot_action_unpack_unnormalize_v2`: the model's `[B, T, max_action_dim]` cut to `env_action_dim`, clipped when
  `clip_normalized_action`, min/max unnormalized with its statistics, and LeRobot's LIBERO gripper when set.
A statistic shorter or longer than the values is padded or cut as LeRobot aligns it. The rest of the pipelines
(renaming, batching, images and language through the VLM's processor, the device) moves data and is left to the
caller. A pipeline this does not reproduce exactly (an N1.5 one, a raw N1.7 checkpoint's grouped statistics, an
action decode step) is one sentence, never an approximation.
"""

from __future__ import annotations

import json
from typing import Mapping

import numpy as np

from pipeline.model.processor import Group, Processor, ProcessorError, kept_json
from tasks.numerics import state_action as arithmetic

PREPROCESSOR, POSTPROCESSOR, POLICY_CONFIG = "policy_preprocessor.json", "policy_postprocessor.json", "config.json"
PACK_STEP, UNPACK_STEP = "groot_n1_7_pack_inputs_v1", "groot_action_unpack_unnormalize_v2"
STATE, ACTION = "observation.state", "action"  # LeRobot's own keys: the one state group and the one action group
_MOVES_DATA = {"rename_observations_processor", "to_batch_processor", "device_processor", "groot_n1_7_vlm_encode_v1"}


def from_lerobot_files(files: Mapping[str, bytes], tag: str | None, slot: int | None, source: str) -> Processor:
    """The processor LeRobot saved with a GR00T N1.7 policy, for the embodiment it was trained as (`tag` and `slot`,
    when given, must be that one); ProcessorError, one sentence, when the files cannot make it exactly."""
    pack = _step(files, PREPROCESSOR, PACK_STEP, source)
    unpack = _step(files, POSTPROCESSOR, UNPACK_STEP, source)
    settings, out = pack["config"], unpack["config"]
    trained = settings.get("embodiment_tag")
    mapping = settings.get("embodiment_mapping")
    if not isinstance(trained, str) or not isinstance(mapping, dict):
        raise ProcessorError(f"{source}/{PREPROCESSOR}: its {PACK_STEP} step has no embodiment_tag and "
                             "embodiment_mapping; keep the file LeRobot wrote")
    trained_id = mapping.get(trained, 0)  # LeRobot packs a tag its table lacks as slot 0
    if (tag is not None and tag != trained) or (slot is not None and slot != trained_id):
        asked = tag if tag is not None else f"slot {slot}"
        raise ProcessorError(f"{source}: LeRobot's statistics are for embodiment {trained} (slot {trained_id}) only, "
                             f"not {asked}; load that one")
    if settings.get("raw_stats") or settings.get("modality_config"):
        raise ProcessorError(f"{source}/{PREPROCESSOR}: its {PACK_STEP} step normalizes by the checkpoint's grouped "
                             "statistics (raw_stats), which this version does not reproduce; run LeRobot's own "
                             "pipeline for this fine-tune")
    max_state, max_action = _size(settings, "max_state_dim", source), _size(settings, "max_action_dim", source)
    state_width = _feature_width(files, "input_features", STATE, source) or max_state
    action_width = _size(out, "env_action_dim", source, zero=True) or max_action
    if state_width > max_state or action_width > max_action:
        raise ProcessorError(f"{source}: the state is {state_width} wide and the action {action_width}, past the "
                             f"model's {max_state} and {max_action}; keep the files LeRobot wrote")
    state_stats = _stats(files, pack, STATE, state_width, source)
    action_stats = _stats(files, unpack, ACTION, action_width, source, unpack=True)
    state_mode = arithmetic.LEROBOT_MIN_MAX if _flag(settings, "normalize_min_max", source) and state_stats \
        else arithmetic.IDENTITY
    action_mode = arithmetic.LEROBOT_MIN_MAX if _flag(out, "normalize_min_max", source) and action_stats \
        else arithmetic.IDENTITY
    gripper = _flag(out, "libero_gripper_action", source, default=False)
    return Processor(
        trainer="LeRobot", embodiment=trained, embodiment_id=trained_id,
        state_groups=(Group(STATE, state_width, state_mode, state_stats),),
        action_groups=(Group(ACTION, action_width, action_mode, action_stats),),
        action_horizon=_size(settings, "action_horizon", source), max_state_dim=max_state,
        max_action_dim=max_action, clip_outliers=_flag(settings, "clip_outliers", source),
        clip_actions=_flag(out, "clip_normalized_action", source, default=False),
        libero_gripper=(_flag(out, "libero_gripper_binarize", source) if gripper else None), source=source)


def _pipeline(files: Mapping[str, bytes], name: str, source: str) -> list[dict]:
    doc = kept_json(files, name, source)
    steps = doc.get("steps") if isinstance(doc, dict) else None
    if not isinstance(steps, list) or not all(isinstance(s, dict) for s in steps):
        raise ProcessorError(f"{source}/{name}: has no list of steps; keep the file LeRobot wrote")
    return steps


def _step(files: Mapping[str, bytes], name: str, wanted: str, source: str) -> dict:
    """The one step of the pipeline that acts on numbers; every other step must be one that only moves data."""
    steps = _pipeline(files, name, source)
    names = [str(s.get("registry_name")) for s in steps]
    found = [s for s in steps if s.get("registry_name") == wanted]
    if not found:  # an N1.5 pipeline (groot_pack_inputs_v3, …), which LeRobot 0.6.1 no longer runs either
        raise ProcessorError(f"{source}/{name}: has no {wanted} step (its steps: {', '.join(names) or 'none'}); this "
                             "version reproduces LeRobot's GR00T N1.7 pipelines only: read the files with "
                             "Loaded.processor_files")
    others = sorted(set(names) - _MOVES_DATA - {wanted})
    if len(found) > 1 or others:
        said = f"also runs {', '.join(others)}" if others else f"has {len(found)} {wanted} steps, not one"
        raise ProcessorError(f"{source}/{name}: {said}, which this version does not reproduce (it runs LeRobot's "
                             f"GR00T N1.7 {wanted} alone); run LeRobot's own pipeline for this fine-tune")
    if not isinstance(found[0].get("config"), dict):
        raise ProcessorError(f"{source}/{name}: its {wanted} step has no config; keep the file LeRobot wrote")
    return found[0]


def _size(settings: dict, name: str, source: str, zero: bool = False) -> int:
    value = settings.get(name, 0 if zero else None)
    if type(value) is not int or not (0 if zero else 1) <= value < 1 << 20:
        raise ProcessorError(f"{source}: LeRobot's {name} is {value!r}, not a {'width' if zero else 'positive width'}; "
                             "keep the files LeRobot wrote")
    return value


def _flag(settings: dict, name: str, source: str, default: bool = True) -> bool:
    value = settings.get(name, default)
    if not isinstance(value, bool):
        raise ProcessorError(f"{source}: LeRobot's {name} is {value!r}, not true or false; keep the files LeRobot wrote")
    return value


def _feature_width(files: Mapping[str, bytes], which: str, key: str, source: str) -> int | None:
    """The width the policy's config.json gives a feature (the dataset's), or None when it does not say."""
    try:
        config = json.loads(files.get(POLICY_CONFIG, b"{}"))
    except (ValueError, RecursionError):
        raise ProcessorError(f"{source}/{POLICY_CONFIG}: is not valid JSON; keep the file LeRobot wrote") from None
    feature = (config.get(which) or {}).get(key) if isinstance(config, dict) else None
    shape = feature.get("shape") if isinstance(feature, dict) else None
    if shape is None:
        return None
    if not (isinstance(shape, list) and len(shape) == 1 and type(shape[0]) is int and 0 < shape[0] < 1 << 20):
        raise ProcessorError(f"{source}/{POLICY_CONFIG}: {which}.{key}.shape is {shape!r}, not [width]; keep the "
                             "file LeRobot wrote")
    return shape[0]


def _stats(files: Mapping[str, bytes], step: dict, key: str, width: int, source: str,
           unpack: bool = False) -> dict[str, np.ndarray]:
    """`key`'s min and max from the step's statistics file, float32, as LeRobot takes them: a missing min is 0 and a
    missing max 1; a longer one is cut, a shorter one padded (the pack step pads min with 0 and max with 1, the
    unpack step both with 0). Empty when LeRobot leaves the values as they are: the pack step when it holds no
    statistics for `key`, the unpack step when it holds none at all."""
    name = step.get("state_file")
    if name is None:
        return {}
    if not isinstance(name, str) or name not in files:
        raise ProcessorError(f"{source}: holds no {name!r}, the statistics its {step.get('registry_name')} step "
                             "names; convert the fine-tune again from the folder LeRobot wrote")
    from safetensors.numpy import load

    try:
        tensors = load(files[name])
    except Exception as e:  # the library's own error for a malformed file
        raise ProcessorError(f"{source}/{name}: is not a safetensors file ({str(e)[:120]})") from None
    held = any("." in k for k in tensors) if unpack else any(k.startswith(f"{key}.") for k in tensors)
    if not held:
        return {}
    aligned = {}
    for stat, default, pad in (("min", 0.0, 0.0), ("max", 1.0, 0.0 if unpack else 1.0)):
        given = tensors.get(f"{key}.{stat}")
        flat = np.full(width, default, np.float32) if given is None else given.astype(np.float32).reshape(-1)
        aligned[stat] = np.concatenate([flat, np.full(max(0, width - flat.shape[0]), pad, np.float32)])[:width]
    return aligned
