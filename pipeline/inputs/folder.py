"""What a checkpoint folder says about itself, read once into one record (`Folder`) that convert and inspect take:
which files are the model's weights, the GR00T version its keys are, the embodiments it was trained for, the
tag -> slot map it carries, and the tables a save tied. The tensors' story is pipeline/inputs/tensors.py, the
trainers' files pipeline/inputs/trainer_files.py; this module puts them together.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from pipeline.inputs.embodiments import TRAINED, Embodiments, TagMap
from pipeline.inputs.tensors import check_dtypes, check_shapes, detect_version, recognise, tie_tables
from pipeline.inputs.trainer_files import (UNREAD, Fact, embodiment_map, lerobot_pack, records_disagreeing,
                                           refuse_adapter, trained_places, trained_tags, why_left_alone)
from pipeline.model.versions import VersionConfig, load_config
from tasks.errors import CheckpointError
from tasks.old_paths import names_moved
from tasks.source.checkpoint import Checkpoint


@dataclass(frozen=True, kw_only=True)
class Folder:
    """One checkpoint as its folder describes it."""
    checkpoint: Checkpoint
    version: str
    version_found: bool                     # found from the keys (no --version given)
    left_alone: Mapping[str, str]           # *.safetensors not read -> why
    trained: Fact | None                    # tags (a tuple) the trainer recorded, and where
    tag_map: TagMap                         # tag -> slot, and where: the trainer's map, else the built-in table
    overridden: Mapping[str, tuple[int, int]] = field(default_factory=dict)  # tag -> (built-in, checkpoint's)
    ties: Fact | None = None                # {key read from its twin: twin}, and who said they are tied
    map_note: str | None = None             # what to say of a map that was not recorded but assumed
    trained_note: str | None = None         # what to say of a trainer's records that disagree on the tag
    trained_error: CheckpointError | None = None  # why the trained tags cannot be read: said when they are asked for

    @property
    def config(self) -> VersionConfig:
        return load_config(self.version)

    @property
    def bank_slots(self) -> int | None:
        """How many slots this checkpoint's embodiment banks have (None: it holds no bank)."""
        bank = self.config.embodiment_keys[0]
        return self.checkpoint.shape(bank)[0] if bank in self.checkpoint else None

    def chosen(self, embodiments: Embodiments) -> Embodiments:
        """The selection with `trained` replaced by the tags the trainer recorded."""
        if self.trained_error is not None and TRAINED in embodiments.items:
            raise self.trained_error
        missing = (f"--embodiments trained: {self.checkpoint.dir} records no trained embodiment (looked for "
                   f"{', '.join(trained_places(self.checkpoint.dir))}); pass tags or slot ids")
        return embodiments.with_trained(self.trained.value if self.trained else None, missing)

    def slots(self, embodiments: Embodiments) -> tuple[int, ...]:
        """The selection (every slot, tags, slot ids, `trained`) as slot ids of this checkpoint's banks, each tag
        read with the trainer's own map."""
        return self.chosen(embodiments).slots(self.config, self.bank_slots, self.tag_map)

    def source_record(self, model: str | None = None) -> dict:
        """What the entry's `source` records of the folder (recorded, not hashed); `model`: the hub repo it was
        fetched from (--model)."""
        ck = self.checkpoint
        return {"snapshot": str(ck.dir), "revision": snapshot_revision(ck.dir), "synthetic": ck.synthetic,
                "model": model, "key_prefix": ck.prefix or None, "tied": dict(ck.tied) or None,
                "tied_by": self.ties.source if self.ties else None,
                "trained_embodiments": list(self.trained.value) if self.trained else None,
                "trained_from": self.trained.source if self.trained else None,
                "embodiment_map": self.tag_map.source,
                # the map itself, so that a load by tag, in any later process, reads a tag as this convert did
                "embodiment_table": {"ids": dict(self.tag_map.ids), "unknown_slot": self.tag_map.unknown_slot},
                "left_alone": dict(self.left_alone) or None}

    def notes(self, embodiments: Embodiments = Embodiments()) -> list[str]:
        """One line each for what the convert should say: files left alone, the trainer's map overriding ours, a
        map assumed, and each tag named that the trainer's map lacks (the slot its trainer gave it)."""
        builtin, table = self.config.embodiment_ids, f"configs/{self.version}.toml"
        lines = [f"not read: {name} ({why})" for name, why in self.left_alone.items()]
        lines += [f"embodiment {tag}: slot {theirs} by {self.tag_map.source}, not {ours} as in {table}: using the "
                  "checkpoint's" for tag, (ours, theirs) in self.overridden.items()]
        lines += [note for note in (self.map_note, self.trained_note) if note]
        if self.trained_error is not None:  # given the embodiments, the convert does without the record
            lines.append(f"the trained embodiment is not recorded: {str(self.trained_error).removesuffix(UNREAD)}")
        unknown = self.tag_map.unknown_slot
        for tag in self.chosen(embodiments).outside(self.tag_map) if unknown is not None else ():
            ours = f", not {builtin[tag]} as in {table}" if tag in builtin and builtin[tag] != unknown else ""
            lines.append(f"embodiment {tag}: not in the map of {self.tag_map.source}, and LeRobot trains a tag "
                         f"outside its map as slot {unknown}: using slot {unknown}{ours}")
        return lines


def read_folder(path: Path, version: str | None = None) -> Folder:
    """Open the checkpoint at `path` (a folder or one file) and read everything it says about itself; `version`
    None finds it from the keys."""
    refuse_adapter(path)
    ck = Checkpoint(path)
    found = version or detect_version(ck.keys(), ck.where)
    recognise(found, ck.keys(), ck.where)
    check_dtypes(ck)
    cfg = load_config(found)
    check_shapes(ck, cfg)
    ties = tie_tables(ck, cfg)
    for key, twin in (ties.value if ties else {}).items():  # in order: recorded ties first, then embed_tokens'
        ck.tie(key, twin)
    if ties:
        check_shapes(ck, cfg)  # a table read from its twin has the twin's shape, which must be its own
    pack = lerobot_pack(ck.dir)
    tag_map, overridden, map_note = embodiment_map(ck.dir, cfg, pack)
    try:
        trained, unreadable = trained_tags(ck.dir, pack), None
    except CheckpointError as e:  # needed only for --embodiments trained: tags and slot ids do without it
        trained, unreadable = None, e
    return Folder(checkpoint=ck, version=found, version_found=version is None,
                  left_alone={n: why_left_alone(n) for n in ck.left_alone}, trained=trained, trained_error=unreadable,
                  tag_map=tag_map, overridden=overridden, ties=ties, map_note=map_note,
                  trained_note=records_disagreeing(ck.dir, pack))


def snapshot_revision(snapshot: Path) -> str | None:
    """The commit an HF-cache snapshot folder holds (`snapshots/<rev>`); None for any other folder. `snapshot`: a
    checkpoint's folder as `Checkpoint.dir` holds it (a Path, or a UPath in an object store)."""
    return snapshot.name if snapshot.parent.name == "snapshots" else None


# Names that left this module (deprecated, CHANGELOG.md): the trainers' files are trainer_files.py's
__getattr__ = names_moved("pipeline.inputs.folder", dict.fromkeys(
    ("EXPERIMENT_CFG", "N15_METADATA", "ISAAC_CONFIGS", "EMBODIMENT_MAP", "MAP_PLACES", "ADAPTER_FILES",
     "LEROBOT_PREPROCESSOR", "HUB_FILES", "TRAINED_RECORDS", "LeRobotPack", "Read"), "pipeline.inputs.trainer_files"),
    renamed={"Read": "Fact"})
