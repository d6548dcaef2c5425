"""What the trainers' files say about a checkpoint folder: which files are its weights (and which to leave
alone), the embodiments it was trained for, the tag -> slot map it was trained with, and whether its config ties
the token embedding. Each trainer's rules (../shared/reference/fine-tunes.md) live here and nowhere else:

- Isaac-GR00T N1.5: `experiment_cfg/metadata.json`, keyed by the trained tags;
- Isaac-GR00T N1.6/N1.7: `experiment_cfg/conf.yaml` / `config.yaml` (`data.datasets[].embodiment_tag`), and the
  checkpoint's own `embodiment_id.json` (in `checkpoint-N/`, or under `processor/` of the run folder above it);
- LeRobot: `policy_preprocessor.json` (its pack step's `embodiment_tag` and the `embodiment_mapping` it packed
  with: a tag outside it trained slot 0), else `config.json` (`"type": "groot"`, `"embodiment_tag"`) and LeRobot's
  own table.

Each file is small and read whole (`small_json`), never trusted: a fact that cannot be had is one sentence naming
the file and the remedy. What the tensors themselves say is pipeline/inputs/tensors.py.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import yaml

from pipeline.inputs.embodiments import TagMap
from pipeline.model.versions import VersionConfig
from tasks.errors import CheckpointError
from tasks.io.file_blocks import file_size, read_whole
from tasks.source.checkpoint import INDEX_NAME, SINGLE_NAME

EXPERIMENT_CFG = "experiment_cfg"
N15_METADATA = f"{EXPERIMENT_CFG}/metadata.json"
ISAAC_CONFIGS = (f"{EXPERIMENT_CFG}/conf.yaml", f"{EXPERIMENT_CFG}/config.yaml")
EMBODIMENT_MAP = "embodiment_id.json"
MAP_PLACES = (EMBODIMENT_MAP, f"processor/{EMBODIMENT_MAP}")
ADAPTER_FILES = ("adapter_model.safetensors", "adapter_config.json")
LEROBOT_PREPROCESSOR = "policy_preprocessor.json"
# LeRobot's pack step, which puts `embodiment_mapping.get(embodiment_tag, 0)` in the batch: groot_pack_inputs_v3
# (0.5.1, N1.5), groot_n1_7_pack_inputs_v1 (0.6.1, N1.7).
_PACK_STEP = re.compile(r"^groot_(?:.*_)?pack_inputs_v\d+$")
# What `--model` fetches of a hub repo: the weights, the index, the small files read here, and the trainer's
# processor files the entry keeps (pipeline/inputs/processor_files.py); never optimizer states, DeepSpeed's
# `global_step*/`, or a trainer's other files.
PROCESSOR_HUB_FILES = ["processor_config.json", "statistics.json", "processor/processor_config.json",
                       "processor/statistics.json", "policy_postprocessor.json",
                       "policy_preprocessor_step_*.safetensors", "policy_postprocessor_step_*.safetensors"]
HUB_FILES = [INDEX_NAME, SINGLE_NAME, "model-*-of-*.safetensors", "config.json", LEROBOT_PREPROCESSOR, N15_METADATA,
             *ISAAC_CONFIGS, *MAP_PLACES, "adapter_config.json", *PROCESSOR_HUB_FILES]
_RUN_CHECKPOINT = re.compile(r"^checkpoint-\d+")  # a trainer's save inside its run folder (also `-best-…`)
_SMALL_FILE = 64 << 20  # a trainer's JSON/YAML is kilobytes: anything past this is not one


@dataclass(frozen=True)
class Fact:
    """A fact and the file it was read from (or what it defaulted to)."""
    value: object
    source: str


def refuse_adapter(path: Path) -> None:
    """A LoRA adapter folder (Isaac-GR00T N1.5's `utils/peft.py`, or any peft save) holds no base weights."""
    if not path.is_dir() or not all((path / n).is_file() for n in ADAPTER_FILES) or (path / SINGLE_NAME).exists() \
            or (path / INDEX_NAME).exists():
        return
    doc = _small_json(path / "adapter_config.json", "pass the merged model instead")
    base = doc.get("base_model_name_or_path") if isinstance(doc, dict) else None
    raise CheckpointError(path, f"is a LoRA adapter, not a model: it holds no base weights "
                                f"(base: {base or 'not named in adapter_config.json'}); merge it into its base with "
                                "peft (PeftModel.from_pretrained(base, folder).merge_and_unload().save_pretrained(out)) "
                                "and convert the merged folder")


def why_left_alone(name: str) -> str:
    if name.startswith(("policy_preprocessor_step_", "policy_postprocessor_step_")):
        return "LeRobot's normalizer statistics, not model weights: kept with the processor"
    if name == ADAPTER_FILES[0]:
        return "a LoRA adapter, not model weights"
    return "not one of the model's weight files by name"


def config_ties(folder: Path) -> bool | None:
    """What `config.json` says of `tie_word_embeddings` (at any depth: the LLM's config is nested), or None."""
    try:
        doc = _small_json(folder / "config.json", "")
    except CheckpointError:
        return None
    found: list[bool] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("tie_word_embeddings"), bool):
                found.append(node["tie_word_embeddings"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(doc)
    return None if not found else all(found)


def places(folder: Path) -> list[Path]:
    """The folder, and the run folder above a trainer's `checkpoint-N/` (Isaac-GR00T keeps its configs there)."""
    return [folder, folder.parent] if _RUN_CHECKPOINT.match(folder.name) else [folder]


# Where `--embodiments trained` reads the trained tags, in this order: LeRobot's pack step, LeRobot's config,
# Isaac-GR00T N1.6/N1.7's run config, Isaac-GR00T N1.5's metadata.
TRAINED_RECORDS = (LEROBOT_PREPROCESSOR, "config.json", *ISAAC_CONFIGS, N15_METADATA)


def trained_places(folder: Path) -> list[str]:
    return [str(p / name) for p in places(folder) for name in TRAINED_RECORDS]


@dataclass(frozen=True)
class LeRobotPack:
    """LeRobot's pack step as `policy_preprocessor.json` saved it: the tag it packed and the map it packed with."""
    path: Path
    tag: str
    mapping: Mapping[str, int] | None  # None: the step saved no map (LeRobot's own table was its default)


def lerobot_pack(folder: Path) -> LeRobotPack | None:
    """The pack step of the LeRobot processor pipeline saved with the policy, or None when there is none."""
    path = folder / LEROBOT_PREPROCESSOR
    if not path.is_file():
        return None
    remedy = _MAP_REMEDY
    doc = _small_json(path, remedy)
    steps = doc.get("steps") if isinstance(doc, dict) else None
    if not isinstance(steps, list):
        raise CheckpointError(path, f"is not a LeRobot processor pipeline (no list of steps); {remedy}")
    configs = [step.get("config") for step in steps if isinstance(step, dict)
               and isinstance(step.get("registry_name"), str) and _PACK_STEP.match(step["registry_name"])]
    if not configs:
        return None  # a pipeline without GR00T's pack step records no embodiment
    if len(configs) > 1:  # which one packed the batches the policy trained on is not ours to guess
        raise CheckpointError(path, f"holds {len(configs)} GR00T pack steps, and a pipeline packs once; {remedy}")
    config = configs[0]
    if not isinstance(config, dict):
        raise CheckpointError(path, f"its pack step's config must be an object, found {type(config).__name__}; "
                                    f"{remedy}")
    tag, mapping = config.get("embodiment_tag"), config.get("embodiment_mapping")
    if not isinstance(tag, str) or not tag:
        raise CheckpointError(path, f"its pack step's embodiment_tag must be a tag name, found {tag!r}; {remedy}")
    if mapping is not None and not _is_tag_table(mapping):
        raise CheckpointError(path, f"its pack step's embodiment_mapping must be an object of embodiment tag -> slot "
                                    f"id; {remedy}")
    return LeRobotPack(path, tag, mapping)


def _is_tag_table(doc: object) -> bool:
    return isinstance(doc, dict) and all(isinstance(k, str) and type(v) is int and 0 <= v for k, v in doc.items())


_REMEDY = "pass --embodiments with tags or slot ids instead"  # a trained-tag record that cannot be read
# A map that cannot be read is refused whatever is selected: the entry records the map, and a later load by tag
# reads its slot there. Without the file the trainer's own default applies (and the convert says which).
_MAP_REMEDY = "fix it, or remove it to convert with the trainer's default map"
UNREAD = "; " + _REMEDY


def trained_tags(folder: Path, pack: LeRobotPack | None = None) -> Fact | None:
    """The embodiment tags the fine-tune was trained for, as its trainer recorded them, or None. LeRobot's pack
    step (`pack`, read from `folder`) is what packed the batches, so it comes before LeRobot's `config.json`."""
    if pack is not None:
        return Fact((pack.tag,), str(pack.path))
    for place in places(folder):
        lerobot = _lerobot_tag(place / "config.json")
        if lerobot is not None:
            return lerobot
        for name in ISAAC_CONFIGS:
            if (place / name).is_file():
                return _isaac_tags(place / name)
        if (place / N15_METADATA).is_file():
            doc = _small_json(place / N15_METADATA, _REMEDY)
            if not isinstance(doc, dict) or not doc:
                raise CheckpointError(place / N15_METADATA, f"must be an object keyed by embodiment tag; {_REMEDY}")
            return Fact(tuple(sorted(doc)), str(place / N15_METADATA))
    return None


def records_disagreeing(folder: Path, pack: LeRobotPack | None) -> str | None:
    """A trainer writes its records of the trained tag from one value: LeRobot its pack step's and `config.json`'s,
    Isaac-GR00T `conf.yaml` and `config.yaml`. They differ only where one was edited; the one read first stands
    (LeRobot's pack step packed the batches, and packs them again at inference), and the difference is said."""
    try:
        if pack is not None:
            first, said = Fact((pack.tag,), f"the pack step of {pack.path}"), _lerobot_tag(folder / "config.json")
        else:
            place = next((p for p in places(folder) if all((p / n).is_file() for n in ISAAC_CONFIGS)), None)
            if place is None:
                return None
            first, said = _isaac_tags(place / ISAAC_CONFIGS[0]), _isaac_tags(place / ISAAC_CONFIGS[1])
    except CheckpointError:  # a record that cannot be read: said where the trained tags are asked for
        return None
    if said is None or said.value == first.value:
        return None
    return (f"embodiment_tag {', '.join(said.value)} in {said.source} differs from {', '.join(first.value)} in "
            f"{first.source}, which {'packed the batches the policy trained on' if pack else 'is read first'}: using "
            f"{', '.join(first.value)}")


def _lerobot_tag(path: Path) -> Fact | None:
    """The tag in LeRobot's `config.json` (`"type": "groot"`), or None for any other config."""
    if not path.is_file():
        return None
    doc = _small_json(path, _REMEDY)
    if not isinstance(doc, dict) or doc.get("type") != "groot" or "embodiment_tag" not in doc:
        return None
    tag = doc["embodiment_tag"]
    if not isinstance(tag, str) or not tag:
        raise CheckpointError(path, f"embodiment_tag must be a tag name, found {tag!r}; {_REMEDY}")
    return Fact((tag,), str(path))


class _TrainerYaml(yaml.SafeLoader):
    """YAML as Isaac-GR00T's `Config.save` writes it (`yaml.dump` of dataclasses): `!!python/...` tags are read
    as the plain data they hold; nothing is imported or called."""


def _plain(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> object:
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node, deep=True)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    return loader.construct_scalar(node)


_TrainerYaml.add_multi_constructor("tag:yaml.org,2002:python/", _plain)


def _isaac_tags(path: Path) -> Fact:
    remedy = _REMEDY
    try:
        doc = yaml.load(_small_text(path, remedy), Loader=_TrainerYaml)
    except (yaml.YAMLError, RecursionError) as e:
        raise CheckpointError(path, f"is not YAML the trainer could have written ({str(e).splitlines()[0]}); {remedy}") from None
    if not isinstance(doc, dict):  # a list, a string, nothing: not the run config the trainer dumps
        raise CheckpointError(path, f"holds {type(doc).__name__ if doc is not None else 'nothing'}, not the mapping "
                                    f"the trainer writes; {remedy}")
    datasets = doc.get("data", {}).get("datasets") if isinstance(doc.get("data"), dict) else None
    tags: list[str] = []
    for ds in datasets if isinstance(datasets, list) else []:
        tag = ds.get("embodiment_tag") if isinstance(ds, dict) else None
        tag = tag[0] if isinstance(tag, list) and len(tag) == 1 else tag  # an enum, dumped as its value
        if isinstance(tag, str) and tag and tag not in tags:
            tags.append(tag)
    if not tags:
        raise CheckpointError(path, f"names no data.datasets[].embodiment_tag; {remedy}")
    return Fact(tuple(tags), str(path))


def embodiment_map(folder: Path, cfg: VersionConfig, pack: LeRobotPack | None = None
                   ) -> tuple[TagMap, dict[str, tuple[int, int]], str | None]:
    """The tag -> slot map the trainer trained with, the tags on which it and the built-in table disagree, and a
    note when the map was assumed rather than read:
    - LeRobot: the map its pack step saved (`pack`), taken as it is: LeRobot merges nothing into it, and a tag
      outside it trained slot 0. An export without processors: LeRobot's own table (configs [lerobot]).
    - Isaac-GR00T: the checkpoint's `embodiment_id.json` merged over the built-in table, as its processor merges
      them; a tag outside both is refused, as Isaac-GR00T refuses it.
    - Otherwise the built-in table."""
    builtin = dict(cfg.embodiment_ids)

    def differing(theirs: Mapping[str, int]) -> dict[str, tuple[int, int]]:
        return {t: (builtin[t], s) for t, s in sorted(theirs.items()) if t in builtin and builtin[t] != s}

    lerobot = dict(cfg.lerobot.get("embodiments", {}))
    unknown_slot = cfg.lerobot.get("unknown_slot", 0)
    if pack is not None:
        mapping = pack.mapping if pack.mapping is not None else lerobot
        return TagMap(mapping, str(pack.path), unknown_slot), differing(mapping), None
    for place in places(folder):
        for name in MAP_PLACES:
            path = place / name
            if not path.is_file():
                continue
            doc = _small_json(path, _MAP_REMEDY)
            if not _is_tag_table(doc):
                raise CheckpointError(path, f"must be an object of embodiment tag -> slot id; {_MAP_REMEDY}")
            return TagMap({**builtin, **doc}, str(path)), differing(doc), None
    if _lerobot_tag(folder / "config.json") is not None and lerobot:
        release = cfg.lerobot.get("release", "?")
        note = (f"LeRobot saved its tag -> slot map only in {LEROBOT_PREPROCESSOR}, which {folder} lacks: read with "
                f"LeRobot {release}'s own table, what LeRobot packs with when the base checkpoint has no "
                f"{EMBODIMENT_MAP}; if yours had one, pass --embodiments with the slot id it gives")
        return TagMap(lerobot, f"LeRobot {release}'s own table (configs/{cfg.version}.toml [lerobot])", unknown_slot), \
            differing(lerobot), note
    return TagMap.builtin(cfg), {}, None


def _small_text(path: Path, remedy: str) -> str:
    try:
        if (size := file_size(path)) > _SMALL_FILE:
            raise CheckpointError(path, f"is {size} bytes, too large for a trainer's config; {remedy}")
        return read_whole(path).decode()
    except (OSError, UnicodeDecodeError) as e:  # a folder, a FIFO, a permission, bytes that are not text
        raise CheckpointError(path, f"cannot be read ({getattr(e, 'strerror', None) or e}); {remedy}") from None


def _small_json(path: Path, remedy: str) -> object:
    text = _small_text(path, remedy)  # its refusal is a ValueError too: not to be called invalid JSON
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:
        raise CheckpointError(path, f"is not valid JSON ({str(e)[:200]}); {remedy}") from None
