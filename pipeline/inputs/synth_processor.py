"""The processor files an Isaac-GR00T N1.6 / N1.7 fine-tune saves beside its weights, made from synthetic robot data
with real statistics, as its trainer computes and writes them (../shared/reference/isaac-gr00t/PROVENANCE.md):
`processor_config.json` (`processor_kwargs`, enums by name), `statistics.json` (per tag: `state`, `action` and
`relative_action`, the last `[T, D]`, one row per step) and `embodiment_id.json`.

The robot: an `arm` of 7 joints trained RELATIVE, a `hand` of 6 normalized by mean/std, a `gripper` of 1, a `wrist`
end effector (xyz + rot6d) trained RELATIVE against its own state, and a `waist` of 2 angles that the sin/cos
setting encodes. Every case the trainer's arithmetic has is in it; the settings are the caller's.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

HORIZON = 16                     # the action steps the fine-tune trains (delta_indices)
STATE_GROUPS = {"arm": 7, "hand": 6, "gripper": 1, "wrist": 9, "waist": 2}
ACTION_GROUPS = {"arm": 7, "hand": 6, "gripper": 1, "wrist": 9}
RELATIVE = {"arm": "NON_EEF", "wrist": "EEF"}
MODEL_TYPES = {"n16": "Gr00tN1d6", "n17": "Gr00tN1d7"}
MAX_DIMS = {"n16": (29, 29, 40), "n17": (132, 132, 40)}   # max_state_dim, max_action_dim, max_action_horizon


def _poses(rng: np.random.Generator, n: int) -> np.ndarray:
    """n end-effector poses as xyz + the first two rows of their rotation (rot6d)."""
    from scipy.spatial.transform import Rotation

    rot = Rotation.from_rotvec(rng.normal(0, 0.6, (n, 3))).as_matrix()
    return np.concatenate([rng.normal([0.4, 0.0, 0.3], 0.1, (n, 3)), rot[:, :2, :].reshape(n, 6)], axis=1)


def _matrices(poses: np.ndarray) -> np.ndarray:
    """Poses `[..., 9]` (xyz + rot6d) as 4x4 matrices `[..., 4, 4]`, their rotations made orthonormal as the
    trainer's rot6d reading makes them (Gram-Schmidt)."""
    first = poses[..., 3:6] / np.linalg.norm(poses[..., 3:6], axis=-1, keepdims=True)
    second = poses[..., 6:9] - (first * poses[..., 6:9]).sum(-1, keepdims=True) * first
    second = second / np.linalg.norm(second, axis=-1, keepdims=True)
    out = np.zeros((*poses.shape[:-1], 4, 4))
    out[..., :3, :3] = np.stack([first, second, np.cross(first, second)], axis=-2)
    out[..., :3, 3], out[..., 3, 3] = poses[..., :3], 1.0
    return out


def _relative_poses(references: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """Each step's pose `[N, T, 9]` in its reference's frame `[N, 9]` (T_ref^-1 @ T_step), as xyz + rot6d."""
    ref, step = _matrices(references), _matrices(steps)
    rotation_t = np.swapaxes(ref[:, :3, :3], -1, -2)  # a rigid transform's inverse: R^T, -R^T t
    inverse = np.zeros_like(ref)
    inverse[:, :3, :3], inverse[:, :3, 3], inverse[:, 3, 3] = rotation_t, -(rotation_t @ ref[:, :3, 3:])[..., 0], 1.0
    rel = inverse[:, None] @ step
    return np.concatenate([rel[..., :3, 3], rel[..., :2, :3].reshape(*rel.shape[:-2], 6)], axis=-1)


def _stats(samples: np.ndarray) -> dict[str, list]:
    """The trainer's statistics of samples `[N, ..., D]` over the first axis."""
    return {"min": samples.min(0).tolist(), "max": samples.max(0).tolist(), "mean": samples.mean(0).tolist(),
            "std": samples.std(0).tolist(), "q01": np.quantile(samples, 0.01, axis=0).tolist(),
            "q99": np.quantile(samples, 0.99, axis=0).tolist()}


def robot_data(seed: int = 0, episodes: int = 400) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Synthetic (state, action chunk) samples: each group's state `[N, D]` and actions `[N, HORIZON, D]`."""
    rng = np.random.default_rng(seed)
    state = {"arm": rng.normal(0, 0.8, (episodes, 7)), "hand": rng.normal(0.5, 0.2, (episodes, 6)),
             "gripper": rng.uniform(0, 0.08, (episodes, 1)), "wrist": _poses(rng, episodes),
             "waist": rng.uniform(-np.pi, np.pi, (episodes, 2))}
    state["hand"][:, 5] = 0.25  # a joint that never moved: std 0 and max == min, which the trainer leaves alone
    drift = np.cumsum(rng.normal(0, 0.05, (episodes, HORIZON, 7)), axis=1)
    actions = {"arm": state["arm"][:, None, :] + drift,
               "hand": state["hand"][:, None, :] + rng.normal(0, 0.05, (episodes, HORIZON, 6)),
               "gripper": rng.uniform(0, 0.08, (episodes, HORIZON, 1)),
               "wrist": np.stack([_poses(rng, HORIZON) for _ in range(episodes)])}
    actions["hand"][:, :, 5] = 0.25
    return state, actions


def isaac_processor_files(version: str, tag: str, ids: Mapping[str, int], seed: int = 0,
                          settings: Mapping[str, object] | None = None) -> dict[str, object]:
    """name -> the JSON document Isaac-GR00T writes, for a fine-tune of `tag` (`settings` over the defaults of
    `processor_kwargs`: use_percentiles, clip_outliers, apply_sincos_state_encoding, use_relative_action)."""
    state, actions = robot_data(seed)
    relative = {"arm": actions["arm"] - state["arm"][:, None, :],
                "wrist": _relative_poses(state["wrist"], actions["wrist"])}
    statistics = {tag: {"state": {g: _stats(v) for g, v in state.items()},
                        "action": {g: _stats(v.reshape(-1, v.shape[-1])) for g, v in actions.items()},
                        "relative_action": {g: _stats(v) for g, v in relative.items()}}}
    max_state, max_action, max_horizon = MAX_DIMS[version]
    action_configs = [{"rep": "RELATIVE" if g in RELATIVE else "ABSOLUTE", "type": RELATIVE.get(g, "NON_EEF"),
                       "format": "XYZ_ROT6D" if g == "wrist" else "DEFAULT", "state_key": None} for g in ACTION_GROUPS]
    modality = {"state": {"delta_indices": [0], "modality_keys": list(STATE_GROUPS),
                          "sin_cos_embedding_keys": ["waist"], "mean_std_embedding_keys": ["hand"],
                          "action_configs": None},
                "action": {"delta_indices": list(range(HORIZON)), "modality_keys": list(ACTION_GROUPS),
                           "sin_cos_embedding_keys": None, "mean_std_embedding_keys": ["hand"],
                           "action_configs": action_configs},
                "video": {"delta_indices": [0], "modality_keys": ["ego_view"]},
                "language": {"delta_indices": [0], "modality_keys": ["annotation.human.task_description"]}}
    kwargs = {"modality_configs": {tag: modality}, "max_state_dim": max_state, "max_action_dim": max_action,
              "max_action_horizon": max_horizon, "use_percentiles": False, "clip_outliers": True,
              "apply_sincos_state_encoding": True, "use_relative_action": True, "image_crop_size": None,
              "image_target_size": [224, 224], "formalize_language": True,
              "model_name": "nvidia/Cosmos-Reason2-2B" if version == "n17" else "nvidia/Eagle-Block2A-2B-v2"}
    if version == "n17":  # N1.7's additions
        kwargs |= {"use_mean_std": False, "exclude_state": False, "state_dropout_prob": 0.0,
                   "letter_box_transform": False}
    kwargs |= dict(settings or {})
    return {"processor_config.json": {"processor_class": f"{MODEL_TYPES[version]}Processor",
                                      "processor_kwargs": kwargs},
            "statistics.json": statistics, "embodiment_id.json": dict(ids)}


def n15_metadata(tag: str, seed: int = 0) -> dict:
    """`experiment_cfg/metadata.json` as Isaac-GR00T N1.5 writes it: per tag, the dataset's statistics per state and
    action key, and the modalities (each key's shape and whether it is absolute); the normalization modes are the
    caller's data config's, in code, not here."""
    state, actions = robot_data(seed)
    flat = {g: v.reshape(-1, v.shape[-1]) for g, v in actions.items()}

    def modality(groups: dict) -> dict:
        return {g: {"absolute": True, "rotation_type": None, "shape": [v.shape[-1]], "continuous": True}
                for g, v in groups.items()}

    return {tag: {"statistics": {"state": {g: _stats(v) for g, v in state.items()},
                                 "action": {g: _stats(v) for g, v in flat.items()}},
                  "modalities": {"video": {"ego_view": {"resolution": [256, 256], "channels": 3, "fps": 20.0}},
                                 "state": modality(state), "action": modality(flat)},
                  "embodiment_tag": tag}}
