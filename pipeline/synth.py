"""Synthetic GR00T checkpoints with the real key names, order, shapes, dtype and shard assignment.

Written into an HF-cache-shaped repo (`blobs/<sha256>`, `snapshots/<rev>/<file>` relative symlinks, `refs/main`),
so snapshot resolution treats it exactly like a download, but under a repo id of its own
(`gr00t-tt-synthetic/GR00T-N1.6-3B-tiny`) at a revision derived from what was synthesized, never NVIDIA's repo or
a real commit. The index metadata and every shard's `__metadata__` carry `gr00t_tt_synthetic`, so a synthetic
checkpoint is recognised wherever it is copied. Values are deterministic and weight-like: bf16 windows
of a seeded normal(0, 0.02) pool (norm weights around 1), streamed tensor by tensor in pieces, so peak memory stays
at the pool size whatever the scale. Windows have a prime length and random offsets, so no two slots or tensors
share content by accident.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import Iterator

import ml_dtypes
import numpy as np

from pipeline.state_dict import TensorSpec, tensor_specs
from pipeline.snapshot import repo_folder, synthetic_repo_id
from pipeline.versions import load_config
from tasks.checkpoint import INDEX_NAME, SYNTHETIC_MARK
from tasks.safetensors_file import write_file

POOL_SIZE = 1 << 22
WINDOW = 65_521  # prime, so windows never line up with tensor or slot boundaries


class _HashingFile:
    """A binary file wrapper that hashes what passes through."""

    def __init__(self, fh):
        self.fh, self.sha, self.name = fh, hashlib.sha256(), fh.name

    def write(self, data) -> None:
        self.sha.update(data)
        self.fh.write(data)


def _is_norm_weight(key: str) -> bool:
    module = key.rsplit(".", 1)[0].rsplit(".", 1)[-1]
    return key.endswith(".weight") and ("norm" in module or module == "vlln")


def _values(spec: TensorSpec, pools: dict[bool, np.ndarray], rng: np.random.Generator) -> Iterator[np.ndarray]:
    pool = pools[_is_norm_weight(spec.key)]
    remaining = spec.nbytes // 2
    while remaining:
        n = min(WINDOW, remaining)
        start = int(rng.integers(0, POOL_SIZE - n))
        yield pool[start:start + n]
        remaining -= n


def _publish_blob(blobs: Path, tmp: Path, sha: str) -> str:
    os.replace(tmp, blobs / sha)
    return sha


def synthesize(version: str, hf_cache: Path, scale: str = "tiny", seed: int = 0,
               mutate: frozenset[str] = frozenset()) -> Path:
    """Write a synthetic snapshot of `version` under `hf_cache`; returns the snapshot folder.

    `mutate` names keys whose values are drawn from another seed: a synthetic fine-tune of the same checkpoint."""
    cfg = load_config(version)
    specs = tensor_specs(version, scale)
    mark = f"synthetic {version} ({scale} scale, seed {seed}{', a fine-tune' if mutate else ''}), not NVIDIA weights"
    revision = hashlib.sha1(json.dumps([version, scale, seed, sorted(mutate)]).encode()).hexdigest()
    repo = repo_folder(synthetic_repo_id(cfg, scale), hf_cache)
    blobs, snap = repo / "blobs", repo / "snapshots" / revision
    blobs.mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True, exist_ok=True)
    pool_rng = np.random.default_rng(seed)
    base = pool_rng.standard_normal(POOL_SIZE, dtype=np.float32) * np.float32(0.02)
    pools = {False: base.astype(ml_dtypes.bfloat16), True: (base + np.float32(1)).astype(ml_dtypes.bfloat16)}
    by_shard: dict[str, list[TensorSpec]] = {}
    for spec in specs:
        by_shard.setdefault(spec.shard, []).append(spec)
    position = {spec.key: i for i, spec in enumerate(specs)}

    def chunks(key: str) -> Iterator[np.ndarray]:
        # One generator per key, seeded by its position: the same key gets the same bytes in any shard order.
        key_seed = [seed, position[key], 1 if key in mutate else 0]
        return _values(specs[position[key]], pools, np.random.default_rng(key_seed))

    for shard, members in by_shard.items():
        tmp = blobs / f"{shard}.{uuid.uuid4().hex[:8]}.incomplete"
        try:
            with open(tmp, "wb") as fh:
                sink = _HashingFile(fh)
                write_file(sink, [(s.key, cfg.dtype, s.shape) for s in members], chunks,
                           {"format": "pt", SYNTHETIC_MARK: mark})
            sha = _publish_blob(blobs, tmp, sink.sha.hexdigest())
        finally:
            tmp.unlink(missing_ok=True)
        _link(snap / shard, sha)
    index = {"metadata": {"total_size": sum(s.nbytes for s in specs), SYNTHETIC_MARK: mark},
             "weight_map": {s.key: s.shard for s in specs}}
    raw = (json.dumps(index, indent=2, sort_keys=True) + "\n").encode()
    sha = hashlib.sha256(raw).hexdigest()
    (blobs / sha).write_bytes(raw)
    _link(snap / INDEX_NAME, sha)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    return snap


def _link(path: Path, sha: str) -> None:
    if path.is_symlink() or path.exists():
        path.unlink()
    path.symlink_to(Path("..") / ".." / "blobs" / sha)
