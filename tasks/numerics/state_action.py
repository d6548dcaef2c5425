"""A fine-tune's state and action arithmetic, as its trainer does it: the robot's raw state into what the model
takes, and the model's output back into the robot's units. Values only (numpy, and scipy's rotations for end
effectors, as the trainer uses them); what the numbers are (statistics, groups, modes) is the caller's.

Isaac-GR00T N1.6 and N1.7 (`StateActionProcessor`, pinned in ../shared/reference/isaac-gr00t/ and run by the tests
as the oracle) normalize each state group one of three ways and concatenate the groups in the configured order,
zero-padded to the model's width; an action group is unnormalized and, when it was trained RELATIVE, made absolute
against the last step of the raw state. The quirks are the trainer's and are kept: min/max maps to [-1, 1] where
max and min are not `isclose`, leaves 0 elsewhere, and clips the model's output to [-1, 1] before unnormalizing;
mean/std leaves a value whose std is 0 as it is.

LeRobot's GR00T N1.7 steps (`GrootN17PackInputsStep`, `GrootActionUnpackUnnormalizeStep`: lerobot 0.6.1's
policies/groot/processor_groot.py; the tests hold this to what LeRobot's own saved pipeline gives) differ in the
details, which are theirs and kept too: one flat state and one flat action, float32 statistics; min/max maps where
`max - min != 0` (not `isclose`), as `2 * (x - min) / (max - min) - 1`, and clips only when told; unnormalizing
gives `min` where the spread is 0, and clips the model's output only when told.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

MIN_MAX, MEAN_STD, SIN_COS = "min_max", "mean_std", "sin_cos"
LEROBOT_MIN_MAX, IDENTITY = "lerobot_min_max", "identity"
JOINT, END_EFFECTOR = "NON_EEF", "EEF"
XYZ_ROT6D, XYZ_ROTVEC, HOMOGENEOUS = "XYZ_ROT6D", "XYZ_ROTVEC", "DEFAULT"
POSE_WIDTH = {XYZ_ROT6D: 9, XYZ_ROTVEC: 6, HOMOGENEOUS: 16}


def normalize(values: np.ndarray, mode: str, stats: Mapping[str, np.ndarray], clip: bool) -> np.ndarray:
    """One state group's raw values `[..., D]` as the model takes them (`[..., 2D]` for sin/cos)."""
    if mode == SIN_COS:
        return np.concatenate([np.sin(values), np.cos(values)], axis=-1)
    if mode == IDENTITY:
        return values
    if mode == LEROBOT_MIN_MAX:
        low, spread = stats["min"], stats["max"] - stats["min"]
        mapped = np.float32(2) * (values - low) / np.where(spread != 0, spread, np.float32(1)) - np.float32(1)
        scaled = np.where(spread != 0, mapped, np.float32(0))
        return np.clip(scaled, np.float32(-1), np.float32(1)) if clip else scaled
    if mode == MEAN_STD:
        std = stats["std"]
        return np.where(std != 0, (values - stats["mean"]) / np.where(std != 0, std, 1), values).astype(values.dtype)
    low, high = stats["min"], stats["max"]
    spread = ~np.isclose(high, low)
    scaled = np.where(spread, 2 * ((values - low) / np.where(spread, high - low, 1)) - 1, 0).astype(values.dtype)
    return np.clip(scaled, -1.0, 1.0) if clip else scaled


def unnormalize(values: np.ndarray, mode: str, stats: Mapping[str, np.ndarray], clip: bool = True) -> np.ndarray:
    """One action group of the model's output `[..., T, D]` in the units its statistics were taken in. `clip`:
    LeRobot's `clip_normalized_action` (Isaac-GR00T always clips min/max)."""
    if mode == IDENTITY:
        return values
    if mode == LEROBOT_MIN_MAX:
        low, spread = stats["min"], stats["max"] - stats["min"]
        given = np.clip(values, np.float32(-1), np.float32(1)) if clip else values
        back = (given + np.float32(1)) * np.float32(0.5) * np.where(spread != 0, spread, np.float32(1)) + low
        return np.where(spread != 0, back, low)
    if mode == MEAN_STD:
        std = stats["std"]
        return np.where(std != 0, values * std + stats["mean"], values).astype(values.dtype)
    low, high = stats["min"], stats["max"]
    return (np.clip(values, -1.0, 1.0) + 1.0) / 2.0 * (high - low) + low


def libero_gripper(actions: np.ndarray, binarize: bool) -> np.ndarray:
    """LeRobot's LIBERO gripper (`libero_gripper_action`, on actions at least 7 wide): the last value `g` becomes
    `-sign(2g - 1)`, or `-(2g - 1)` when not binarized."""
    if actions.shape[-1] < 7:
        return actions
    out = actions.copy()
    flipped = np.float32(2) * actions[..., -1] - np.float32(1)
    out[..., -1] = -np.sign(flipped) if binarize else -flipped
    return out


def absolute(relative: np.ndarray, reference: np.ndarray, kind: str, pose: str) -> np.ndarray:
    """Actions `[..., T, D]` relative to `reference` `[..., D]` (the last step of the raw state) made absolute: a
    joint group adds the reference; an end effector composes each step's pose after the reference's pose."""
    if kind == JOINT:
        return reference[..., None, :] + relative
    if kind != END_EFFECTOR:
        raise ValueError(f"unknown action type {kind!r}")
    flat_rel = relative.reshape(-1, *relative.shape[-2:])
    flat_ref = np.broadcast_to(reference, (*relative.shape[:-2], reference.shape[-1])).reshape(-1, reference.shape[-1])
    out = np.stack([_compose(ref, steps, pose) for ref, steps in zip(flat_ref, flat_rel)])
    return out.reshape(*relative.shape[:-1], *out.shape[2:])  # a homogeneous pose comes back 4x4, as the trainer's


def _compose(reference: np.ndarray, steps: np.ndarray, pose: str) -> np.ndarray:
    base = _matrix(reference, pose)
    return np.stack([_flat(base @ _matrix(step, pose), pose) for step in steps])


def _matrix(flat: np.ndarray, pose: str) -> np.ndarray:
    """A pose's 4x4 homogeneous matrix, its rotation through scipy's `Rotation` as the trainer's `EndEffectorPose`
    holds it (which makes a matrix that is nearly a rotation one exactly)."""
    from scipy.spatial.transform import Rotation

    if pose == HOMOGENEOUS:
        given = flat.reshape(4, 4)
        translation, rotation = given[:3, 3], Rotation.from_matrix(given[:3, :3])
    elif pose == XYZ_ROT6D:
        translation, rotation = flat[:3], Rotation.from_matrix(_rot6d_matrix(flat[3:9]))
    elif pose == XYZ_ROTVEC:
        translation, rotation = flat[:3], Rotation.from_rotvec(flat[3:6])
    else:
        raise ValueError(f"unknown pose format {pose!r}")
    matrix = np.eye(4)
    matrix[:3, :3] = rotation.as_matrix()
    matrix[:3, 3] = translation
    return matrix


def _rot6d_matrix(rot6d: np.ndarray) -> np.ndarray:
    """The rotation whose first two rows the six numbers are, made orthonormal by Gram-Schmidt."""
    first, second = rot6d[:3], rot6d[3:6]
    length = np.linalg.norm(first)
    if not np.isfinite(rot6d).all() or length == 0:
        raise ValueError("its rot6d rows are not finite, or the first is zero")
    first = first / length
    second = second - np.dot(first, second) * first
    if np.linalg.norm(second) == 0:
        raise ValueError("its rot6d rows are parallel")
    second = second / np.linalg.norm(second)
    return np.vstack([first, second, np.cross(first, second)])


def _flat(matrix: np.ndarray, pose: str) -> np.ndarray:
    from scipy.spatial.transform import Rotation

    rotation = Rotation.from_matrix(matrix[:3, :3])
    if pose == HOMOGENEOUS:
        out = np.eye(4)
        out[:3, :3], out[:3, 3] = rotation.as_matrix(), matrix[:3, 3]
        return out
    if pose == XYZ_ROT6D:
        return np.concatenate([matrix[:3, 3], rotation.as_matrix()[:2, :].reshape(6)])
    return np.concatenate([matrix[:3, 3], rotation.as_rotvec()])
