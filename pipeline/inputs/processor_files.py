"""The files that make a fine-tune act, as its trainer saved them beside the weights: its processor (the modality
config and the dataset statistics that normalize the robot's state and un-normalize the model's actions). Read as
data only, each small and checked (JSON that parses, with no NaN or infinity; safetensors with finite values), and
kept in the entry by content (tasks/entries/manifest.py `Identity.processor`), so that the cache alone can act.

- Isaac-GR00T N1.6 / N1.7: `processor_config.json`, `statistics.json`, `embodiment_id.json`, in the checkpoint's
  folder or its `processor/`, or in those of the run folder above a `checkpoint-N/`;
- Isaac-GR00T N1.5: `experiment_cfg/metadata.json` (statistics and modalities by tag);
- LeRobot: `policy_preprocessor.json`, `policy_postprocessor.json`, their steps' `.safetensors` and `config.json`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import numpy as np

from pipeline.inputs.trainer_files import EXPERIMENT_CFG, LEROBOT_PREPROCESSOR, N15_METADATA, places
from pipeline.model.processor import ISAAC_FILES, finite_json
from tasks.errors import CheckpointError
from tasks.io.file_blocks import file_size, read_whole

ISAAC, ISAAC_N15, LEROBOT = "Isaac-GR00T", "Isaac-GR00T N1.5", "LeRobot"
LEROBOT_POSTPROCESSOR = "policy_postprocessor.json"
_LEROBOT_STEP = re.compile(r"^policy_(?:pre|post)processor_step_\d+_[\w.-]+\.safetensors$")
MAX_FILE = 64 << 20   # statistics are kilobytes; a file past this is not a processor's
_REMEDY = "fix or remove it (the weights convert without a processor), or convert from the folder the trainer wrote"


@dataclass(frozen=True)
class ProcessorFiles:
    """A trainer's processor files as the entry keeps them: name -> bytes, the trainer, and the folder read."""
    trainer: str
    files: Mapping[str, bytes] = field(repr=False)
    where: str

    def record(self) -> dict:
        """What the entry's source records of it (not hashed: the files' own bytes are)."""
        return {"trainer": self.trainer, "from": self.where, "files": sorted(self.files),
                "embodiments": embodiments_of(self)}


def read_processor_files(folder: Path) -> ProcessorFiles | None:
    """The trainer's processor files found for the checkpoint in `folder`, or None when it saved none there."""
    if (folder / LEROBOT_PREPROCESSOR).is_file() or (folder / LEROBOT_POSTPROCESSOR).is_file():
        names = [p.name for p in sorted(folder.iterdir()) if _LEROBOT_STEP.match(p.name)]
        names += [n for n in (LEROBOT_PREPROCESSOR, LEROBOT_POSTPROCESSOR, "config.json") if (folder / n).is_file()]
        return ProcessorFiles(LEROBOT, {n: _checked(folder / n) for n in sorted(names)}, str(folder))
    for place in places(folder):
        for sub in (place, place / "processor"):
            if all((sub / n).is_file() for n in ISAAC_FILES[:2]):
                names = [n for n in ISAAC_FILES if (sub / n).is_file()]
                return ProcessorFiles(ISAAC, {n: _checked(sub / n) for n in names}, str(sub))
        if (place / N15_METADATA).is_file():
            return ProcessorFiles(ISAAC_N15, {"metadata.json": _checked(place / N15_METADATA)},
                                  str(place / EXPERIMENT_CFG))
    return None


def _checked(path: Path) -> bytes:
    """A processor file's bytes, refused in one sentence when they cannot be one."""
    try:
        if (size := file_size(path)) > MAX_FILE:
            raise CheckpointError(path, f"is {size} bytes, too large for a trainer's processor file; {_REMEDY}")
        raw = read_whole(path)
    except OSError as e:
        raise CheckpointError(path, f"cannot be read ({getattr(e, 'strerror', None) or e}); {_REMEDY}") from None
    if path.suffix == ".json":
        if not finite_json(raw):
            raise CheckpointError(path, f"is not JSON with finite numbers (invalid, or a NaN or infinite "
                                        f"statistic); {_REMEDY}")
        return raw
    return _finite_safetensors(path, raw)


def _finite_safetensors(path: Path, raw: bytes) -> bytes:
    """LeRobot's normalizer statistics: a safetensors file of small float tensors, every value finite."""
    from safetensors.numpy import load

    try:
        tensors = load(raw)
    except Exception as e:  # the library's own error for any malformed file: what it says is the sentence
        raise CheckpointError(path, f"is not a safetensors file ({str(e)[:120]}); {_REMEDY}") from None
    for name, values in tensors.items():
        if values.dtype.kind == "f" and not np.isfinite(values).all():
            raise CheckpointError(path, f"holds a NaN or infinite value in {name}; {_REMEDY}")
    return raw


def embodiments_of(files: ProcessorFiles) -> list[str]:
    """The embodiment tags the processor holds statistics for."""
    if files.trainer == ISAAC:
        from pipeline.model.processor import embodiments_in

        return embodiments_in(files.files)
    if files.trainer == ISAAC_N15:
        doc = json.loads(files.files["metadata.json"])
        return sorted(doc) if isinstance(doc, dict) else []
    pack = json.loads(files.files.get(LEROBOT_PREPROCESSOR, b"{}"))
    steps = pack.get("steps", []) if isinstance(pack, dict) else []
    tags = [s.get("config", {}).get("embodiment_tag") for s in steps if isinstance(s, dict)
            and isinstance(s.get("config"), dict)]
    return sorted({t for t in tags if isinstance(t, str)})
