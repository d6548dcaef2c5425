"""What a fine-tune brings that a release does not, read from the checkpoint itself (../shared/reference/fine-tunes.md):
which GR00T version its keys are, a tied table its trainer dropped, and the embodiments it was trained for.
Each is one sentence when it cannot be had; each is recorded in the entry's `source` (tasks/entry.py: Identity).
"""

from __future__ import annotations

import json
from collections import Counter
from functools import cache
from pathlib import Path

from pipeline.state_dict import tensor_specs
from pipeline.versions import VERSIONS, VersionConfig
from tasks.checkpoint import Checkpoint
from tasks.errors import CheckpointError, ConfigError
from tasks.precision import check_dtype

TRAINED_METADATA = Path("experiment_cfg") / "metadata.json"  # Isaac-GR00T: one DatasetMetadata per embodiment tag
TRAINED = "trained"  # --embodiments trained: the slots of those tags


@cache
def _version_keys(version: str) -> frozenset[str]:
    return frozenset(s.key for s in tensor_specs(version, "full"))


def _shares(keys: list[str]) -> dict[str, float]:
    return {v: sum(k in _version_keys(v) for k in keys) / max(1, len(keys)) for v in VERSIONS}


def detect_version(keys: list[str], where: object) -> str:
    """The GR00T version whose keys these are (90 % of them at least, and one version only)."""
    shares = _shares(keys)
    looks = [v for v in VERSIONS if shares[v] >= 0.9]
    if len(looks) == 1:
        return looks[0]
    raise ConfigError(f"{where}: {_unlike(keys, shares)}; pass --version "
                      f"{'|'.join(looks or VERSIONS)} if it is a GR00T checkpoint")


def recognise(version: str, keys: list[str], where: object) -> None:
    """Refuse, in one sentence, a snapshot that is not this GR00T version: most of its keys are none of the
    version's (a fine-tune's odd extra key is left to the recipe, which names it)."""
    shares = _shares(keys)
    if shares[version] >= 0.9:
        return
    looks = [v for v in VERSIONS if shares[v] >= 0.9]
    like = f"; it is a GR00T {looks[0]} checkpoint: pass --version {looks[0]}" if looks else \
        "; it matches no GR00T version this project converts"
    raise ConfigError(f"{where}: not a GR00T {version} checkpoint: {_unlike(keys, shares, version)}{like}")


def _unlike(keys: list[str], shares: dict[str, float], version: str | None = None) -> str:
    prefixes = Counter(".".join(k.split(".")[:2]) for k in keys).most_common(3)
    best = version or max(shares, key=shares.get)
    return (f"{len(keys)} tensors, {shares[best]:.0%} of them {best} keys, mostly under "
            f"{', '.join(f'{p}. ({n})' for p, n in prefixes)}")


def check_dtypes(ck: Checkpoint) -> None:
    """Every tensor is BF16, F16 or F32, before anything is planned or read (a relabelled tensor would otherwise
    be met as a shape that another rule trips on)."""
    for key in ck.keys():
        check_dtype(ck.shard_path(ck.shard_of(key)), key, ck.dtype(key))


def _config_ties(folder: Path) -> bool | None:
    """What the checkpoint's `config.json` says of `tie_word_embeddings` (at any depth: the LLM's config is
    nested), or None when it says nothing (every GR00T release ties them)."""
    try:
        doc = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
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


def tie_embeddings(ck: Checkpoint, cfg: VersionConfig) -> str | None:
    """When the checkpoint lacks `embed_tokens` (a tie de-duplication kept `lm_head` only), read it from `lm_head`,
    which the LLM config ties it to. Returns the key it was tied to, or None when nothing was missing."""
    embed, head = f"{cfg.containers['llm']}embed_tokens.weight", f"{cfg.containers['lm_head']}weight"
    if embed in ck:
        return None
    ties = _config_ties(ck.dir)
    if head not in ck:
        raise CheckpointError(ck.where, f"neither the token embedding nor {head!r} it is tied to is in the checkpoint; "
                                        "save the fine-tune with its embeddings", embed)
    if ties is False:
        raise CheckpointError(ck.where, f"the token embedding is missing and {ck.dir / 'config.json'} does not tie it to "
                                        f"{head!r} (tie_word_embeddings is false); save the fine-tune with its embeddings", embed)
    ck.tie(embed, head)
    return head


def trained_tags(folder: Path) -> list[str] | None:
    """The embodiment tags an Isaac-GR00T fine-tune was trained for: the keys of `experiment_cfg/metadata.json`
    beside the checkpoint (or in the run folder above a trainer's `checkpoint-N/`); None when there is none."""
    for place in (folder, folder.parent):
        path = place / TRAINED_METADATA
        if not path.is_file():
            continue
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise CheckpointError(path, f"is not valid JSON ({e}); pass --embodiments with tags or slot ids instead") from None
        if not isinstance(doc, dict) or not doc:
            raise CheckpointError(path, "must be an object keyed by embodiment tag; pass --embodiments with tags or "
                                        "slot ids instead")
        return sorted(doc)
    return None


def selection(embodiments: str, tags: list[str] | None, folder: Path) -> str:
    """`--embodiments` with `trained` replaced by the tags the fine-tune was trained for."""
    items = [s.strip() for s in embodiments.split(",")]
    if TRAINED not in items:
        return embodiments
    if tags is None:
        raise ConfigError(f"--embodiments trained: {folder / TRAINED_METADATA} does not exist, so which embodiments "
                          "this checkpoint was trained for is not known; pass tags or slot ids")
    return ",".join(t for item in items for t in (tags if item == TRAINED else [item]))
