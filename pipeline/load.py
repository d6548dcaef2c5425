"""Reload converted weights from the cache: no safetensors, no source checkpoint, no conversion.

Reads go through the entry (tasks/entry.py) to the chunk objects the manifest lists (uncompressed Zarr v3 chunks
are raw bytes): locally memory-mapped copy-on-write (the page cache's pages; writes stay private), from an object
store fetched object by object, on a small thread pool; every chunk is checked against its manifest xxh3 before
use, which touches every byte. For one
embodiment, a bank contributes only that slot's chunk: about 1/32 of the bank's bytes.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline import cache
from pipeline.recipe import resolve
from pipeline.versions import load_config
from tasks import device as tt
from tasks import tensorbin
from tasks.entry import STORAGE_DTYPE, Manifest
from tasks.errors import CacheError, ConfigError
from tasks.store import Store


@dataclass
class Loaded:
    tensors: dict                  # target name -> torch.bfloat16 tensor (or ttnn tensor); host-only: torch.float32
    entry: str
    slot: int | None
    stats: dict = field(default_factory=dict)
    layout: str = "generic"
    banks: tuple[str, ...] = ()    # targets holding every slot of a bank, as [slots, ...]
    source: dict = field(default_factory=dict)  # what the entry was converted from (snapshot, revision, synthetic)

    @property
    def synthetic(self) -> str | None:
        """What the synthetic stand-in these weights came from says it is (None: a real checkpoint)."""
        return self.source.get("synthetic") or None

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


def _plan_reads(manifest: Manifest, slot: int | None) -> list[tuple[str, int | None]]:
    """(array, slot) of every chunk to read: whole arrays, and of each bank the slot asked for (or every slot)."""
    reads = []
    for name, arr in manifest.arrays.items():
        if not arr.bank:
            reads.append((name, None))
            continue
        for s in [slot] if slot is not None else range(arr.shape[0]):
            if s not in arr.chunks:
                have = ", ".join(str(k) for k in sorted(arr.chunks))
                raise CacheError(f"{name}: embodiment slot {s} was not converted into this entry (it holds slots "
                                 f"{have}); convert with --embodiments {s} or all")
            reads.append((name, s))
    return reads


def load(version: str, cache_dir: Store | Path | str | None = None, embodiment: str | int | None = None,
         profile: str | None = None, device=None, ttnn_host: bool = False, threads: int = 4,
         layout: str | None = None, entry: str | None = None, revision: str | None = None,
         source: str | Path | None = None, synthetic: bool = False) -> Loaded:
    """Target tensors of the last conversion of `version` in `layout`/`profile` (defaults: the version's layout and
    its default profile), by target name; `.components()` groups them as the consumer does.

    `embodiment` (a tag or slot id) keeps one slot of every bank, as `[in, out]` / `[1, out]`; None keeps every
    slot as `[slots, in, out]`. By default tensors are torch bf16 on the host. `ttnn_host=True` returns ttnn host
    tensors in their device dtype and layout (packed targets straight from their `.tensorbin`, no repacking);
    `device` puts every target on that device: those with a `.tensorbin` through ttnn's `load_tensor(device=)`,
    the rest (and everything on a mesh) from its bf16 chunk. Every device file is checked against its record
    before the first upload. Host-only targets (tt-n16: q_norm, k_norm, embed_tokens) are always torch float32
    host tensors, as the port keeps them.

    Which entry: `entry` (a name or fingerprint prefix), else the last conversion (the ref) when it holds the
    slot asked for and matches `revision` and `source` (the snapshot folder converted), else the newest published
    entry that does (a base model and its
    fine-tune, or entries of different slots, can all be loaded). A conversion of a release always wins over a
    synthetic one; a synthetic entry, when it is all there is, comes with a `SyntheticWeightsWarning` unless
    `synthetic=True` says the caller knows (`Loaded.synthetic` says it either way)."""
    t0 = time.perf_counter()
    asked_layout, asked_profile = layout, profile
    layout, profile = resolve(version, layout, profile)
    slot = None
    if embodiment is not None and str(embodiment).strip() != "all":
        ids = load_config(version).slot_ids(str(embodiment))
        if len(ids) != 1:
            raise ConfigError(f"load takes one embodiment (a tag or slot id) or all, not {embodiment!r}: slots {list(ids)}")
        slot = ids[0]
    opened = cache.choose_entry(cache.cache_store(cache_dir), version, layout, profile, entry, revision, slot, source)
    cache.warn_if_synthetic(opened, synthetic)
    for what, asked, held in (("layout", asked_layout, opened.manifest.layout),
                              ("profile", asked_profile, opened.manifest.profile)):
        if asked is not None and asked != held:  # a named entry of another kind than asked for
            raise CacheError(f"{opened.describe()}: is a {held} entry, not {what} {asked}; leave out --{what} or "
                             f"name an entry in {asked}")
    arrays = opened.manifest.arrays
    as_ttnn = ttnn_host or device is not None
    if as_ttnn and slot is None and any(a.bank for a in arrays.values()):
        raise CacheError(f"{opened.describe()}: device tensors hold one embodiment slot; pass embodiment= a tag or "
                         "slot id")
    with cache.reading(opened.store, opened.name):  # gc and rm leave it alone meanwhile
        return _read(opened, slot, reads=_plan_reads(opened.manifest, slot), device=device, ttnn_host=ttnn_host,
                     threads=threads, t0=t0)


def _read(opened, slot: int | None, reads, device, ttnn_host: bool, threads: int, t0: float) -> Loaded:
    import torch  # lazy: 1-2 s to import, and `cache`/`convert` never need it

    arrays = opened.manifest.arrays
    # Packed targets come straight from their `.tensorbin`, to the host or the device (ttnn's own upload of its
    # own file). A mesh takes everything from the bf16 chunks through upload_array, the one place that decides
    # which targets are split across its devices.
    from_file = ttnn_host or (device is not None and tt.mesh_size(device) == 1)
    packed = [(n, s) for n, s in reads if from_file and arrays[n].chunks[s].tensorbin is not None]
    plain = [(n, s) for n, s in reads if not (from_file and arrays[n].chunks[s].tensorbin is not None)]
    # A whole bank's slots (all 32, returned as one [32, ...] tensor) are read straight into one buffer (no
    # stacking copy); every other chunk is its own tensor.
    banks = {n: np.empty([len(arrays[n].chunks)] + arrays[n].logical_shape, STORAGE_DTYPE)
             for n, _ in plain if slot is None and arrays[n].bank}
    host = {name for name, arr in arrays.items() if arr.host_only}
    widen = lambda buf: torch.from_numpy(buf).view(torch.bfloat16).float()  # noqa: E731  (bf16 -> float32 is exact)
    with ThreadPoolExecutor(threads) as pool:
        chunks = list(pool.map(lambda r: opened.read_chunk(*r, banks[r[0]][r[1]] if r[0] in banks else None), plain))
        buffers = {**{n: c for (n, _), c in zip(plain, chunks) if n not in banks}, **banks}
        # host-only tensors are widened while the device files load (embed_tokens: 1.2 GB of float32)
        widened = {name: pool.submit(widen, buffers[name]) for name in host if name in buffers}
        files = list(pool.map(lambda r: opened.device_file(*r), packed))  # all checked before any upload
        packed_tensors = list(pool.map(tt.load_packed, files)) if device is None else \
            [tt.load_packed(f, device) for f in files]
        host_values = {name: f.result() for name, f in widened.items()}
    nbytes = sum(c.nbytes for c in chunks) + sum(arrays[n].chunks[s].tensorbin.nbytes for n, s in packed)
    if device is not None:
        out = {n: tt.upload_array(data, arrays[n].device_dtype, arrays[n].device_layout,
                                  str(arrays[n].attributes["kind"]), device)
               for (n, _), data in zip(plain, chunks) if n not in host}
        out |= {n: t for (n, _), t in zip(packed, packed_tensors)}
    elif ttnn_host:
        out = {n: tensorbin.host_tensor(data, arrays[n].device_dtype, arrays[n].device_layout)
               for (n, _), data in zip(plain, chunks) if n not in host}
        out |= {n: t for (n, _), t in zip(packed, packed_tensors)}
    else:
        out = {name: torch.from_numpy(buf).view(torch.bfloat16) for name, buf in buffers.items()}
    out |= host_values
    out = {name: out[name] for name in arrays if name in out}  # the plan's order
    return Loaded(out, opened.name, slot, {"seconds": time.perf_counter() - t0, "tensors": len(out),
                                          "bytes_read": nbytes, "chunks": len(reads)},
                  opened.manifest.layout, tuple(sorted(banks)), dict(opened.manifest.source))
