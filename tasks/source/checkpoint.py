"""A lazy, shard-aware view of one safetensors checkpoint, in any of the shapes it comes in: a sharded snapshot
(`model.safetensors.index.json` + shards), a folder without an index (`model.safetensors`, as `save_pretrained`
writes below the shard size, or a `model-NNNNN-of-NNNNN.safetensors` set), or one file. Only the model's weight
files are read (`weight_files`): a trainer writes other safetensors beside them (LeRobot's normalizer statistics).

Opening reads only the index (if any) and the shard headers and cross-checks them: every key in exactly one shard,
index and headers agreeing, byte accounting closing (`8 + header + data == file size` per shard, data sum ==
`total_size`). The shard is resolved per key, never per layer: in every GR00T release one unit is cut by a shard
boundary. Keys are seen as GR00T names: a prefix that wraps every key (LeRobot's `_groot_model.`) is stripped,
and a tied table a trainer dropped can be read from the tensor it is tied to (`tie`); the headers in `headers` are
views under those names, so every reader resolves them alike. Reads go through tasks/source/shards.py — the functions the
conversion graph's read and slot tasks call — into fresh numpy arrays and are counted, so `slot()` and `rows()`
provably read only what they return.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np

from tasks.errors import CheckpointError
from tasks.io.file_blocks import read_whole
from tasks.source import shards
from tasks.source.safetensors_file import ShardHeader, TensorEntry, read_header

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
GR00T_ROOTS = ("backbone.", "action_head.")  # every GR00T key starts with one of these
SYNTHETIC_MARK = "gr00t_tt_synthetic"  # pipeline/inputs/synth.py writes it; read here so a copy is still recognised
_SHA256_NAME = re.compile(r"^[0-9a-f]{64}$")


def _check_shard_name(index: Path, name: object) -> str:
    """Shard names come from an untrusted index: they must be plain file names in the snapshot folder."""
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise CheckpointError(index, f"shard name {name!r} is not a plain file name (no separators, no '..'): "
                                     "the index is corrupt or malicious")
    return name


def _read_index(index: Path) -> tuple[dict[str, str], dict[str, object]]:
    try:
        obj = json.loads(read_whole(index))
    except FileNotFoundError:
        raise CheckpointError(index, "index file is missing: this folder is not a sharded safetensors snapshot") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(index, f"index is not valid JSON ({e})") from e
    if not isinstance(obj, dict) or not isinstance(obj.get("weight_map"), dict):
        raise CheckpointError(index, "index must be a JSON object with a 'weight_map' object")
    metadata = obj.get("metadata", {})
    if not isinstance(metadata, dict):
        raise CheckpointError(index, f"index 'metadata' must be an object, found {metadata!r}")
    weight_map = {}
    for key, shard in obj["weight_map"].items():
        weight_map[key] = _check_shard_name(index, shard)
    return weight_map, metadata


def _hf_blob_root(snapshot: Path) -> Path | None:
    """`<repo>/blobs` when `snapshot` is an HF cache `snapshots/<rev>` folder, else None."""
    return snapshot.parent.parent / "blobs" if snapshot.parent.name == "snapshots" else None


SHARD_FILE = re.compile(r"^model-(\d{5})-of-(\d{5})\.safetensors$")  # as transformers numbers a sharded save


@dataclass(frozen=True)
class WeightFiles:
    """Which files of a checkpoint hold the model's weights: the index's shards, else `model.safetensors`, else
    one `model-NNNNN-of-NNNNN.safetensors` set, else the one file named. Any other `*.safetensors` beside them
    (a trainer's normalizer statistics, an adapter, an EMA copy) is `left_alone`: never read, only named."""
    index: Path | None
    files: tuple[str, ...]
    left_alone: tuple[str, ...] = ()


def weight_files(snapshot: Path) -> WeightFiles:
    """The model's weight files in `snapshot` (a folder, or one `.safetensors` file), by the names
    transformers' `save_pretrained` gives them; one sentence when there are none."""
    if snapshot.is_file():
        return WeightFiles(None, (snapshot.name,))
    found = sorted(p.name for p in snapshot.glob("*.safetensors")) if snapshot.is_dir() else []
    if (snapshot / INDEX_NAME).is_file():
        files = tuple(sorted(set(_read_index(snapshot / INDEX_NAME)[0].values())))
    elif SINGLE_NAME in found:
        files = (SINGLE_NAME,)
    else:
        numbered = [n for n in found if SHARD_FILE.match(n)]
        counts = {SHARD_FILE.match(n).group(2) for n in numbered}
        if len(counts) > 1:
            raise CheckpointError(snapshot, f"holds model-*-of-*.safetensors files of {len(counts)} different sets "
                                            f"({', '.join(sorted(counts))} shards): keep one save in the folder")
        files = tuple(numbered)
        if counts and len(files) != int(counts.pop()):
            raise CheckpointError(snapshot / files[0], f"is one of {len(files)} model-*-of-*.safetensors shards "
                                                       f"present of the {SHARD_FILE.match(files[0]).group(2)} it "
                                                       "names: download or copy the missing shards")
    if not files:
        if not snapshot.exists():
            what = "does not exist"
        elif not snapshot.is_dir():
            what = "is neither a folder nor a regular file (a pipe, a device or a socket)"
        else:
            what = f"holds no {INDEX_NAME}, no {SINGLE_NAME} and no model-NNNNN-of-NNNNN.safetensors" + (
                f" (only {', '.join(found)}, which are not the model's weight files by name)" if found else "")
        raise CheckpointError(snapshot, f"{what}: pass the folder the trainer saved the model in, or the "
                                        ".safetensors file itself")
    return WeightFiles(snapshot / INDEX_NAME if (snapshot / INDEX_NAME).is_file() else None, files,
                       tuple(n for n in found if n not in files))


def _wrapper_of(key: str) -> str | None:
    """"" for a GR00T key, the prefix before the GR00T key it wraps, or None for a key that is not GR00T's."""
    if key.startswith(GR00T_ROOTS):
        return ""
    at = min((i for i in (key.find("." + r) for r in GR00T_ROOTS) if i >= 0), default=-1)
    return key[:at + 1] if at >= 0 else None


def wrapper_prefix(folder: Path, shard_of: Mapping[str, str]) -> str:
    """The one prefix that wraps every GR00T key (LeRobot keeps the model in `_groot_model`), or "" when the keys
    are GR00T's own. Keys wrapped by two prefixes, partly wrapped, or not GR00T's (a stray file beside the model)
    are refused, naming a key that differs from most and its file: which is the model is unclear."""
    kinds = {k: _wrapper_of(k) for k in shard_of}
    found = set(kinds.values())
    if len(found) <= 1 and None not in found:
        return found.pop() if found else ""
    usual = max(found, key=lambda kind: sum(1 for v in kinds.values() if v == kind))
    odd = min(k for k, kind in kinds.items() if kind != usual)
    named = sorted(p for p in found if p)
    parts = [", ".join(map(repr, named)) or "no prefix"]
    if None in found:
        parts.append("keys that are not GR00T's")
    if "" in found and named:
        parts.append("unprefixed keys")
    raise CheckpointError(folder / shard_of[odd], f"the keys are not all GR00T keys under one prefix (found "
                                                  f"{' and '.join(parts)}); move a stray file out of the folder, or save "
                                                  "the model's state dict alone (keys starting backbone. and "
                                                  "action_head.)", odd)


class Checkpoint:
    """Header-indexed view of a checkpoint folder or file. Thread-safe for reads."""

    def __init__(self, given: Path):
        """`given`: a folder or one file, here or in an object store (a UPath: tasks/io/file_blocks.py `source_path`)."""
        self.dir = given.parent if given.is_file() else given
        chosen = weight_files(given)
        index, files = chosen.index, list(chosen.files)
        self.left_alone = chosen.left_alone
        self.index_path = index
        self.where = index or given  # what errors about the whole checkpoint name
        if index is not None:
            self.weight_map, self.metadata = _read_index(index)
            files = sorted(set(self.weight_map.values()))
        else:
            self.weight_map, self.metadata = {}, {}
        blob_root = _hf_blob_root(self.dir)
        raw: dict[str, ShardHeader] = {}
        shard_of: dict[str, str] = {}
        for name in files:
            path = self.dir / name
            if not path.exists():
                raise CheckpointError(path, f"shard listed in {INDEX_NAME} is missing; download the snapshot again"
                                      if self.index_path else "is gone, or a link to nothing (dangling, or a loop); "
                                      "copy or download the file itself")
            if blob_root is not None and path.is_symlink() and not path.resolve().is_relative_to(blob_root.resolve()):
                raise CheckpointError(path, f"symlink points to {path.resolve()}, outside the HF cache blobs folder "
                                            f"{blob_root}: refusing to read it")
            header = read_header(path)
            for key in header.entries:
                if key in shard_of:
                    raise CheckpointError(path, f"key is also stored in {shard_of[key]}: a key must live in one shard", key)
                if index is not None and self.weight_map.get(key) != name:
                    listed = self.weight_map.get(key)
                    raise CheckpointError(path, f"header holds this key but {INDEX_NAME} "
                                                f"{'does not list it' if listed is None else f'places it in {listed}'}", key)
                shard_of[key] = name
            raw[name] = header
        if index is not None:
            missing = sorted(set(self.weight_map) - set(shard_of))
            if missing:
                raise CheckpointError(index, f"{len(missing)} key(s) listed in the index are in no shard header, "
                                             f"first {missing[0]!r} (index says {self.weight_map[missing[0]]})", missing[0])
            total = sum(h.data_bytes for h in raw.values())
            declared = self.metadata.get("total_size")
            if declared is not None and declared != total:
                raise CheckpointError(index, f"metadata.total_size is {declared} but the shards hold {total} data bytes")
        self.prefix = wrapper_prefix(self.dir, shard_of)
        self.names: dict[str, dict[str, str]] = {  # per shard: key as seen -> key as stored
            shard: {k[len(self.prefix):]: k for k in h.entries} for shard, h in raw.items()}
        self.tied: dict[str, str] = {}  # a key read from the tensor it is tied to -> that key
        self._raw = raw
        self._view()
        self._lock = threading.Lock()
        self.bytes_read = 0

    def _view(self) -> None:
        self.headers = {s: h.renamed(self.names[s]) if self.prefix or self.tied else h for s, h in self._raw.items()}
        self._entries: dict[str, TensorEntry] = {}
        self._shard_of: dict[str, str] = {}
        for shard, header in self.headers.items():
            for key, entry in header.entries.items():
                self._entries[key], self._shard_of[key] = entry, shard

    def tie(self, key: str, to: str) -> None:
        """Read `key`, which the checkpoint does not hold, from the bytes of `to` (a trainer's tie de-duplication
        dropped one of two tied tables: LeRobot keeps `lm_head` and drops `embed_tokens`)."""
        shard = self.shard_of(to)
        self.names[shard][key] = self.names[shard][to]
        self.tied[key] = to
        self._view()

    def recorded_ties(self) -> dict[str, tuple[str, str]]:
        """Tensors a save dropped as duplicates of another, as safetensors' `save_model` (and huggingface_hub's
        `save_torch_state_dict`) record them in `__metadata__`: {dropped key: (kept key, shard recording it)}, under
        this view's names, for a dropped key the checkpoint lacks and a kept one it holds."""
        ties = {}
        for shard, header in sorted(self._raw.items()):
            for dropped, kept in header.metadata.items():
                if not (dropped.startswith(self.prefix) and isinstance(kept, str) and kept.startswith(self.prefix)):
                    continue
                dropped, kept = dropped[len(self.prefix):], kept[len(self.prefix):]
                if dropped not in self._entries and kept in self._entries:
                    ties[dropped] = (kept, shard)
        return ties

    def stored_keys(self, shard: str) -> frozenset[str]:
        """The keys the shard's header holds, as stored (what re-reading the header must find)."""
        return frozenset(self._raw[shard].entries)

    def stored_names(self, shard: str) -> Mapping[str, str] | None:
        """How this view names the shard's keys (key -> stored key), or None when it uses the stored names."""
        return self.names[shard] if self.prefix or self.tied else None

    # -- header-only queries ------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def keys(self) -> list[str]:
        """Every key, ordered by shard, then name: the order a streaming reader should follow."""
        return sorted(self._entries, key=lambda k: (self._shard_of[k], k))

    def info(self, key: str) -> TensorEntry:
        try:
            return self._entries[key]
        except KeyError:
            raise CheckpointError(self.where, "key is not in this checkpoint", key) from None

    def shape(self, key: str) -> tuple[int, ...]:
        return self.info(key).shape

    def dtype(self, key: str) -> str:
        return self.info(key).dtype

    def shard_of(self, key: str) -> str:
        self.info(key)
        return self._shard_of[key]

    def shard_path(self, shard: str) -> Path:
        return self.headers[shard].path

    def keys_with_prefix(self, prefix: str) -> list[str]:
        """Keys under `prefix`, shard-then-name ordered; none is an error (a typo must not pass silently)."""
        keys = [k for k in self.keys() if k.startswith(prefix)]
        if not keys:
            raise CheckpointError(self.where, f"no key starts with {prefix!r}")
        return keys

    def shards_for_prefix(self, prefix: str) -> tuple[str, ...]:
        """The shards holding keys under `prefix`: two for a straddling unit, one otherwise."""
        return tuple(sorted({self._shard_of[k] for k in self.keys_with_prefix(prefix)}))

    def byte_accounting(self) -> dict[str, dict[str, int]]:
        """Per shard: header bytes, tensors, data bytes, file size (8 + header + data == file size, checked at open)."""
        return {n: {"header_bytes": h.header_len, "tensors": len(h.entries), "data_bytes": h.data_bytes,
                    "file_size": h.file_size} for n, h in sorted(self.headers.items())}

    @property
    def total_bytes(self) -> int:
        return sum(h.data_bytes for h in self.headers.values())

    @property
    def synthetic(self) -> str | None:
        """What the project's synthesizer wrote into the index or a shard's `__metadata__` (`gr00t_tt_synthetic`),
        or None for a checkpoint that does not say it is synthetic."""
        marks = [self.metadata.get(SYNTHETIC_MARK)] + [h.metadata.get(SYNTHETIC_MARK) for h in self.headers.values()]
        return next((str(m) for m in marks if m), None)

    def blob_sha256(self, shard: str) -> str | None:
        """The sha256 an HF cache names this shard's blob by, or None outside an HF cache."""
        path = self.shard_path(shard)
        name = path.resolve().name if path.is_symlink() else ""
        return name if _SHA256_NAME.match(name) else None

    # -- data reads: the same functions as the conversion graph's read and slot tasks (tasks/source/shards.py) ---------
    def _counted(self, out: np.ndarray) -> np.ndarray:
        with self._lock:
            self.bytes_read += out.nbytes
        return out

    def rows(self, key: str, lo: int, hi: int) -> np.ndarray:
        """Rows `lo:hi` of the leading dimension, reading only those bytes."""
        return self._counted(shards.read_rows(self.headers[self.shard_of(key)], key, lo, hi))

    def get(self, key: str) -> np.ndarray:
        """The whole tensor as stored (bf16 as `ml_dtypes.bfloat16`)."""
        return self._counted(shards.read_tensor(self.headers[self.shard_of(key)], key))

    def slot(self, key: str, e: int) -> np.ndarray:
        """`W[e]` of a `[32, ...]` embodiment bank, reading only that slot's bytes. Never transposed: the model
        computes `x @ W[e] + b[e]`."""
        return self._counted(shards.read_slot(self.headers[self.shard_of(key)], key, e))

    def close(self) -> None:
        """Nothing to release (every read opens and closes its shard); kept so `with Checkpoint(...)` reads well."""

    def __enter__(self) -> "Checkpoint":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Checkpoint({self.dir}, {len(self)} tensors, {len(self.headers)} shards)"
