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

import errno
import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Iterator

import ml_dtypes
import numpy as np

from pipeline.model.state_dict import TensorSpec, tensor_specs
from pipeline.inputs.snapshot import repo_folder, synthetic_repo_id
from pipeline.inputs.synth_processor import isaac_processor_files, n15_metadata
from pipeline.model.versions import load_config
from tasks.source.checkpoint import INDEX_NAME, SYNTHETIC_MARK
from tasks.errors import PipelineError
from tasks.source.safetensors_file import NUMPY_DTYPES, write_file

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
    # The revision names what was synthesized, shapes included: a stand-in made at other dims is another revision.
    revision = hashlib.sha1(json.dumps([version, scale, seed, sorted(mutate), [[s.key, list(s.shape)] for s in specs]]
                                       ).encode()).hexdigest()
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


# -- fine-tunes as users have them (../shared/reference/fine-tunes.md), rewritten from a synthetic snapshot ----------
# Isaac-GR00T's folders, file by file: `checkpoint` (a `checkpoint-N/` of its run folder), `output` (the run folder
# itself, the final save at its root), `best` (a best-metric save), `deepspeed` (a multi-GPU `checkpoint-N/`),
# `mapped` (a `checkpoint-N/` trained for a tag only its `embodiment_id.json` knows, for n15 and n16).
ISAAC_FORMS = ("checkpoint", "output", "best", "deepspeed", "mapped")
FORMS = ("reshard", "mixed", "half", "single", "lerobot", *ISAAC_FORMS)
N15_ONLY_WITHOUT = ("best", "deepspeed", "mapped")  # N1.5's trainer writes none of these
LEROBOT_PREFIX = "_groot_model."
TRAINED_TAG = "new_embodiment"  # the tag a synthetic fine-tune was trained for
MAPPED_TAG = "robocasa_gr1_tabletop"  # Isaac-GR00T N1.7 maps it to slot 10 (configs/n17.toml too); n15/n16 do not
CHECKPOINT_DIR = "checkpoint-1000"
BEST_DIR = "checkpoint-800-best-eval_loss_0.0123"
MODEL_TYPES = {"n15": "gr00t_n1_5", "n16": "Gr00tN1d6", "n17": "Gr00tN1d7"}


def _is_host_table(key: str) -> bool:
    return key.endswith(("q_norm.weight", "k_norm.weight"))


def _wide(values: np.ndarray, dtype: np.dtype, rng: np.random.Generator) -> np.ndarray:
    """bf16 values widened to `dtype` with detail below bf16's precision, so that rounding back is real work."""
    wide = values.astype(np.float32)
    wide *= (1 + rng.uniform(-2 ** -9, 2 ** -9, wide.shape)).astype(np.float32)
    return wide.astype(dtype)


_DTYPE_TAGS = {np.dtype(ml_dtypes.bfloat16): "BF16", np.dtype(np.float16): "F16", np.dtype(np.float32): "F32"}


def _write_shards(out: Path, tensors: dict, shard_of: dict[str, str], mark: str, index: bool = True,
                  metadata: dict[str, str] | None = None) -> None:
    """Safetensors shards (and their index) of `tensors`: key -> array, or key -> (dtype tag, shape, make) whose
    `make()` gives the array when its turn comes (a full-size fine-tune is never whole in memory)."""
    specs = {k: v if isinstance(v, tuple) else (_DTYPE_TAGS[v.dtype], v.shape, lambda v=v: v) for k, v in tensors.items()}
    out.mkdir(parents=True, exist_ok=True)
    for shard in sorted(set(shard_of.values())):
        keys = [k for k in specs if shard_of[k] == shard]
        with open(out / shard, "wb") as fh:
            write_file(fh, [(k, specs[k][0], specs[k][1]) for k in keys], lambda k: [specs[k][2]()],
                       {"format": "pt", SYNTHETIC_MARK: mark, **(metadata or {})})
    if index:
        total = sum(int(np.prod(shape, dtype=np.int64)) * NUMPY_DTYPES[tag].itemsize for tag, shape, _ in specs.values())
        doc = {"metadata": {"total_size": total, SYNTHETIC_MARK: mark}, "weight_map": dict(sorted(shard_of.items()))}
        (out / INDEX_NAME).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")


def _json(path: Path, doc: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")


def _config_yaml(tag: str) -> str:
    """`experiment_cfg/config.yaml` as Isaac-GR00T's `Config.save` writes it: `yaml.dump` of its dataclasses,
    python tags and an enum included (gr00t/configs/base_config.py)."""
    return (f"!!python/object:gr00t.configs.base_config.Config\n"
            f"data: !!python/object:gr00t.configs.data.data_config.DataConfig\n"
            f"  datasets:\n"
            f"  - !!python/object:gr00t.configs.data.data_config.SingleDatasetConfig\n"
            f"    dataset_paths:\n    - /data/{tag}\n    dataset_type: physical_embodiment\n"
            f"    embodiment_tag: {tag}\n    mix_ratio: 1.0\n    val_dataset_path: null\n"
            f"  modality_configs:\n    {tag}:\n      action: !!python/object:gr00t.data.types.ModalityConfig\n"
            f"        action_configs:\n        - !!python/object:gr00t.data.types.ActionConfig\n"
            f"          rep: !!python/object/apply:gr00t.data.types.ActionRepresentation\n          - relative\n"
            f"        delta_indices:\n        - 0\n        - 1\n"
            f"  seed: 42\nload_config_path: null\n"
            f"training: !!python/object:gr00t.configs.training.training_config.TrainingConfig\n"
            f"  max_steps: 1000\n  num_gpus: 1\n")


def _conf_yaml(tag: str) -> str:
    """`experiment_cfg/conf.yaml` as OmegaConf saves the same config: plain YAML."""
    return (f"load_config_path: null\ndata:\n  datasets:\n  - dataset_paths:\n    - /data/{tag}\n"
            f"    embodiment_tag: {tag}\n    mix_ratio: 1.0\n    dataset_type: physical_embodiment\n"
            f"  seed: 42\ntraining:\n  max_steps: 1000\n  num_gpus: 1\nmax_steps: 1000\nsave_steps: 1000\n")


def _isaac_files(folder: Path, version: str, tag: str, ids: dict[str, int], *, processor: str | None,
                 trainer_state: bool, deepspeed: bool = False) -> None:
    """The files Isaac-GR00T writes beside the weights (../shared/reference/fine-tunes.md): `processor` is where
    its processor files go ("" the folder itself, "processor" a subfolder, None nowhere)."""
    _json(folder / "config.json", {"model_type": MODEL_TYPES[version], "model_dtype": "bfloat16"})
    if version == "n15":  # N1.5: one DatasetMetadata per embodiment tag, copied into every checkpoint
        _json(folder / "experiment_cfg" / "metadata.json", n15_metadata(tag))
    else:
        cfg_dir = folder / "experiment_cfg"
        cfg_dir.mkdir(parents=True, exist_ok=True)
        (cfg_dir / "config.yaml").write_text(_config_yaml(tag))
        (cfg_dir / "conf.yaml").write_text(_conf_yaml(tag))
        for name in ("final_model_config.json", "final_processor_config.json", "dataset_statistics.json"):
            _json(cfg_dir / name, {tag: {}} if name == "dataset_statistics.json" else {})
        (cfg_dir / "initial_actions.npz").write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip archive
    if processor is not None and version != "n15":  # the trainer's processor, with statistics of robot data
        for name, doc in isaac_processor_files(version, tag, ids).items():
            _json(folder / processor / name, doc)
    if trainer_state:
        rng = np.random.default_rng(0)
        for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth", "training_args.bin"):
            (folder / name).write_bytes(rng.bytes(4096))
        _json(folder / "trainer_state.json", {"global_step": 1000})
    if deepspeed:
        step = folder / "global_step1000"
        step.mkdir()
        for name in ("mp_rank_00_model_states.pt", "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"):
            (step / name).write_bytes(np.random.default_rng(1).bytes(4096))
        (folder / "latest").write_text("global_step1000")
        (folder / "zero_to_fp32.py").write_text("# DeepSpeed's own script (stand-in)\n")


def embodiment_ids_written(version: str, extra: dict[str, int] | None = None) -> dict[str, int]:
    """The `embodiment_id.json` Isaac-GR00T writes: its built-in tags merged with the run's own."""
    return {**load_config(version).embodiment_ids, **(extra or {})}


def hf_shards(nbytes: dict[str, int], max_bytes: int = 5_000_000_000) -> dict[str, str]:
    """Key -> file as transformers' `save_pretrained` (the HF Trainer's save) cuts a state dict at its 5 GB default:
    a shard is closed when the next tensor would pass the size; one shard is a plain `model.safetensors`."""
    numbered, n, used = {}, 1, 0
    for key, size in nbytes.items():
        if used and used + size > max_bytes:
            n, used = n + 1, 0
        numbered[key], used = n, used + size
    if n == 1:
        return {k: "model.safetensors" for k in numbered}
    return {k: f"model-{i:05d}-of-{n:05d}.safetensors" for k, i in numbered.items()}


def _reshard(ck, shards: int) -> dict[str, str]:
    """Key -> shard file, cut as Hugging Face cuts them (`hf_shards`) at a size giving about `shards` shards: other
    boundaries, so other straddling units."""
    return hf_shards({k: ck.info(k).nbytes for k in ck.keys()}, ck.total_bytes // shards + 1)


def fine_tune_form(snapshot: Path, version: str, form: str, out: Path, seed: int = 0) -> Path:
    """A synthetic snapshot rewritten into a form fine-tunes come in; returns what to pass as `--snapshot`.

    reshard: the same tensors in about twice as many shards (other straddling units); mixed: the action head and
    q_norm/k_norm stored F32, with detail below bf16's precision (a `load_bf16` run); half: the vision tower stored
    F16 the same way; single: one `model.safetensors`; lerobot: what LeRobot's `save_pretrained` writes, one F32
    file with every key under `_groot_model.`, `embed_tokens` dropped for the `lm_head` it is tied to (the tie in
    `__metadata__`) and `config.json`. The Isaac-GR00T folders (ISAAC_FORMS) are all F32, as a single-GPU run saves
    them, except `deepspeed` (bf16, `lm_head` and `embed_tokens` both kept)."""
    from tasks.source.checkpoint import Checkpoint

    if form not in FORMS:
        raise ValueError(f"unknown fine-tune form {form!r}: expected one of {', '.join(FORMS)}")
    if version == "n15" and form in N15_ONLY_WITHOUT:
        raise ValueError(f"Isaac-GR00T N1.5 writes no {form} folder: use one of checkpoint, output")
    cfg = load_config(version)
    ck = Checkpoint(snapshot)
    shard_of = {k: ck.shard_of(k) for k in ck.keys()}
    mark = f"{ck.synthetic or 'synthetic'}; rewritten as a {form} fine-tune"

    def stored(key: str, wide: np.dtype | None = None) -> tuple:
        """The tensor as the form stores it, read when written (its detail seeded by the key: any order)."""
        shape = ck.shape(key)
        if wide is None:
            return "BF16", shape, lambda: ck.get(key)
        rng = np.random.default_rng([seed, int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "little")])
        return _DTYPE_TAGS[np.dtype(wide)], shape, lambda: _wide(ck.get(key), wide, rng)

    all_f32 = form in ("lerobot", *ISAAC_FORMS) and form != "deepspeed"
    wide_keys = {"mixed": lambda k: k.startswith(cfg.containers["action_head"]) or _is_host_table(k),
                 "half": lambda k: k.startswith(cfg.containers["vision"])}.get(form, lambda k: all_f32)
    wide_dtype = np.float16 if form == "half" else np.float32
    tensors = {k: stored(k, wide_dtype if wide_keys(k) else None) for k in ck.keys()}
    if form == "reshard":
        shard_of = _reshard(ck, 2 * len(set(shard_of.values())))
    elif form in ("single", "lerobot"):
        metadata = {}
        if form == "lerobot":  # safetensors' save_model keeps lm_head (first by name) and records the dropped twin
            embed, head = f"{cfg.containers['llm']}embed_tokens.weight", f"{cfg.containers['lm_head']}weight"
            tensors.pop(embed)
            tensors = {LEROBOT_PREFIX + k: t for k, t in tensors.items()}
            metadata = {LEROBOT_PREFIX + embed: LEROBOT_PREFIX + head}
            _json(out / "config.json", {"type": "groot", "embodiment_tag": TRAINED_TAG, "model_version": "n1.7"})
        _write_shards(out, tensors, {k: "model.safetensors" for k in tensors}, mark, index=False, metadata=metadata)
        return out
    if form not in ISAAC_FORMS:
        _write_shards(out, tensors, shard_of, mark)
        return out
    return _isaac_form(out, version, form, tensors, mark)


def _isaac_form(out: Path, version: str, form: str, tensors: dict, mark: str) -> Path:
    """An Isaac-GR00T folder of `form` under `out`: the weights cut as the HF Trainer cuts them, and the files the
    trainer writes beside them (fine-tunes.md); returns the folder to convert."""
    tag = MAPPED_TAG if form == "mapped" else TRAINED_TAG
    ids = embodiment_ids_written(version, {MAPPED_TAG: 10} if form == "mapped" else None)
    folder = {"output": out, "best": out / BEST_DIR}.get(form, out / CHECKPOINT_DIR)
    shard_of = hf_shards({k: int(np.prod(t[1], dtype=np.int64)) * NUMPY_DTYPES[t[0]].itemsize for k, t in tensors.items()})
    _write_shards(folder, tensors, shard_of, mark, index=len(set(shard_of.values())) > 1)
    if form == "output":  # the run folder: the final save at its root, the processor files under processor/
        _isaac_files(out, version, tag, ids, processor="processor", trainer_state=False)
    elif form == "best":  # save_pretrained plus experiment_cfg/; the processor files only in the run folder
        _isaac_files(folder, version, tag, ids, processor=None, trainer_state=False)
        _isaac_files(out, version, tag, ids, processor="processor", trainer_state=False)
        (out / "config.json").unlink()
    else:
        _isaac_files(folder, version, tag, ids, processor="", trainer_state=True, deepspeed=form == "deepspeed")
    return folder


def synthesize_or_nothing(version: str, hf_cache: Path, scale: str = "tiny", seed: int = 0) -> Path:
    """`synthesize`, or nothing: on a write error (a full disk) the repo folders this call began are removed and
    one sentence says why."""
    before = set(hf_cache.iterdir())
    try:
        return synthesize(version, hf_cache, scale, seed)
    except OSError as e:
        for made in set(hf_cache.iterdir()) - before:
            shutil.rmtree(made, ignore_errors=True)
        reason = "no space left on the device" if e.errno in (errno.ENOSPC, errno.EDQUOT) else e.strerror
        raise PipelineError(f"{e.filename or hf_cache}: {reason} while synthesizing {version} ({scale}); nothing was "
                            "kept — free space or pass --hf-cache DIR on a larger disk") from None


def new_fine_tune_form(snapshot: Path, version: str, form: str, out: Path, seed: int = 0) -> Path:
    """`fine_tune_form` into a new folder, or nothing: a folder that holds anything is refused (nothing is
    overwritten), and one that fails half-way is removed."""
    if out.exists() and any(out.iterdir()):
        raise PipelineError(f"{out}: already exists and is not empty; pass --out with a new folder (nothing is "
                            "overwritten)")
    try:
        return fine_tune_form(snapshot, version, form, out, seed)
    except ValueError as e:  # a form this version's trainer never writes
        shutil.rmtree(out, ignore_errors=True)
        raise PipelineError(f"synth --form {form}: {e}") from None
    except OSError as e:
        shutil.rmtree(out, ignore_errors=True)
        raise PipelineError(f"{e.filename or out}: {e.strerror} while writing the {form} form; nothing was kept") from None
