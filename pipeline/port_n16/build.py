"""Building: the port's model from a cache entry. Its constructors run once on traced weights (trace.py), or the
model an earlier start kept for this entry is rebuilt (kept.py); what they asked for is matched to the entry's
targets (match.py); those files are loaded, every byte checked against its record, and swapped into the built
model in place of its placeholders. One the walk cannot reach stops the build by name."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from pipeline import cache
from pipeline.inputs.embodiments import Embodiments, TagMap
from pipeline.port_n16.code import N16, VERSION, PortCode, PortError
from pipeline.port_n16.kept import NotKept, keep, kept_path, restore
from pipeline.port_n16.match import first_unserved, layouts_serving, match_targets
from pipeline.port_n16.trace import HOST_OPS, Listing, Pending, Request, construct, port_config
from tasks.entries import reload
from tasks.entries.entry import Entry
from tasks.errors import CacheError, ConfigError


class _Unloaded:
    """Stands for a slot that was not asked for; removed from the built model (its dict then says so)."""


class SlotsLoaded(dict):
    """A port dict of per-slot tensors holding only the slots loaded: any other slot is a clear error, never a
    wrong slot."""

    def __missing__(self, slot):
        raise KeyError(f"embodiment slot {slot} was not loaded into this model (loaded: {sorted(self)}); build it "
                       "with embodiments= that include it, or all")



@dataclass(kw_only=True)
class PortModel:
    """The port's model as built, and how: `model` is `Gr00tN16ModelTTNN`, the port's class."""

    model: Any
    entry: str
    revision: str
    layout: str
    slots: tuple[int, ...]
    stats: dict
    source: dict = field(default_factory=dict)                    # what the entry was converted from
    processor_files: dict = field(default_factory=dict, repr=False)  # the trainer's files the entry keeps

    @property
    def processor(self):
        """The trainer's processor for the embodiment it trained (pipeline/model/processor.py); `processor_for(tag)`
        for another embodiment its statistics hold."""
        return self.processor_for(None)

    def processor_for(self, tag: str | None):
        from pipeline.model.kept_processor import for_entry

        slot = self.slots[0] if len(self.slots) == 1 else None
        return for_entry(self.entry, self.source, self.processor_files, slot, tag)


@dataclass(kw_only=True)
class Fill:
    """What `fill_in` puts in place of the traced model's stand-ins, and which placeholders it found."""
    traced: type
    filled: list                               # by request: the loaded device tensor (or _Unloaded)
    host: Mapping[tuple[str, ...], Any]        # sources -> the entry's float32 host tensor
    code: PortCode
    seen: set = field(default_factory=set)     # ids of the objects walked
    used: set = field(default_factory=set)     # request indexes whose placeholder was replaced


def fill_in(node, fill: Fill) -> Any:
    """Walk the built model: placeholders become the loaded device tensors (by request), traced host tables the
    entry's float32 tensors, and slots not loaded leave their dicts (which then refuse them by name)."""
    if type(node) is Pending:
        fill.used.add(node.index)
        return fill.filled[node.index]
    if id(node) in fill.seen or isinstance(node, (str, bytes, int, float, bool, type(None))):
        return node
    fill.seen.add(id(node))
    if isinstance(node, fill.traced):
        wanted = fill.host.get(node.sources)
        extra = [op for op in node.ops if op not in HOST_OPS]
        if wanted is None or extra or tuple(node.shape) != tuple(wanted.shape) or str(node.dtype) != str(wanted.dtype):
            raise PortError(f"{fill.code.root} (port revision {fill.code.revision}) keeps a {list(node.shape)} "
                            f"{node.dtype} host tensor made from {', '.join(node.sources)} by "
                            f"{', '.join(extra) or 'a cast'}, which the entry has no host target for; this port "
                            "revision is not supported")
        return wanted
    if isinstance(node, dict):
        for k in list(node):
            node[k] = fill_in(node[k], fill)
        if any(_holds_unloaded(v) for v in node.values()):
            return SlotsLoaded({k: v for k, v in node.items() if not _holds_unloaded(v)})
        return node
    if isinstance(node, list):
        node[:] = [fill_in(x, fill) for x in node]
        return node
    if isinstance(node, tuple):
        return tuple(fill_in(x, fill) for x in node)
    if hasattr(node, "__dict__") and type(node).__module__.startswith(fill.code.package):
        for k, v in vars(node).items():
            setattr(node, k, fill_in(v, fill))
    return node


def check_filled(fill: Fill, requests: list[Request]) -> None:
    """Every weight the port asked for is in the model now: a placeholder kept where the walk does not look (a
    set, an object of another package) would fail only at the first forward pass."""
    left = sorted(set(range(len(requests))) - fill.used)
    if left:
        raise PortError(f"{fill.code.root} (port revision {fill.code.revision}) keeps {len(left)} weight(s) where the "
                        f"hand-off cannot put the loaded tensor (the first: {requests[left[0]].describe()}); this port "
                        "revision is not supported")


def _holds_unloaded(value) -> bool:
    return isinstance(value, _Unloaded) or (isinstance(value, tuple) and any(isinstance(x, _Unloaded) for x in value))


@dataclass(frozen=True, kw_only=True)
class Listed:
    """The first half of a build: the entry that serves the port, and the port's model built on it with
    placeholders, with what its constructors asked for (no bytes read yet)."""
    code: PortCode
    entry: Entry
    listing: Listing
    model: Any
    traced: type
    started: float  # perf_counter() when the build began
    how: str = "traced"  # or "kept" (by an earlier start: kept.py), or "traced and kept"


def list_model(code: PortCode, store, *, entry: str | None = None, profile: str | None = None,
               embodiments: Embodiments | str | int | None = None, config=None, device=None, started: float | None = None) -> Listed:
    """Choose the entry and run the port's constructors on traced weights over it (see `build_model`)."""
    started = time.perf_counter() if started is None else started
    chosen = Embodiments.parse(embodiments)
    opened, listing, model, traced, how = _serving_entry(code, store, entry, profile or "port", chosen, config, device)
    return Listed(code=code, entry=opened, listing=listing, model=model, traced=traced, started=started, how=how)


def load_model(listed: Listed, *, embodiments: Embodiments | str | int | None = None, device=None, threads: int = 4) -> PortModel:
    """The second half: match what the port asked for to the entry's targets, load those files and the host
    tables (every byte checked), and put them in place of the placeholders."""
    code, opened, listing = listed.code, listed.entry, listed.listing
    held = sorted({s for a in opened.manifest.arrays.values() if a.bank for s in a.chunks})
    slots = Embodiments.parse(embodiments).among(N16, held, opened.describe(),
                                                 tags=TagMap.recorded(opened.manifest.source, N16))
    targets = match_targets(listing.requests, opened, code)
    t_listed = time.perf_counter()
    needed = sorted({(targets[r.sources], r.slot) for r in listing.requests if r.slot is None or r.slot in slots},
                    key=str)
    host_arrays = [n for n, a in opened.manifest.arrays.items() if a.host_only]
    home = cache.home_of(opened.store)
    keeping = home.keeping()  # from an object store: through what this machine fetched from it before, as `load`
    with home.reading(opened.name):  # gc and rm leave it alone meanwhile
        loaded, host, nbytes = _load(opened if keeping is None else replace(opened, store=keeping), needed,
                                     host_arrays, device, threads)
    filled = [loaded.get((targets[r.sources], r.slot), _Unloaded()) for r in listing.requests]
    by_sources = {tuple(opened.manifest.arrays[n].attributes["sources"]): t for n, t in host.items()}
    fill = Fill(traced=listed.traced, filled=filled, host=by_sources, code=code)
    model = fill_in(listed.model, fill)
    check_filled(fill, listing.requests)
    stats = {"seconds": time.perf_counter() - listed.started, "listing_seconds": t_listed - listed.started,
             "model": listed.how,
             "device_files": len(needed), "host_tensors": len(host), "bytes_read": nbytes,
             "tensor_bytes": sum(opened.device_record(n, s).nbytes for n, s in needed)  # what ttnn reads, not
                             + sum(t.numel() * 4 for t in host.values())}  # a tiled chunk's tail; float32 tables
    return PortModel(model=model, entry=opened.name, revision=code.revision, layout=opened.manifest.layout,
                     slots=slots, stats=stats, source=dict(opened.manifest.source),
                     processor_files=opened.processor_files())


def _asked(chosen: Embodiments) -> tuple[int | None, str | None]:
    """The slot and the tag that choose the entry (the first slot asked for): one tag is read with each candidate
    entry's own map (`Wanted.slot_in`), as `load` reads it; slot ids, and a list, with the built-in table."""
    if chosen.every:
        return None, None
    tag = chosen.one_tag()
    try:
        return chosen.slots(N16)[0], tag
    except ConfigError:
        if tag is None:
            raise
        return None, tag  # only a fine-tune's own map knows it: the entry that recorded it says its slot


def _serving_entry(code: PortCode, store, entry: str | None, profile: str, chosen: Embodiments, config, device):
    """The entry to hand over, and the port's model built on it with placeholders for its device tensors (what
    they ask for is listed; no bytes are read): `entry` when named, else the last conversion in the layout
    revision that serves this port (tt-n16 first)."""
    slot, tag = _asked(chosen)
    layouts = list(N16.port["layouts"])
    opened = None
    for layout in layouts if entry is None else ["tt-n16"]:
        try:
            wanted = cache.Wanted(version=VERSION, layout=layout, profile=profile, slot=slot, entry=entry, tag=tag)
            opened = cache.choose_entry(store, wanted)
            break
        except CacheError:
            if entry is not None or layout == layouts[-1]:
                raise
    assert opened is not None
    for _ in range(2):  # at most once more: the listing may name the other layout revision
        shapes = opened.manifest.source_shapes
        if not shapes:
            raise CacheError(f"{opened.describe()}: made before entries recorded their checkpoint's shapes (cache "
                             f"format {opened.manifest.cache_format}); convert again to hand it to the port")
        model, traced, listing, how = _traced_or_kept(code, opened, config, device, cache.build_root(store))
        if entry is not None or first_unserved(listing.requests, opened) is None:  # (match_targets explains)
            return opened, listing, model, traced, how
        fits = layouts_serving(listing.requests, shapes, opened.manifest.profile)  # two plans: only when needed
        if opened.manifest.layout in fits or not fits:
            return opened, listing, model, traced, how
        try:
            opened = cache.choose_entry(store, cache.Wanted(version=VERSION, layout=fits[0], profile=profile, slot=slot))
        except CacheError as e:
            raise CacheError(f"port revision {code.revision} at {code.root} takes layout {fits[0]}: {e}") from None
    return opened, listing, model, traced, how


def _traced_or_kept(code: PortCode, opened: Entry, config, device, root: Path):
    """The port's model on traced weights for this entry: the one kept by an earlier start (kept.py) when there
    is one and it checks, else traced now and kept. A config of the caller's own is always traced. Returns the
    model, its Traced class, the listing, and which it was ("kept", "traced and kept", "traced")."""
    shapes = opened.manifest.source_shapes
    if config is not None:
        listing = Listing()
        return *construct(code, config, shapes, device, listing), listing, "traced"
    path = kept_path(root, code, opened.name, device is not None)
    code.attr(str(N16.port["model"]))  # this tree's modules, before any of its classes is looked up
    try:
        return *restore(path, code, device), "kept"
    except NotKept:
        pass
    listing = Listing()
    model, traced = construct(code, port_config(code, shapes), shapes, device, listing)
    try:
        kept = listing.keepable and keep(path, code, model, traced, listing, device)
    except OSError:  # a read-only cache: every start traces
        kept = False
    return model, traced, listing, "traced and kept" if kept else "traced"


def _load(entry: Entry, needed: list[tuple[str, int | None]], host_arrays: list[str], device, threads: int):
    """The device files asked for and the host tables (float32 torch tensors), every byte read and checked
    against its record (tasks/entries/reload.py), and the bytes read."""
    missing = [(n, s) for n, s in needed if not entry.has_device_file(n, s)]
    if missing:
        raise CacheError(f"{entry.describe()}: {missing[0][0]} has no device file (profile "
                         f"{entry.manifest.profile} keeps none); convert with --profile port or bfp8")
    with ThreadPoolExecutor(threads) as pool:
        host_tables = {n: pool.submit(reload.host_table, entry, n, check_mapped=True) for n in host_arrays}
        tensors = reload.device_tensors(entry, needed, pool, device, check_mapped=True)  # every byte is used
        host = {n: f.result() for n, f in host_tables.items()}
    nbytes = reload.read_bytes(entry, needed, from_device_files=True) + \
        reload.read_bytes(entry, [(n, None) for n in host_arrays])
    return dict(zip(needed, tensors)), host, nbytes


