"""Isaac-GR00T's own state and action processing, run as the tests' oracle: the pinned `StateActionProcessor`
(../shared/reference/isaac-gr00t/, upstream's files at one commit) driven the way its N1.6 / N1.7 processor drives it
(concatenate the normalized state groups in order and zero-pad them; split the model's actions by group, cut them
to the horizon, `unapply_action`)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

PINNED = Path(__file__).resolve().parents[2] / "shared" / "reference" / "isaac-gr00t"


def state_action_processor():
    """The pinned class, imported from its folder (skips, naming it, where ../shared is not beside the project)."""
    if not (PINNED / "gr00t" / "data" / "state_action" / "state_action_processor.py").is_file():
        pytest.skip(f"[port] Isaac-GR00T's pinned processor is not at {PINNED}")
    if str(PINNED) not in sys.path:
        sys.path.insert(0, str(PINNED))
    from gr00t.data.state_action.state_action_processor import StateActionProcessor

    return StateActionProcessor


class Oracle:
    """The trainer's processor for one embodiment, from the documents its files hold."""

    def __init__(self, documents: dict, tag: str):
        kwargs = documents["processor_config.json"]["processor_kwargs"]
        self.tag, self.kwargs = tag, kwargs
        self.config = kwargs["modality_configs"][tag]
        self.processor = state_action_processor()(
            modality_configs={tag: {m: self.config[m] for m in ("state", "action")}},
            statistics=documents["statistics.json"], use_percentiles=kwargs["use_percentiles"],
            clip_outliers=kwargs["clip_outliers"], apply_sincos_state_encoding=kwargs["apply_sincos_state_encoding"],
            use_relative_action=kwargs["use_relative_action"])
        self.processor.eval()

    def state(self, groups: dict[str, np.ndarray]) -> np.ndarray:
        """One observation's groups `[T, D]` -> `[T, max_state_dim]` float32, as the trainer's processor makes it."""
        normalized = self.processor.apply_state(groups, self.tag)
        joined = np.concatenate([normalized[k] for k in self.config["state"]["modality_keys"]], axis=-1)
        padded = np.concatenate([joined, np.zeros((joined.shape[0], self.kwargs["max_state_dim"] - joined.shape[1]))],
                                axis=-1)
        return padded.astype(np.float32)

    def actions(self, output: np.ndarray, state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The model's `[B, H, max_action_dim]` -> each group `[B, horizon, D]` (decode_action's arithmetic)."""
        horizon = len(self.config["action"]["delta_indices"])
        split, start = {}, 0
        for key in self.config["action"]["modality_keys"]:
            width = int(self.processor.norm_params[self.tag]["action"][key]["dim"])
            split[key] = output[..., :horizon, start:start + width]
            start += width
        return self.processor.unapply_action(split, self.tag, state=state)
