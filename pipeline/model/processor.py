"""A fine-tune's processor: what its trainer saved beside the weights to turn a robot's state into the model's input
and the model's output into the robot's actions, for one embodiment. Built from the trainer's files as the entry
keeps them (`from_files`); the arithmetic is tasks/numerics/state_action.py, the trainer's own.

Isaac-GR00T N1.6 and N1.7: `processor_config.json` (`processor_kwargs`: the modality configs per embodiment tag,
`max_state_dim`, `max_action_dim`, `use_percentiles`, `clip_outliers`, `apply_sincos_state_encoding`,
`use_relative_action`), `statistics.json` (per tag: `state`, `action`, `relative_action` statistics per group) and
`embodiment_id.json` (tag -> slot). Every fact is checked as it is read: a processor that cannot act is one
sentence (`ProcessorError`) naming the file and what is wrong. LeRobot's GR00T N1.7 pipelines:
pipeline/model/lerobot_processor.py.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from tasks.errors import PipelineError
from tasks.numerics import state_action as arithmetic

PROCESSOR_CONFIG, STATISTICS, EMBODIMENT_IDS = "processor_config.json", "statistics.json", "embodiment_id.json"
ISAAC_FILES = (PROCESSOR_CONFIG, STATISTICS, EMBODIMENT_IDS)
STAT_NAMES = ("min", "max", "mean", "std", "q01", "q99")
_POSES = set(arithmetic.POSE_WIDTH)


class ProcessorError(PipelineError):
    """A processor that cannot act on what it was given, or files that cannot make one: one sentence."""


@dataclass(frozen=True)
class Group:
    """One joint group: its name, its raw width, how it is normalized, and its statistics."""
    name: str
    width: int
    mode: str                                  # arithmetic.MIN_MAX, MEAN_STD or SIN_COS
    stats: Mapping[str, np.ndarray] = field(repr=False, default_factory=dict)
    relative: bool = False                     # an action group trained relative to the state's last step
    kind: str = arithmetic.JOINT               # arithmetic.JOINT or END_EFFECTOR
    pose: str = arithmetic.HOMOGENEOUS         # an end effector's pose format
    state_key: str | None = None               # the state group a relative action is made absolute against


@dataclass(frozen=True)
class Processor:
    """One embodiment's processor: `.state(groups)` is the model's state input, `.actions(output, state=groups)`
    the robot's actions, as the trainer's own processor makes them."""
    trainer: str
    embodiment: str
    embodiment_id: int | None
    state_groups: tuple[Group, ...]
    action_groups: tuple[Group, ...]
    action_horizon: int
    max_state_dim: int
    max_action_dim: int
    clip_outliers: bool
    source: str = ""                           # where its files were kept, for the sentences
    clip_actions: bool = True                  # the model's output clipped to [-1, 1] before min/max unnormalizing
    libero_gripper: bool | None = None         # LeRobot's LIBERO gripper on the last action value: binarized or not

    @property
    def state_dims(self) -> dict[str, int]:
        return {g.name: g.width for g in self.state_groups}

    @property
    def action_dims(self) -> dict[str, int]:
        return {g.name: g.width for g in self.action_groups}

    def state(self, groups: Mapping[str, object]) -> np.ndarray:
        """`groups`: each state group -> raw values `[..., T, D]`. Returns float32 `[..., T, max_state_dim]`: each
        group normalized, in the configured order, zero-padded, as the trainer's processor hands it to its model."""
        parts = []
        for g in self.state_groups:
            values = self._group(groups, g, "state")
            parts.append(arithmetic.normalize(values, g.mode, g.stats, self.clip_outliers))
        joined = np.concatenate(parts, axis=-1)
        padded = np.zeros((*joined.shape[:-1], self.max_state_dim), dtype=np.float32)
        padded[..., :joined.shape[-1]] = joined
        return padded

    def actions(self, output: object, state: Mapping[str, object] | None = None) -> dict[str, np.ndarray]:
        """`output`: the model's actions `[..., H, max_action_dim]`. Returns each action group `[..., horizon, D]`
        in the robot's units: split by group, cut to the trained horizon, unnormalized, and each relative group
        made absolute against the last step of its raw state group (`state`, as given to `.state`)."""
        out = np.asarray(output)
        if out.ndim < 2 or out.shape[-1] < sum(self.action_dims.values()) or out.shape[-2] < self.action_horizon:
            raise ProcessorError(f"the model's output has shape {list(out.shape)}, not [..., H >= "
                                 f"{self.action_horizon}, {self.max_action_dim}] for embodiment {self.embodiment}; "
                                 "pass the action tensor the model returned")
        if not np.issubdtype(out.dtype, np.floating):
            out = out.astype(np.float64)
        actions, start = {}, 0
        for g in self.action_groups:
            part = out[..., :self.action_horizon, start:start + g.width]
            start += g.width
            actions[g.name] = arithmetic.unnormalize(part, g.mode, g.stats, self.clip_actions)
            if self.libero_gripper is not None:
                actions[g.name] = arithmetic.libero_gripper(actions[g.name], self.libero_gripper)
        for g in self.action_groups:
            if not g.relative:
                continue
            key = g.state_key or g.name
            if state is None:
                raise ProcessorError(f"action group {g.name!r} of embodiment {self.embodiment} was trained relative "
                                     f"to the state: pass state= the raw state groups given to .state()")
            reference = self._group(state, self._state_group(key, g), "state")
            try:
                actions[g.name] = arithmetic.absolute(actions[g.name], reference[..., -1, :], g.kind, g.pose)
            except ValueError as e:  # scipy's refusal of a rotation that is none (zero rows, NaN)
                raise ProcessorError(f"action group {g.name!r} cannot be made absolute against state group {key!r} "
                                     f"of embodiment {self.embodiment}: its pose is no rotation ({str(e)[:80]}); "
                                     f"pass the end effector's pose as the robot reads it ({g.pose})") from None
        return actions

    def describe(self) -> dict:
        """What `load --json`, `inspect` and `cache ls` say of it."""
        return {"trainer": self.trainer, "embodiment": self.embodiment, "embodiment_id": self.embodiment_id,
                "state": self.state_dims, "action": self.action_dims, "action_horizon": self.action_horizon,
                "max_state_dim": self.max_state_dim, "max_action_dim": self.max_action_dim}

    def _state_group(self, key: str, action: Group) -> Group:
        found = next((g for g in self.state_groups if g.name == key), None)
        if found is None:  # the trainer's config names a reference the state does not have
            return Group(key, action.width, arithmetic.MIN_MAX)
        return found

    def _group(self, groups: Mapping[str, object], g: Group, what: str) -> np.ndarray:
        if not isinstance(groups, Mapping):
            raise ProcessorError(f"the {what} must map each group ({', '.join(self.state_dims)}) to an array; got "
                                 f"{type(groups).__name__}")
        if g.name not in groups:
            raise ProcessorError(f"the {what} lacks group {g.name!r} of embodiment {self.embodiment} (it has "
                                 f"{', '.join(map(repr, groups)) or 'none'}; expected {', '.join(self.state_dims)})")
        try:
            values = np.asarray(groups[g.name])
        except (TypeError, ValueError) as e:
            raise ProcessorError(f"the {what} group {g.name!r} is not an array of numbers ({e})") from None
        if values.dtype.kind not in "fiu":
            raise ProcessorError(f"the {what} group {g.name!r} holds {values.dtype}, not numbers")
        if values.ndim < 2 or values.shape[-1] != g.width:
            raise ProcessorError(f"the {what} group {g.name!r} has shape {list(values.shape)}, not [..., T, "
                                 f"{g.width}] (embodiment {self.embodiment} records {g.width} values for it)")
        # the trainer's processor takes floats (its pinned code truncates integers): a robot's readings are floats
        return values if values.dtype.kind == "f" else values.astype(np.float64)


def embodiments_in(files: Mapping[str, bytes]) -> list[str]:
    """The embodiment tags whose statistics a trainer's processor files hold (empty when they hold none)."""
    try:
        stats = json.loads(files[STATISTICS]) if STATISTICS in files else {}
    except ValueError:
        return []
    return sorted(stats) if isinstance(stats, dict) else []


def from_files(files: Mapping[str, bytes], tag: str, slot: int | None, source: str, trainer: str) -> Processor:
    """The processor of embodiment `tag` (trained as slot `slot`) from a trainer's kept files; ProcessorError, one
    sentence, when they cannot make one."""
    config = kept_json(files, PROCESSOR_CONFIG, source)
    statistics = kept_json(files, STATISTICS, source)
    kwargs = config.get("processor_kwargs") if isinstance(config, dict) else None
    if not isinstance(kwargs, dict):
        raise ProcessorError(f"{source}/{PROCESSOR_CONFIG}: has no processor_kwargs object; keep the file the trainer "
                             "wrote")
    modalities = kwargs.get("modality_configs")
    if not isinstance(modalities, dict) or not isinstance(statistics, dict):
        raise ProcessorError(f"{source}: {PROCESSOR_CONFIG} has no modality_configs, or {STATISTICS} is not an "
                             "object keyed by embodiment tag; keep the files the trainer wrote")
    if tag not in statistics or tag not in modalities:
        held = sorted(set(statistics) & set(modalities))
        raise ProcessorError(f"{source}: the trainer's statistics do not cover embodiment {tag} (they cover "
                             f"{', '.join(held) or 'none'}); load one of those")
    for unsupported in ("exclude_state", "use_tactile"):
        if kwargs.get(unsupported):
            raise ProcessorError(f"{source}/{PROCESSOR_CONFIG}: {unsupported} is set, which this processor does not "
                                 "reproduce; run the trainer's own processor for this fine-tune")
    reader = _Reader(source, tag, kwargs, statistics[tag], modalities[tag])
    return Processor(trainer=trainer, embodiment=tag, embodiment_id=slot, state_groups=reader.state_groups(),
                     action_groups=reader.action_groups(), action_horizon=reader.horizon(),
                     max_state_dim=reader.size("max_state_dim"), max_action_dim=reader.size("max_action_dim"),
                     clip_outliers=reader.flag("clip_outliers", True), source=source)


def kept_json(files: Mapping[str, bytes], name: str, source: str) -> object:
    """A kept JSON file of a trainer's processor, parsed (no NaN or infinity); ProcessorError when missing or
    not JSON."""
    if name not in files:
        raise ProcessorError(f"{source}: holds no {name}; convert the fine-tune again from a folder that has it")
    try:
        return json.loads(files[name], parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as e:
        raise ProcessorError(f"{source}/{name}: is not valid JSON ({str(e)[:120]})") from None


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number a statistic can be")


class _Reader:
    """One embodiment's part of the trainer's files, read and checked field by field."""

    def __init__(self, source: str, tag: str, kwargs: dict, stats: object, modalities: object):
        self.source, self.tag, self.kwargs = source, tag, kwargs
        self.stats = stats if isinstance(stats, dict) else self._bad(STATISTICS, f"{tag} is not an object")
        self.modalities = modalities if isinstance(modalities, dict) else \
            self._bad(PROCESSOR_CONFIG, f"modality_configs.{tag} is not an object")

    def _bad(self, name: str, what: str):
        raise ProcessorError(f"{self.source}/{name}: {what}; keep the file the trainer wrote")

    def flag(self, name: str, default: bool) -> bool:
        value = self.kwargs.get(name, default)
        return value if isinstance(value, bool) else self._bad(PROCESSOR_CONFIG, f"{name} is {value!r}, not true "
                                                                                 "or false")

    def size(self, name: str) -> int:
        value = self.kwargs.get(name)
        if type(value) is not int or not 0 < value < 1 << 20:
            self._bad(PROCESSOR_CONFIG, f"{name} is {value!r}, not a positive width")
        return value

    def _modality(self, which: str) -> dict:
        doc = self.modalities.get(which)
        if not isinstance(doc, dict) or not _names(doc.get("modality_keys")) or not doc["modality_keys"]:
            self._bad(PROCESSOR_CONFIG, f"modality_configs.{self.tag}.{which} has no list of modality_keys")
        return doc

    def _keys(self, doc: dict, name: str, which: str) -> set[str]:
        value = doc.get(name)
        if value is None:
            return set()
        if not _names(value):
            self._bad(PROCESSOR_CONFIG, f"modality_configs.{self.tag}.{which}.{name} is not a list of group names")
        return set(value)

    def horizon(self) -> int:
        steps = self._modality("action").get("delta_indices")
        if not isinstance(steps, list) or not steps:
            self._bad(PROCESSOR_CONFIG, f"modality_configs.{self.tag}.action.delta_indices is not a list of steps")
        return len(steps)

    def _stats(self, which: str, group: str, names: tuple[str, ...]) -> dict[str, np.ndarray]:
        doc = self.stats.get(which)
        table = doc.get(group) if isinstance(doc, dict) else None
        if not isinstance(table, dict):
            self._bad(STATISTICS, f"{self.tag}.{which} has no statistics for group {group!r}")
        out = {}
        for name in names:
            try:
                values = np.asarray(table.get(name), dtype=np.float64)
            except (TypeError, ValueError):
                values = np.asarray([])
            if values.ndim not in (1, 2) or values.size == 0:
                self._bad(STATISTICS, f"{self.tag}.{which}.{group}.{name} is not a list of numbers")
            if not np.isfinite(values).all():
                self._bad(STATISTICS, f"{self.tag}.{which}.{group}.{name} holds a NaN or infinite value")
            out[name] = values
        widths = {v.shape[-1] for v in out.values()}
        if len(widths) != 1:
            self._bad(STATISTICS, f"{self.tag}.{which}.{group}'s statistics differ in width ({sorted(widths)})")
        return out

    def state_groups(self) -> tuple[Group, ...]:
        doc = self._modality("state")
        sincos = self._keys(doc, "sin_cos_embedding_keys", "state") if self.flag("apply_sincos_state_encoding",
                                                                                 False) else set()
        mean_std = self._keys(doc, "mean_std_embedding_keys", "state")
        low, high = ("q01", "q99") if self.flag("use_percentiles", False) else ("min", "max")
        groups = []
        for name in doc["modality_keys"]:
            if name in sincos:  # the trainer's statistics give its width; its values are not used
                width = self._stats("state", name, ("min",))["min"].shape[-1]
                groups.append(Group(name, width, arithmetic.SIN_COS))
                continue
            mode = arithmetic.MEAN_STD if name in mean_std else arithmetic.MIN_MAX
            stats = self._stats("state", name, ("mean", "std") if mode == arithmetic.MEAN_STD else (low, high))
            stats = {("min" if k == low else "max" if k == high else k): v for k, v in stats.items()}
            groups.append(Group(name, next(iter(stats.values())).shape[-1], mode, stats))
        return tuple(groups)

    def action_groups(self) -> tuple[Group, ...]:
        doc = self._modality("action")
        mean_std = self._keys(doc, "mean_std_embedding_keys", "action")
        configs = doc.get("action_configs")
        if configs is not None and (not isinstance(configs, list) or len(configs) != len(doc["modality_keys"])):
            self._bad(PROCESSOR_CONFIG, f"modality_configs.{self.tag}.action.action_configs is not one per group")
        relative_on = self.flag("use_relative_action", False)
        low, high = ("q01", "q99") if self.flag("use_percentiles", False) else ("min", "max")
        groups = []
        for i, name in enumerate(doc["modality_keys"]):
            how = self._action_config(configs[i] if configs else None, name)
            mode = arithmetic.MEAN_STD if name in mean_std else arithmetic.MIN_MAX
            absolute = self._stats("action", name, (low, high, "mean", "std"))
            width = absolute[low].shape[-1]
            relative = relative_on and how["rep"] == "RELATIVE"
            if relative:  # the trainer's relative statistics replace the absolute ones whole: min/max, never q01/q99
                stats = self._stats("relative_action", name, ("min", "max", "mean", "std"))
            else:
                stats = {"min": absolute[low], "max": absolute[high], "mean": absolute["mean"], "std": absolute["std"]}
            kind, pose = how["type"], how["format"]
            if relative and kind == arithmetic.END_EFFECTOR and arithmetic.POSE_WIDTH[pose] != width:
                self._bad(PROCESSOR_CONFIG, f"action group {name!r} is an end effector in {pose}, which is "
                                            f"{arithmetic.POSE_WIDTH[pose]} wide, not {width}")
            groups.append(Group(name, width, mode, {k: stats[k] for k in ("min", "max", "mean", "std")}, relative,
                                kind, pose, how["state_key"]))
        return tuple(groups)

    def _action_config(self, doc: object, name: str) -> dict:
        if doc is None:
            return {"rep": "ABSOLUTE", "type": arithmetic.JOINT, "format": arithmetic.HOMOGENEOUS, "state_key": None}
        where = f"modality_configs.{self.tag}.action.action_configs of {name!r}"
        if not isinstance(doc, dict):
            self._bad(PROCESSOR_CONFIG, f"{where} is not an object")
        rep, kind, pose, key = doc.get("rep"), doc.get("type"), doc.get("format", "DEFAULT"), doc.get("state_key")
        if rep not in ("RELATIVE", "DELTA", "ABSOLUTE") or kind not in (arithmetic.JOINT, arithmetic.END_EFFECTOR) \
                or pose not in _POSES or not (key is None or isinstance(key, str)):
            self._bad(PROCESSOR_CONFIG, f"{where} has rep {rep!r}, type {kind!r}, format {pose!r}: not what the "
                                        "trainer writes")
        return {"rep": rep, "type": kind, "format": pose, "state_key": key}


def _names(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) and v for v in value)


def finite_json(raw: bytes) -> bool:
    """Whether JSON text holds no NaN or infinity (which Python's json reads, and no statistic may be)."""
    try:
        json.loads(raw, parse_constant=_refuse_constant, parse_float=lambda s: _finite(float(s)))
    except (ValueError, RecursionError):
        return False
    return True


def _finite(x: float) -> float:
    if not math.isfinite(x):
        raise ValueError("not finite")
    return x
