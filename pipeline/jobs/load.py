"""Reload converted weights from the cache: no safetensors, no source checkpoint, no conversion.

Wiring only: which entry (`cache.choose_entry`), under a lease, read into which form (tasks/entries/reload.py). Every chunk
is checked against its manifest record before use. For one embodiment, a bank contributes only that slot's chunk:
about 1/32 of the bank's bytes.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from pipeline import cache
from pipeline.inputs.embodiments import Embodiments
from pipeline.model.recipe import layout_and_profile
from pipeline.model.versions import load_config
from pipeline.deprecated import into_of_old_keywords
from tasks.entries import reload
from tasks.entries.fetched import KeepingStore
from tasks.errors import CacheError, ConfigError
from tasks.entries.store import IN_FLIGHT, Store
from tasks.io.network import retries_since, retries_so_far

TRANSFERS = IN_FLIGHT  # requests in flight from an object store (each waits on the network, not on a core)
FORMS = ("torch", "ttnn")  # `into=`: torch bf16 on the host, ttnn host tensors; or an open device


@dataclass(kw_only=True)
class Loaded:
    tensors: dict                  # target name -> torch.bfloat16 tensor (or ttnn tensor); host-only: torch.float32
    entry: str
    slot: int | None
    stats: dict = field(default_factory=dict)
    layout: str = "generic"
    banks: tuple[str, ...] = ()    # targets holding every slot of a bank, as [slots, ...]
    source: dict = field(default_factory=dict)  # what the entry was converted from (snapshot, revision, synthetic)
    processor_files: dict = field(default_factory=dict, repr=False)  # the trainer's files the entry keeps
    tag: str | None = None         # the embodiment tag asked for (None: asked by slot id, or every slot)

    @property
    def processor(self):
        """The trainer's processor for the embodiment loaded (`.state(groups)`, `.actions(output, state=groups)`),
        from the files the entry keeps; one sentence (ProcessorError) when it keeps none."""
        from pipeline.model.kept_processor import for_entry

        return for_entry(self.entry, self.source, self.processor_files, self.slot, self.tag)

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


def load(version: str, cache_root: Store | Path | str | None = None, embodiment: str | int | None = None, *,
         into="torch", layout: str | None = None, profile: str | None = None, entry: str | None = None,
         revision: str | None = None, source: str | Path | None = None, synthetic: bool = False,
         transfers: int = TRANSFERS, stall_seconds: float | None = None, **deprecated) -> Loaded:
    """Target tensors of the last conversion of `version` in `layout`/`profile` (defaults: the version's layout and
    its default profile), by target name; `.components()` groups them as the consumer does.

    `embodiment` (a tag or slot id) keeps one slot of every bank, as `[in, out]` / `[1, out]`; None keeps every
    slot as `[slots, in, out]`. `into` is the form: `"torch"` (torch bf16 on the host), `"ttnn"` (ttnn host
    tensors in their device dtype and layout, packed targets straight from their `.tensorbin`, no repacking), or
    an open device or mesh: those with a `.tensorbin` through ttnn's `load_tensor(device=)`, the rest (and
    everything on a mesh) from its bf16 chunk, every device file checked before the first upload. Host-only
    targets (tt-n16: q_norm, k_norm, embed_tokens) are always torch float32 host tensors, as the port keeps them.

    Which entry: `entry` (a name or fingerprint prefix), else the last conversion (the ref) when it holds the
    slot asked for and matches `revision` and `source` (the snapshot folder converted), else the newest published
    entry that does (a base model and its fine-tune, or entries of different slots, can all be loaded). A
    conversion of a release always wins over a synthetic one; a synthetic entry, when it is all there is, comes
    with a `SyntheticWeightsWarning` unless `synthetic=True` says the caller knows (`Loaded.synthetic` says it
    either way). From an object store, `transfers` chunks are fetched at once, each request abandoned and tried
    again once it moves no byte for `stall_seconds` (default $GR00T_STALL_SECONDS, else 30). The keywords of 0.1.0,
    `ttnn_host=True` and `device=D`, still work (deprecated: `into=`)."""
    into = into_of_old_keywords(into, deprecated)
    t0, retried_before = time.perf_counter(), retries_so_far()
    if isinstance(into, str) and into not in FORMS:
        raise ConfigError(f"load(into={into!r}): expected one of {', '.join(FORMS)}, or an open device")
    cfg = load_config(version)
    resolved_layout, resolved_profile = layout_and_profile(cfg, layout, profile)
    chosen = Embodiments.parse(embodiment)
    try:
        slot, unknown = chosen.one(cfg, "load"), None
    except ConfigError as e:  # a tag only a fine-tune's own map knows: the entry that recorded it says its slot
        if chosen.one_tag() is None:
            raise
        slot, unknown = None, e
    wanted = cache.Wanted(version=version, layout=resolved_layout, profile=resolved_profile, slot=slot, entry=entry,
                          revision=revision, source=source, tag=chosen.one_tag())
    try:
        opened = cache.choose_entry(cache.cache_store(cache_root, stall_seconds), wanted)
    except CacheError:
        if unknown is not None:  # no entry recorded it either: the tag is unknown, as the table said
            raise unknown from None
        raise
    slot = _slot_of_chosen(opened, wanted, unknown, layout, profile, synthetic)
    if into != "torch" and slot is None and any(a.bank for a in opened.manifest.arrays.values()):
        raise CacheError(f"{opened.describe()}: device tensors hold one embodiment slot; pass embodiment= a tag or "
                         "slot id")
    chunks = reload.plan_reads(opened.manifest, slot)
    tensors, nbytes, fetched = _read_held(opened, chunks, into, slot is None, transfers, retried_before)
    return Loaded(tensors=tensors, entry=opened.name, slot=slot,
                  stats={"seconds": time.perf_counter() - t0, "tensors": len(tensors), "bytes_read": nbytes,
                         "chunks": len(chunks), **fetched},
                  layout=opened.manifest.layout,
                  banks=tuple(n for n in tensors if slot is None and opened.manifest.arrays[n].bank),
                  source=dict(opened.manifest.source), processor_files=opened.processor_files(), tag=wanted.tag)


def _slot_of_chosen(opened, wanted, unknown: Exception | None, layout: str | None, profile: str | None,
                    synthetic: bool) -> int | None:
    """The slot to load from the entry chosen for `wanted`, once the entry is held to what was asked: the tag
    (`unknown`: the table's refusal of it, said when no entry recorded it either), the layout and the profile."""
    slot = wanted.slot_in(opened)
    if slot is None and wanted.tag is not None:  # named by --entry, which never recorded that tag
        raise unknown or CacheError(f"{opened.describe()}: does not hold embodiment {wanted.tag}")
    cache.warn_if_synthetic(opened, synthetic)
    for what, asked, held in (("layout", layout, opened.manifest.layout), ("profile", profile, opened.manifest.profile)):
        if asked is not None and asked != held:  # a named entry of another kind than asked for
            raise CacheError(f"{opened.describe()}: is a {held} entry, not {what} {asked}; leave out --{what} or "
                             f"name an entry in {asked}")
    return slot


def _read_held(opened, chunks: list[reload.Chunk], into, every_slot: bool, transfers: int,
               retried_before: dict) -> tuple[dict, int, dict]:
    """`_read` under a lease (gc and rm leave the entry alone meanwhile), from an object store through what this
    machine fetched from it before; the tensors, the bytes read, and what was fetched and kept."""
    home = cache.home_of(opened.store)
    keeping = home.keeping()
    reading = opened if keeping is None else replace(opened, store=keeping)
    device_files = into != "torch" and reload.takes_device_files(None if isinstance(into, str) else into)
    kept = keeping.kept_bytes(reload.read_objects(reading, chunks, device_files)) if keeping is not None else 0
    with home.reading(opened.name):
        tensors, nbytes = _read(reading, chunks, into, every_slot, home.read_threads(transfers))
    return tensors, nbytes, {} if keeping is None else _fetched_stats(keeping, nbytes, kept, retried_before)


def _fetched_stats(fetched: KeepingStore, nbytes: int, kept: int, retried_before: dict) -> dict:
    """What a load from an object store fetched and kept here, and how often a request to the store was tried
    again (tasks/io/network.py)."""
    said = {"bytes_fetched": nbytes - kept, "bytes_kept_here": kept, "store_retries": retries_since(retried_before)}
    if fetched.not_kept["bytes"]:  # the next load fetches these again: say why
        said |= {"bytes_not_kept": fetched.not_kept["bytes"], "not_kept_because": fetched.not_kept["why"]}
    return said


def _read(opened, chunks: list[reload.Chunk], into, every_slot: bool, threads: int) -> tuple[dict, int]:
    """Tensors by target name, in the manifest's order, and the bytes read, on `threads` threads (the cache's
    home's: a few for a local disk, `transfers` for an object store). Host-only tables are read and checked while
    the rest loads (embed_tokens: 1.2 GB of float32)."""
    arrays = opened.manifest.arrays
    host = [c for c in chunks if arrays[c[0]].host_only]
    rest = [c for c in chunks if not arrays[c[0]].host_only]
    device = None if isinstance(into, str) else into
    with ThreadPoolExecutor(threads) as pool:
        tables = {name: pool.submit(reload.host_table, opened, name) for name, _ in host}
        if into == "torch":
            out = reload.torch_tensors(opened, rest, every_slot, pool)
            nbytes = reload.read_bytes(opened, rest)
        else:
            out = {name: t for (name, _), t in reload.ttnn_tensors(opened, rest, pool, device).items()}
            nbytes = reload.read_bytes(opened, rest, from_device_files=reload.takes_device_files(device))
        out |= {name: f.result() for name, f in tables.items()}
    return {name: out[name] for name in arrays if name in out}, nbytes + reload.read_bytes(opened, host)
