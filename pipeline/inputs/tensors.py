"""What a checkpoint's tensors say about it: the GR00T version its keys are, whether their dtypes and shapes are
that version's, and which table a save dropped is read from the one it is tied to (LeRobot's `_groot_model.`
keys, the `__metadata__` that records a tie). The trainers' own files are pipeline/inputs/trainer_files.py.
"""

from __future__ import annotations

from collections import Counter
from functools import cache

from pipeline.inputs.trainer_files import Fact, config_ties
from pipeline.model.state_dict import scale_of, tensor_specs
from pipeline.model.versions import VERSIONS, VersionConfig
from tasks.errors import CheckpointError, ConfigError
from tasks.numerics.precision import check_dtype
from tasks.source.checkpoint import Checkpoint


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
    """Every tensor is BF16, F16 or F32, before anything is planned or read."""
    for key in ck.keys():
        check_dtype(ck.shard_path(ck.shard_of(key)), key, ck.dtype(key))


def check_shapes(ck: Checkpoint, cfg: VersionConfig) -> None:
    """Every key the version knows has the shape it has at the scale most of the keys match, so a tensor saved
    with another shape is named itself (not a correct one whose rule is read at the wrong dims)."""
    shapes = {k: ck.shape(k) for k in ck.keys()}
    specs = {s.key: s.shape for s in tensor_specs(cfg.version, scale_of(cfg, shapes))}
    for key in ck.keys():
        if key in specs and shapes[key] != specs[key]:
            where = ck.shard_path(ck.shard_of(key))
            if key in ck.tied:  # a dropped table read from its twin: the record that tied them is what is wrong
                raise CheckpointError(where, f"is read from {ck.tied[key]!r}, which the file's records tie it to, and "
                                             f"that is of shape {list(shapes[key])}, where GR00T {cfg.version} has "
                                             f"{list(specs[key])}: the tie names another table; save the fine-tune "
                                             "with its embeddings", key)
            raise CheckpointError(where, f"{ck.dtype(key)} tensor of shape {list(shapes[key])}, where GR00T "
                                         f"{cfg.version} has {list(specs[key])}: the file was saved wrongly or is not "
                                         "this model's", key)


def tie_tables(ck: Checkpoint, cfg: VersionConfig) -> Fact | None:
    """Which table the save dropped is read from which one it is tied to (key -> twin), and where that was said:
    the file's `__metadata__` first, then `config.json`, else as every GR00T release ties them (embed_tokens to
    lm_head). None when nothing is tied. Changes nothing: the caller ties them (`Checkpoint.tie`)."""
    embed, head = f"{cfg.containers['llm']}embed_tokens.weight", f"{cfg.containers['lm_head']}weight"
    recorded = ck.recorded_ties()
    said = Fact({k: t for k, (t, _) in sorted(recorded.items())},
                f"the __metadata__ of {sorted({s for _, s in recorded.values()})[0]}") if recorded else None
    if embed in ck or embed in recorded:
        return said
    if head not in ck and head not in recorded:
        raise CheckpointError(ck.where, f"neither the token embedding nor {head!r} it is tied to is in the checkpoint; "
                                        "save the fine-tune with its embeddings", embed)
    ties = config_ties(ck.dir)
    if ties is False:
        raise CheckpointError(ck.where, f"the token embedding is missing and {ck.dir / 'config.json'} does not tie it to "
                                        f"{head!r} (tie_word_embeddings is false); save the fine-tune with its embeddings", embed)
    return Fact({**(said.value if said else {}), embed: head}, "config.json (tie_word_embeddings)" if ties else
                f"GR00T {cfg.version}'s own config (every release ties them; the folder says nothing)")
