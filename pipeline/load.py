"""Reload converted weights from the cache: no safetensors, no source checkpoint, no conversion.

Reads go straight to the chunk files the manifest lists (uncompressed Zarr v3 chunks are raw bytes): locally they
are memory-mapped copy-on-write (the page cache's pages; writes stay private), remotely fetched object by object,
on a small thread pool; every chunk is checked against its manifest xxh3 before use, which touches every byte. For one
embodiment, a bank contributes only that slot's chunk: about 1/32 of the bank's bytes.
"""

from __future__ import annotations

import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline import cache
from pipeline.store import Store, is_url, open_store, requested_root
from pipeline.recipe import resolve
from pipeline.versions import load_config
from tasks import device as tt
from tasks import tensorbin
from tasks.errors import CacheError, ConfigError
from tasks.entry import WHOLE, entry_key, chunk_coords, chunk_key, manifest_key, matches, packed_path, ref_key, slot_of
from tasks.zarr_v3 import STORAGE_DTYPE, chunk_path, map_chunk, read_chunk_into


@dataclass
class Loaded:
    tensors: dict                  # target name -> torch.bfloat16 tensor (or ttnn tensor); host-only: torch.float32
    entry: str
    slot: int | None
    stats: dict = field(default_factory=dict)
    layout: str = "generic"
    banks: tuple[str, ...] = ()    # targets holding every slot of a bank, as [slots, ...]
    source: dict = field(default_factory=dict)  # what the entry was converted from (snapshot, revision, synthetic)

    def components(self) -> dict[str, dict[str, object]]:
        """The tensors grouped the way the port's weight loader groups them: component -> {name inside it: tensor}
        (tt-n16: vision, language, connector, dit, state_encoder, action_encoder, action_decoder, vlln,
        position_embedding). A bank loaded with every slot becomes {slot: tensor}."""
        grouped: dict[str, dict[str, object]] = {}
        for name, tensor in self.tensors.items():
            component, inside = name.split(".", 1)
            grouped.setdefault(component, {})[inside] = (
                {s: tensor[s] for s in range(tensor.shape[0])} if name in self.banks else tensor)
        return grouped


class _LocalEntry:
    """A published entry in a local cache: chunks are read straight into the caller's buffers."""

    def __init__(self, path: Path):
        self.path, self.name = path, path.name

    def describe(self, rel: str) -> str:
        return str(self.path / rel)

    def read_into(self, name: str, coords: tuple[int, ...], out: np.ndarray) -> None:
        read_chunk_into(self.path / name, coords, out)

    def fetch(self, name: str, coords: tuple[int, ...], shape: list[int]) -> np.ndarray:
        return map_chunk(self.path / name, coords, shape)

    def packed_file(self, name: str, slot: int | None) -> tuple[Path, np.ndarray | None]:
        path = packed_path(self.path, name, slot)
        if not path.is_file():
            return path, None
        return path, np.memmap(path, dtype=np.uint8, mode="r") if path.stat().st_size else np.empty(0, np.uint8)


class _RemoteEntry:
    """A published entry in an object store: one GET per chunk (a slot is its own object)."""

    def __init__(self, store: Store, name: str):
        self.store, self.name = store, name
        self.prefix = entry_key(name)
        self._tmp = tempfile.TemporaryDirectory(prefix="gr00t-packed-")

    def describe(self, rel: str) -> str:
        return self.store.describe(f"{self.prefix}/{rel}")

    def read_into(self, name: str, coords: tuple[int, ...], out: np.ndarray) -> None:
        key = chunk_path(Path(self.prefix) / name, coords).as_posix()
        data = self.store.get(key)
        if data is None or len(data) != out.nbytes:
            found = "missing" if data is None else f"{len(data)} bytes, expected {out.nbytes}"
            raise CacheError(f"{self.store.describe(key)}: chunk is {found}; push the entry again")
        out.reshape(-1).view(np.uint8)[:] = np.frombuffer(data, np.uint8)

    def fetch(self, name: str, coords: tuple[int, ...], shape: list[int]) -> np.ndarray:
        out = np.empty(shape, STORAGE_DTYPE)
        self.read_into(name, coords, out)
        return out

    def packed_file(self, name: str, slot: int | None) -> tuple[Path, bytes | None]:
        rel = packed_path(Path(self.prefix), name, slot).as_posix()  # ttnn loads from a file: keep a local copy
        data = self.store.get(rel)
        local = Path(self._tmp.name) / Path(rel).name  # ttnn loads from a file
        if data is not None:
            local.write_bytes(data)
        return local, data


def _open_entry(version: str, layout: str, profile: str, cache_dir: Path | str | None, entry: str | None = None,
                revision: str | None = None, slot: int | None = None, source=None) -> tuple[object, dict]:
    if is_url(cache_dir):
        cache_dir = requested_root(cache_dir)
        store = open_store(cache_dir)
        ref = store.get_json(ref_key(version, layout, profile))
        if ref is None:
            raise CacheError(f"{store.describe(ref_key(version, layout, profile))}: no converted {version} ({layout}, {profile}) in this cache; "
                             f"run `python -m pipeline convert --version {version} --layout {layout} --profile "
                             f"{profile} --cache {cache_dir}` first")
        name = ref["entry"]
        manifest = store.get_json(manifest_key(name))
        if manifest is None or not name.endswith(str(manifest.get("fingerprint", ""))[:20] or "-"):
            raise CacheError(f"{store.describe(manifest_key(name))}: missing or not the manifest of "
                             f"{name}; the entry was never completely pushed — convert again")
        return _RemoteEntry(store, name), manifest
    chosen = cache.choose_entry(cache.cache_root(cache_dir), version, layout, profile, entry, revision, slot, source)
    return _LocalEntry(chosen.path), chosen.manifest


def _read_chunk(entry, name: str, chunk: str, rec: dict, shape: list[int], out: np.ndarray | None) -> np.ndarray:
    """One chunk, checked against its manifest checksum (the pass that touches every byte): read into `out` (a
    slot's slice of a whole bank) or fetched on its own (mapped, locally)."""
    coords = chunk_coords(len(shape), slot_of(chunk))
    if out is None:
        out = entry.fetch(name, coords, shape)
    else:
        entry.read_into(name, coords, out)
    if not matches(out, rec):
        raise CacheError(f"{entry.describe(name)}: chunk {chunk} does not match its manifest checksum (tampered or "
                         "corrupt); run `python -m pipeline cache verify` and convert again with --force")
    return out


def _plan_reads(manifest: dict, slot: int | None) -> list[tuple[str, str, dict, list[int]]]:
    reads = []
    for name, arr in manifest["arrays"].items():
        shape = arr["attributes"]["logical_shape"]
        if not arr["attributes"]["embodiment_bank"]:
            reads.append((name, WHOLE, arr["chunks"][WHOLE], shape))
            continue
        wanted = [slot] if slot is not None else list(range(arr["shape"][0]))
        for s in wanted:
            if chunk_key(s) not in arr["chunks"]:
                have = ", ".join(sorted(arr["chunks"], key=int))
                raise CacheError(f"{name}: embodiment slot {s} was not converted into this entry (it holds slots "
                                 f"{have}); convert with --embodiments {s} or all")
            reads.append((name, chunk_key(s), arr["chunks"][chunk_key(s)], shape))
    return reads


def _read_packed(entry, name: str, chunk: str, rec: dict):
    """ttnn's `.tensorbin` of a packed target: its bytes are read once (checked, and the pages warmed), then ttnn
    maps the same file."""
    path, data = entry.packed_file(name, slot_of(chunk))
    if data is None:
        raise CacheError(f"{path}: packed tensor listed in the manifest is missing; convert again with --force")
    if not matches(data, rec):
        raise CacheError(f"{path}: packed tensor does not match its manifest checksum (tampered or corrupt); "
                         "convert again with --force")
    return tt.load_packed(path)


def load(version: str, cache_dir: Path | str | None = None, embodiment: str | int | None = None,
         profile: str | None = None, device=None, ttnn_host: bool = False, threads: int = 4,
         layout: str | None = None, entry: str | None = None, revision: str | None = None,
         source: str | Path | None = None) -> Loaded:
    """Target tensors of the last conversion of `version` in `layout`/`profile` (defaults: the version's layout and
    its default profile), by target name; `.components()` groups them as the consumer does.

    `embodiment` (a tag or slot id) keeps one slot of every bank, as `[in, out]` / `[1, out]`; None keeps every
    slot as `[slots, in, out]`. By default tensors are torch bf16 on the host. `ttnn_host=True` returns ttnn host
    tensors in their device dtype and layout (packed targets straight from their `.tensorbin`, no repacking);
    `device` also uploads them. Host-only targets (tt-n16: q_norm, k_norm, embed_tokens) are always torch float32
    host tensors, as the port keeps them.

    Which entry: `entry` (a name or fingerprint prefix), else the last conversion (the ref) when it holds the
    slot asked for and matches `revision` and `source` (the snapshot folder converted), else the newest published
    entry that does (a base model and its
    fine-tune, or entries of different slots, can all be loaded)."""
    import torch  # lazy: 1-2 s to import, and `cache`/`convert` never need it

    t0 = time.perf_counter()
    layout, profile = resolve(version, layout, profile)
    slot = None
    if embodiment is not None and str(embodiment).strip() != "all":
        ids = load_config(version).slot_ids(str(embodiment))
        if len(ids) != 1:
            raise ConfigError(f"load takes one embodiment (a tag or slot id) or all, not {embodiment!r}: slots {list(ids)}")
        slot = ids[0]
    opened, manifest = _open_entry(version, layout, profile, cache_dir, entry, revision, slot, source)
    as_ttnn = ttnn_host or device is not None
    if as_ttnn and slot is None and any(a["attributes"]["embodiment_bank"] for a in manifest["arrays"].values()):
        raise CacheError(f"{opened.describe('')}: device tensors hold one embodiment slot; pass embodiment= a tag or slot id")
    reads = _plan_reads(manifest, slot)
    arrays = manifest["arrays"]

    def whole_bank(name: str) -> bool:  # all 32 slots of a bank, returned as one [32, ...] tensor
        return slot is None and arrays[name]["attributes"]["embodiment_bank"]

    packed = [r for r in reads if as_ttnn and "tensorbin" in r[2]]
    plain = [r for r in reads if not (as_ttnn and "tensorbin" in r[2])]
    # A whole bank's slots are read straight into one [32, ...] buffer (no stacking copy); every other chunk is
    # its own tensor.
    banks = {name: np.empty([len(arrays[name]["chunks"])] + shape, STORAGE_DTYPE)
             for name, _, _, shape in plain if whole_bank(name)}
    outs = [banks[name][int(chunk)] if name in banks else None for name, chunk, _, _ in plain]
    with ThreadPoolExecutor(threads) as pool:
        chunks = list(pool.map(lambda ro: _read_chunk(opened, *ro[0], ro[1]), zip(plain, outs)))
        packed_tensors = list(pool.map(lambda r: _read_packed(opened, r[0], r[1], r[2]["tensorbin"]), packed))
    buffers = {**{name: c for (name, _, _, _), c in zip(plain, chunks) if name not in banks}, **banks}
    nbytes = sum(c.nbytes for c in chunks) + sum(r[2]["tensorbin"]["nbytes"] for r in packed)
    host = {name for name, arr in arrays.items() if arr["attributes"].get("host_only")}
    if as_ttnn:
        out = {name: tensorbin.host_tensor(data, arrays[name]["attributes"]["device_dtype"],
                                       arrays[name]["attributes"]["device_layout"])
               for (name, _, _, _), data in zip(plain, chunks) if name not in host}
        out |= {r[0]: t for r, t in zip(packed, packed_tensors)}
        if device is not None:
            out = {name: tt.upload(t, device) for name, t in out.items()}
        out |= {name: torch.from_numpy(buffers[name]).view(torch.bfloat16).float() for name in host}
    else:
        out = {name: torch.from_numpy(buf).view(torch.bfloat16) for name, buf in buffers.items()}
        out |= {name: out[name].float() for name in host}  # bf16 -> float32 is exact
    out = {name: out[name] for name in arrays if name in out}  # the plan's order
    return Loaded(out, opened.name, slot, {"seconds": time.perf_counter() - t0, "tensors": len(out),
                                          "bytes_read": nbytes, "chunks": len(reads)},
                  manifest.get("layout", "generic"), tuple(sorted(banks)), manifest.get("source", {}))
