"""The hand-off to tt-metal's GR00T N1.6 port: its own `Gr00tN16ModelTTNN`, built from a cache entry.

The port's constructors take HF torch dicts and preprocess every weight themselves (`w.t()`, head padding,
fusing, `ttnn.from_torch`). Our tt-n16 tensors are their output already, so here the port's own constructors run,
unchanged, on *traced* weights: meta tensors that carry a checkpoint key's shape and dtype but no bytes, and
remember which keys (and which embodiment slot) every tensor derived from them came from. Each `ttnn.from_torch`
the port calls on one is answered with the entry's `.tensorbin` of that target through `ttnn.load_tensor`
(`device=` on a device); everything else the port computes (RoPE tables, the causal mask, `Timesteps`,
`is_cross_attention`, padded dims) it computes itself, from the checkpoint's real shapes. Weights it keeps on
the host (embed_tokens, q_norm, k_norm as float32) become the entry's host tensors.

The port's constructors run once. While they run (no bytes, no device) every tensor the port asks for is listed
and held to a target of the entry: sources, shape, dtype and layout, so a port revision this layout does not serve
is caught in one sentence before anything is read. Then those files are loaded (checked against their records) and
swapped into the built model in place of its placeholders; one the walk cannot reach stops the build by name.

Every port revision is also checked once against the port's own constructor on a small synthetic checkpoint
(`check_port`, `gr00t-tt port-check`); the verdict is kept under the cache root, keyed by the port's code and
our recipes, and `build_model` runs the check at first use.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import inspect
import json
import math
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

from pipeline import cache
from pipeline.state_dict import dims_of
from pipeline.recipe import RECIPES_PATH, build_plan
from pipeline.versions import load_config
from tasks import reload
from tasks.entry import Entry
from tasks.errors import CacheError, PipelineError

VERSION = "n16"
N16 = load_config(VERSION)  # configs/n16.toml: its [port] table names the port's classes and layouts
TT_METAL_ENV = "TT_METAL_HOME"


class PortError(PipelineError):
    """The port's code cannot be found, or builds tensors this entry does not hold."""


# -- the port's code ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PortCode:
    """The port's modules, imported from one tt-metal tree, and the revision of that code (sha256 of its files)."""

    root: Path
    package: str
    revision: str

    @classmethod
    def find(cls, tt_metal: str | Path | None = None) -> "PortCode":
        spec = N16.port
        where = tt_metal or os.environ.get(TT_METAL_ENV)
        if not where:
            raise PortError(f"no tt-metal tree given: pass tt_metal= (--tt-metal DIR) or set {TT_METAL_ENV} to the "
                            f"checkout holding {spec['package'].replace('.', '/')}/")
        root = Path(where).expanduser().resolve()
        folder = root / Path(*str(spec["package"]).split("."))
        if not (folder / "tt").is_dir():
            raise PortError(f"{root}: no GR00T N1.6 port there ({folder} is missing); point --tt-metal (or "
                            f"{TT_METAL_ENV}) at a tt-metal checkout that has {spec['package'].replace('.', '/')}/")
        digest = hashlib.sha256()
        for path in sorted(folder.rglob("*.py")):
            if "tests" not in path.relative_to(folder).parts:
                digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes())
        return cls(root, str(spec["package"]), digest.hexdigest()[:16])

    def attr(self, ref: str) -> Any:
        """`module.path:Name` below the port's package, imported from this tree (another tree's modules are
        dropped first: two revisions can be used in one process)."""
        top = self.package.split(".")[0]
        loaded = sys.modules.get(top)
        if loaded is not None and not any(Path(p).resolve().is_relative_to(self.root)
                                          for p in getattr(loaded, "__path__", [])):
            for name in [n for n in sys.modules if n == top or n.startswith(top + ".")]:
                del sys.modules[name]
        if sys.path[:1] != [str(self.root)]:  # this tree's `models` before any other's
            sys.path[:] = [str(self.root)] + [p for p in sys.path if p != str(self.root)]
        module, name = ref.split(":")
        try:
            return getattr(importlib.import_module(f"{self.package}.{module}"), name)
        except ImportError as e:
            raise PortError(self._import_failure(module, e)) from None

    def _import_failure(self, module: str, error: ImportError) -> str:
        """The port's file whose import failed (the innermost frame in this tree), and the hint that fits: a module
        of the port's own package missing means a tree of another layout or age; anything else, a package this
        Python lacks."""
        failed, tb = None, error.__traceback__
        while tb is not None:
            path = Path(tb.tb_frame.f_code.co_filename)
            failed = path if path.is_relative_to(self.root) else failed
            tb = tb.tb_next
        where = failed.relative_to(self.root) if failed else f"{self.package.replace('.', '/')}/{module}"
        missing = error.name or ""
        if missing.split(".")[0] == self.package.split(".")[0]:
            hint = (f"{missing} is not in this tree, so it is a port of another layout or age than this converter "
                    f"reads ({self.package}); point --tt-metal at a checkout of that port")
        else:
            hint = f"install {missing.split('.')[0] or 'what it imports'} in this Python (the port needs ttnn, torch and diffusers)"
        return f"{self.root}: the port's {where} does not import ({error}); {hint}"


# -- traced weights -----------------------------------------------------------------------------------------------
def _traced_class():
    import torch

    class Traced(torch.Tensor):
        """A checkpoint tensor without bytes (device "meta"): what the port derives from it keeps `sources` (the
        checkpoint keys, in concatenation order), `slot` (the embodiment slot indexed out of a bank) and `ops`."""

        sources: tuple[str, ...]
        slot: int | None
        bank: bool
        ops: tuple[str, ...]

        @staticmethod
        def make(meta, sources, slot=None, bank=False, ops=()):
            t = torch.Tensor._make_subclass(Traced, meta)
            t.sources, t.slot, t.bank, t.ops = tuple(sources), slot, bank, tuple(ops)
            return t

        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            inputs = [a for a in _leaves((args, kwargs)) if isinstance(a, Traced)]
            with torch._C.DisableTorchFunctionSubclass():
                out = func(*args, **kwargs)
            if not isinstance(out, torch.Tensor) or not inputs:
                return out
            sources = tuple(dict.fromkeys(s for t in inputs for s in t.sources))
            slot = next((t.slot for t in inputs if t.slot is not None), None)
            first = inputs[0]
            name = getattr(func, "__name__", str(func))
            if name == "__getitem__" and first.bank and slot is None and isinstance(args[1], int):
                return Traced.make(out, sources, args[1], False, (*first.ops, f"slot {args[1]}"))
            return Traced.make(out, sources, slot, first.bank and out.dim() == first.dim(), (*first.ops, name))

    return Traced


def _leaves(obj) -> Iterator[Any]:
    """The values inside a torch call's (args, kwargs): the port nests at most a list in the arguments."""
    args, kwargs = obj
    for x in (*args, *kwargs.values()):
        if isinstance(x, (list, tuple)):
            yield from x
        else:
            yield x


HOST_OPS = frozenset({"to", "float", "contiguous", "clone", "detach"})  # what the port may do to a host table


@dataclass(frozen=True)
class Request:
    """One `ttnn.from_torch` of a weight by the port: what it derived the tensor from and what it asked for."""

    sources: tuple[str, ...]
    slot: int | None
    shape: tuple[int, ...]
    dtype: str
    layout: str
    on_device: bool

    def describe(self) -> str:
        slot = f" slot {self.slot}" if self.slot is not None else ""
        return (f"a {list(self.shape)} {self.dtype} {self.layout} tensor from {', '.join(self.sources)}{slot}")


@dataclass
class _Listing:
    """What the port's constructors asked for, in order: each request, and the placeholder handed back for it
    (filled with the loaded tensor once the files are read)."""

    requests: list[Request] = field(default_factory=list)


class _Pending:
    """Handed to the port in place of a device tensor, until the entry's files are read and it is filled in.
    The port's constructors only store what from_torch returns; one that used it would find out here."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index

    def __getattr__(self, name):
        raise PortError(f"the port's constructor uses the tensor ttnn.from_torch returned ({name}) while it is being "
                        "built; a hand-off from converted tensors cannot serve this port revision")


class _Unloaded:
    """Stands for a slot that was not asked for; removed from the built model (its dict then says so)."""


class SlotsLoaded(dict):
    """A port dict of per-slot tensors holding only the slots loaded: any other slot is a clear error, never a
    wrong slot."""

    def __missing__(self, slot):
        raise KeyError(f"embodiment slot {slot} was not loaded into this model (loaded: {sorted(self)}); build it "
                       "with embodiments= that include it, or all")


def _enum_name(value) -> str:
    return str(value).rsplit(".", 1)[-1].replace("_LAYOUT", "")


def _from_torch_signature(real) -> inspect.Signature:
    """ttnn.from_torch's own parameters (its decorator hides them behind `.function`), so that arguments are read
    by name however they were passed, and a call ttnn would refuse is refused alike."""
    signature = inspect.signature(getattr(real, "function", real))
    if "tensor" in signature.parameters:
        return signature
    return inspect.signature(lambda tensor, dtype=None, *, layout=None, device=None, memory_config=None, **rest: None)


UNSERVED = ("spec", "tile", "mesh_mapper")  # from_torch arguments a device file made without them cannot honour


@contextlib.contextmanager
def _intercepted(listing: _Listing, traced_type) -> Iterator[None]:
    """While the port's constructors run, `ttnn.from_torch` of a traced weight is listed and answered with a
    placeholder; any other tensor (the causal mask) goes to ttnn as before. ttnn's own function is put back
    afterwards, however the constructors end."""
    import ttnn

    real = ttnn.from_torch
    signature = _from_torch_signature(real)

    def from_torch(*args, **kwargs):
        try:
            given = signature.bind(*args, **kwargs).arguments
        except TypeError:
            return real(*args, **kwargs)  # ttnn says what is wrong with the call
        tensor = given.get("tensor")
        if not isinstance(tensor, traced_type):
            return real(*args, **kwargs)
        layout = _enum_name(given.get("layout") or ttnn.ROW_MAJOR_LAYOUT)
        request = Request(tensor.sources, tensor.slot, tuple(tensor.shape),
                          _enum_name(given.get("dtype") or ttnn.bfloat16).lower(), layout, given.get("device") is not None)
        memory = given.get("memory_config")
        if memory is not None and memory != ttnn.DRAM_MEMORY_CONFIG:
            raise PortError(f"the port asks for {request.describe()} in {memory}; the hand-off loads weights "
                            "into DRAM only")
        unserved = [name for name in UNSERVED if given.get(name) is not None]
        if unserved:
            raise PortError(f"the port asks for {request.describe()} with {unserved[0]}=; the entry's device files "
                            "are made without it, so the hand-off cannot serve this port revision")
        listing.requests.append(request)
        return _Pending(len(listing.requests) - 1)

    ttnn.from_torch = from_torch
    try:
        yield
    finally:
        ttnn.from_torch = real


# -- the entry's side ---------------------------------------------------------------------------------------------
def _match(requests: list[Request], entry: Entry, code: PortCode) -> dict[tuple[str, ...], str]:
    """sources -> target name for every request, each held to its target's shape, dtype and layout; the first
    that no target serves is a PortError naming the layout revision that would (or that none does)."""
    arrays = entry.manifest.arrays
    by_sources = {tuple(a.attributes["sources"]): name for name, a in arrays.items()}
    for r in requests:
        name = by_sources.get(r.sources)
        a = arrays.get(name) if name else None
        if a is not None and tuple(a.logical_shape) == r.shape and a.device_dtype == r.dtype and \
                a.device_layout == r.layout and a.bank == (r.slot is not None):
            continue
        have = (f"its target {name} is a {a.logical_shape} {a.device_dtype} {a.device_layout}" if a else
                "no target of it has those sources")
        fits = _layouts_serving(requests, entry.manifest.source_shapes, entry.manifest.profile)
        remedy = (f"convert with --layout {fits[0]} for this port revision" if fits else
                  f"no supported layout revision ({', '.join(N16.port['layouts'])}) has it; "
                  "this port revision is not supported")
        raise PortError(f"{code.root} (port revision {code.revision}) builds {r.describe()}, but entry "
                        f"{entry.name} ({entry.manifest.layout}) cannot hand it over: {have}; {remedy}")
    return by_sources


def _layouts_serving(requests: list[Request], source_shapes: Mapping[str, list[int]], profile: str) -> list[str]:
    """The layout revisions whose plan, for this checkpoint, has a target for every request."""
    shapes = {k: tuple(v) for k, v in source_shapes.items()}
    fits = []
    for layout in N16.port["layouts"]:
        plan = build_plan(VERSION, shapes, profile, layout)
        targets = {t.sources: t for t in plan.targets}
        if all(_serves(targets.get(r.sources), r) for r in requests):
            fits.append(layout)
    return fits


def _serves(target, request: Request) -> bool:
    """Whether a planned target is the tensor a request asks for (a bank's target: one slot of it)."""
    return target is not None and target.shape == request.shape and target.device_dtype == request.dtype and \
        target.layout == request.layout and target.embodiment == (request.slot is not None)


def port_config(code: PortCode, source_shapes: Mapping[str, list[int]]):
    """The port's own Gr00tN16Config, default but for the fields configs/n16.toml [port.fields] derives from
    this checkpoint's dims (at the published dims: the default exactly)."""
    spec = N16.port
    config = code.attr(str(spec["config"]))()
    dims = dict(dims_of(N16, {k: tuple(v) for k, v in source_shapes.items()}))
    for path, expression in spec["fields"].items():
        *parents, leaf = path.split(".")
        owner = config
        for p in parents:
            owner = getattr(owner, p)
        setattr(owner, leaf, int(eval(expression, {"__builtins__": {}, "isqrt": math.isqrt}, dims)))  # noqa: S307
    return config


def _traced_loader(code: PortCode, source_shapes: Mapping[str, list[int]], banks: set[str]):
    """The port's own weight loader, holding a traced tensor for every checkpoint key (its `load()` returns
    them: it reads no file)."""
    import torch

    traced = _traced_class()
    loader = code.attr(str(N16.port["loader"]))()
    loader._state_dict = {k: traced.make(torch.empty(shape, dtype=torch.bfloat16, device="meta"), (k,),
                                         bank=k in banks) for k, shape in source_shapes.items()}
    return loader, traced


# -- building -----------------------------------------------------------------------------------------------------
@dataclass
class PortModel:
    """The port's model as built, and how: `model` is `Gr00tN16ModelTTNN`, the port's class."""

    model: Any
    entry: str
    revision: str
    layout: str
    slots: tuple[int, ...]
    stats: dict


def _wanted_slots(entry: Entry, embodiments: str | int | None) -> tuple[int, ...]:
    held = sorted({s for a in entry.manifest.arrays.values() if a.bank for s in a.chunks})
    if embodiments is None or str(embodiments).strip() == "all":
        return tuple(held)
    wanted = N16.slot_ids(str(embodiments))
    missing = [s for s in wanted if s not in held]
    if missing:
        raise CacheError(f"{entry.describe()}: embodiment slot(s) {missing} were not converted into this entry (it "
                         f"holds {held}); convert with --embodiments {','.join(map(str, wanted))} or all")
    return tuple(wanted)


def _construct(code: PortCode, config, source_shapes: Mapping[str, list[int]], device, listing: _Listing):
    """Run the port's own constructor on traced weights, each `from_torch` of one listed and answered with a
    placeholder."""
    loader, traced = _traced_loader(code, source_shapes, set(N16.embodiment_keys))
    model_class = code.attr(str(N16.port["model"]))
    with _intercepted(listing, traced):
        try:
            model = model_class(config, loader, device)
        except PortError:
            raise
        except (RuntimeError, NotImplementedError, TypeError, ValueError) as e:
            first = (str(e).splitlines() or [""])[0][:160]
            if "meta" in str(e).lower():  # it computed on weight values: a traced (meta) tensor has none
                raise PortError(f"{code.root} (port revision {code.revision}): its constructor computes on weight "
                                f"values ({type(e).__name__}: {first}), which a hand-off from converted tensors "
                                "cannot serve; this port revision is not supported") from None
            raise PortError(f"{code.root} (port revision {code.revision}): its constructor failed on the traced "
                            f"weights ({type(e).__name__}: {first}); check that this tree's port runs on its own "
                            "(`python -m pipeline port-check`)") from None
    return model, traced


@dataclass
class _Fill:
    """What `_finish` puts in place of the traced model's stand-ins, and which placeholders it found."""
    traced: type
    filled: list                               # by request: the loaded device tensor (or _Unloaded)
    host: Mapping[tuple[str, ...], Any]        # sources -> the entry's float32 host tensor
    code: PortCode
    seen: set = field(default_factory=set)     # ids of the objects walked
    used: set = field(default_factory=set)     # request indexes whose placeholder was replaced


def _finish(node, fill: _Fill) -> Any:
    """Walk the built model: placeholders become the loaded device tensors (by request), traced host tables the
    entry's float32 tensors, and slots not loaded leave their dicts (which then refuse them by name)."""
    if type(node) is _Pending:
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
            node[k] = _finish(node[k], fill)
        if any(_holds_unloaded(v) for v in node.values()):
            return SlotsLoaded({k: v for k, v in node.items() if not _holds_unloaded(v)})
        return node
    if isinstance(node, list):
        node[:] = [_finish(x, fill) for x in node]
        return node
    if isinstance(node, tuple):
        return tuple(_finish(x, fill) for x in node)
    if hasattr(node, "__dict__") and type(node).__module__.startswith(fill.code.package):
        for k, v in vars(node).items():
            setattr(node, k, _finish(v, fill))
    return node


def _check_filled(fill: _Fill, requests: list[Request]) -> None:
    """Every weight the port asked for is in the model now: a placeholder kept where the walk does not look (a
    set, an object of another package) would fail only at the first forward pass."""
    left = sorted(set(range(len(requests))) - fill.used)
    if left:
        raise PortError(f"{fill.code.root} (port revision {fill.code.revision}) keeps {len(left)} weight(s) where the "
                        f"hand-off cannot put the loaded tensor (the first: {requests[left[0]].describe()}); this port "
                        "revision is not supported")


def _holds_unloaded(value) -> bool:
    return isinstance(value, _Unloaded) or (isinstance(value, tuple) and any(isinstance(x, _Unloaded) for x in value))


def build_model(cache_dir=None, tt_metal: str | Path | None = None, device=None, embodiments: str | int | None = None,
                entry: str | None = None, profile: str | None = None, config=None, check: bool = True,
                threads: int = 4, synthetic: bool = False) -> PortModel:
    """The port's `Gr00tN16ModelTTNN` from a cache entry, on `device` (None: ttnn host tensors). Reads no
    safetensors and calls `from_torch` on no weight: every device tensor is ttnn's `load_tensor` of the entry's
    `.tensorbin`. `embodiments`: every slot the entry holds (default, as the port builds them), or a list of
    tags/ids. `config`: the port's Gr00tN16Config (default: derived from the entry, see `port_config`).
    `check`: hold this port revision to the port's own constructor once first (`check_port`). A synthetic entry
    warns (SyntheticWeightsWarning) unless `synthetic=True`."""
    t0 = time.perf_counter()
    code = PortCode.find(tt_metal)
    store = cache.cache_store(cache_dir)
    asked = None if embodiments is None or str(embodiments).strip() == "all" else \
        N16.slot_ids(str(embodiments))
    opened, listing, model, traced = _serving_entry(code, store, entry, profile or "port", asked, config, device)
    cache.warn_if_synthetic(opened, synthetic)
    if check:
        verdict = check_port(code, opened.manifest.layout, store_root=cache.build_root(store))
        if not verdict["ok"]:
            raise PortError(f"{code.root} (port revision {code.revision}) failed its self-check against the port's "
                            f"own constructor: {verdict['differences'][0]}")
    slots = _wanted_slots(opened, embodiments)
    targets = _match(listing.requests, opened, code)
    t_listed = time.perf_counter()
    needed = sorted({(targets[r.sources], r.slot) for r in listing.requests if r.slot is None or r.slot in slots},
                    key=str)
    host_arrays = [n for n, a in opened.manifest.arrays.items() if a.host_only]
    with cache.reading(opened.store, opened.name):  # gc and rm leave it alone meanwhile
        loaded, host, nbytes = _load(opened, needed, host_arrays, device, threads)
    filled = [loaded.get((targets[r.sources], r.slot), _Unloaded()) for r in listing.requests]
    by_sources = {tuple(opened.manifest.arrays[n].attributes["sources"]): t for n, t in host.items()}
    fill = _Fill(traced, filled, by_sources, code)
    model = _finish(model, fill)
    _check_filled(fill, listing.requests)
    stats = {"seconds": time.perf_counter() - t0, "listing_seconds": t_listed - t0, "device_files": len(needed),
             "host_tensors": len(host), "bytes_read": nbytes,
             "tensor_bytes": nbytes - sum(opened.manifest.arrays[n].chunks[None].nbytes for n in host)  # stored...
                             + sum(t.numel() * 4 for t in host.values())}  # ...as the float32 the port holds
    return PortModel(model, opened.name, code.revision, opened.manifest.layout, slots, stats)


def _serving_entry(code: PortCode, store, entry: str | None, profile: str, asked: tuple[int, ...] | None, config,
                   device):
    """The entry to hand over, and the port's model built on it with placeholders for its device tensors (what
    they ask for is listed; no bytes are read): `entry` when named, else the last conversion in the layout
    revision that serves this port (tt-n16 first)."""
    slot = asked[0] if asked else None
    layouts = list(N16.port["layouts"])
    opened = None
    for layout in layouts if entry is None else ["tt-n16"]:
        try:
            opened = cache.choose_entry(store, cache.Wanted(VERSION, layout, profile, slot, entry))
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
        listing = _Listing()
        model, traced = _construct(code, config or port_config(code, shapes), shapes, device, listing)
        fits = _layouts_serving(listing.requests, shapes, opened.manifest.profile)
        if opened.manifest.layout in fits or not fits or entry is not None:
            return opened, listing, model, traced  # (a layout that does not fit is explained by _match)
        try:
            opened = cache.choose_entry(store, cache.Wanted(VERSION, fits[0], profile, slot))
        except CacheError as e:
            raise CacheError(f"port revision {code.revision} at {code.root} takes layout {fits[0]}: {e}") from None
    return opened, listing, model, traced


def _load(entry: Entry, needed: list[tuple[str, int | None]], host_arrays: list[str], device, threads: int):
    """The device files asked for and the host tables (float32 torch tensors), every byte read and checked
    against its record (tasks/reload.py), and the bytes read."""
    arrays = entry.manifest.arrays
    missing = [(n, s) for n, s in needed if arrays[n].chunks[s].tensorbin is None]
    if missing:
        raise CacheError(f"{entry.describe()}: {missing[0][0]} has no device file (profile "
                         f"{entry.manifest.profile} keeps none); convert with --profile port or bfp8")
    with ThreadPoolExecutor(threads) as pool:
        host_tables = {n: pool.submit(reload.host_table, entry, n) for n in host_arrays}
        tensors = reload.device_tensors(entry, needed, pool, device, check_mapped=True)  # every byte is used
        host = {n: f.result() for n, f in host_tables.items()}
    nbytes = reload.read_bytes(entry, needed, from_device_files=True) + \
        reload.read_bytes(entry, [(n, None) for n in host_arrays])
    return dict(zip(needed, tensors)), host, nbytes


# -- comparing two builds -----------------------------------------------------------------------------------------
def _tensor_bytes(tensor, scratch: Path) -> bytes:
    import ttnn

    host = ttnn.from_device(tensor) if tensor.storage_type() == ttnn.StorageType.DEVICE else tensor
    path = scratch / "t.tensorbin"
    ttnn.dump_tensor(str(path), host)
    return path.read_bytes()


def differences(ours, theirs, limit: int = 20, counts: dict | None = None) -> list[str]:
    """Where two built models differ, walking every attribute recursively: ttnn tensors by dtype, layout, shape,
    padded shape, storage, memory config and ttnn's own serialized bytes; torch tensors by dtype, shape and bytes;
    every other value by type and equality (devices and callables by identity). `counts` gets how many of each
    were compared (ttnn, on_device, torch, values). (Over 50 lines: one walk with one case per kind of value,
    which reads best in one place.)"""
    import torch
    import ttnn

    found: list[str] = []
    tally = counts if counts is not None else {}
    for kind in ("ttnn", "on_device", "torch", "values"):
        tally.setdefault(kind, 0)
    seen: set[tuple[int, int]] = set()
    scratch = Path(tempfile.mkdtemp(prefix="port-compare-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None))

    def walk(a, b, path: str) -> None:
        if len(found) >= limit or (id(a), id(b)) in seen:
            return
        seen.add((id(a), id(b)))
        if type(a) is not type(b) and not (isinstance(a, dict) and isinstance(b, dict)):
            found.append(f"{path}: {type(a).__name__} against {type(b).__name__}")
        elif isinstance(a, ttnn.Tensor):
            tally["ttnn"] += 1
            tally["on_device"] += a.storage_type() == ttnn.StorageType.DEVICE
            facts = lambda t: (t.dtype, t.layout, tuple(t.shape), tuple(t.padded_shape), t.storage_type(),  # noqa: E731
                               str(t.memory_config()) if t.storage_type() == ttnn.StorageType.DEVICE else None)
            if facts(a) != facts(b):
                found.append(f"{path}: {facts(a)} against {facts(b)}")
            elif _tensor_bytes(a, scratch) != _tensor_bytes(b, scratch):
                found.append(f"{path}: the bytes differ")
        elif isinstance(a, torch.Tensor):
            tally["torch"] += 1
            if (a.dtype, tuple(a.shape)) != (b.dtype, tuple(b.shape)):
                found.append(f"{path}: {a.dtype} {list(a.shape)} against {b.dtype} {list(b.shape)}")
            elif a.is_meta or b.is_meta or not torch.equal(a.contiguous().view(torch.uint8) if a.dim() else a,
                                                           b.contiguous().view(torch.uint8) if b.dim() else b):
                found.append(f"{path}: the values differ")
        elif isinstance(a, dict):
            if list(a) != list(b):
                found.append(f"{path}: keys {list(a)[:8]} against {list(b)[:8]}")
            for k in a:
                if k in b:
                    walk(a[k], b[k], f"{path}[{k!r}]")
        elif isinstance(a, (list, tuple)):
            if len(a) != len(b):
                found.append(f"{path}: {len(a)} items against {len(b)}")
            for i, (x, y) in enumerate(zip(a, b)):
                walk(x, y, f"{path}[{i}]")
        elif isinstance(a, (str, bytes, int, float, bool, type(None))):
            tally["values"] += 1
            if a != b:
                found.append(f"{path}: {a!r} against {b!r}")
        elif inspect.isroutine(a) or inspect.isclass(a) or type(a).__module__.startswith("ttnn") or \
                not hasattr(a, "__dict__"):
            if a is not b and a != b:  # devices, functions, enums
                found.append(f"{path}: {a!r} against {b!r}")
        else:  # the port's objects, its config dataclasses, diffusers' Timesteps module
            keys_a, keys_b = sorted(vars(a)), sorted(vars(b))
            if keys_a != keys_b:
                found.append(f"{path}: attributes {sorted(set(keys_a) ^ set(keys_b))} on one side only")
            for k in keys_a:
                if k in vars(b):
                    walk(vars(a)[k], vars(b)[k], f"{path}.{k}")

    try:
        walk(ours, theirs, "model")
    finally:
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)
    return found


def build_with_port(code: PortCode, snapshot: Path, config, device=None):
    """The port's own way, for comparison: its weight loader reads the snapshot and its constructors preprocess."""
    loader_class = code.attr(str(N16.port["loader"]))
    model_class = code.attr(str(N16.port["model"]))
    return model_class(config, loader_class(model_path=str(snapshot)), device)


# -- the self-check -----------------------------------------------------------------------------------------------
CHECK_SCALE = "attn"  # real attention shapes: the port's cross-attention test sees non-square to_k there


def _verdict_path(root: Path, code: PortCode, layout: str) -> Path:
    from pipeline.cache import CONVERTER_VERSION
    from tasks.entry import CACHE_FORMAT

    key = hashlib.sha256(f"{code.revision}\0{layout}\0{RECIPES_PATH.read_bytes().hex()}\0{CACHE_FORMAT}\0"
                         f"{CONVERTER_VERSION}".encode()).hexdigest()[:20]
    return root / "port-checks" / f"{code.revision}-{layout}-{key}.json"


def check_port(code: PortCode, layout: str | None = None, store_root: Path | None = None, device=None,
               force: bool = False, log=None) -> dict:
    """Build a small synthetic N1.6 both ways, with the port's own constructor and from an entry of `layout`
    (default: the first layout revision that serves this port), compare everything, and keep the verdict."""
    from pipeline.convert import ConvertOptions, convert
    from pipeline.synth import synthesize

    root = store_root or cache.cache_root(None)
    layout = layout or serving_layout(code)
    record = _verdict_path(root, code, layout)
    if record.is_file() and not force and device is None:
        return json.loads(record.read_text())
    if log:
        log(f"port-check: port revision {code.revision} at {code.root} against a synthetic "
            f"N1.6 at {CHECK_SCALE} scale in {layout} (once per port revision)")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="port-check-") as tmp:
        hf = Path(tmp) / "hf"
        snapshot = synthesize(VERSION, hf, CHECK_SCALE)
        convert(ConvertOptions(VERSION, "port", "all", hf_cache=hf, synthetic=CHECK_SCALE, cache_root=Path(tmp) / "cache",
                               layout=layout, progress=False, reuse=False))
        ours = build_model(Path(tmp) / "cache", code.root, device, check=False, synthetic=True)
        theirs = build_with_port(code, snapshot, port_config(code, _shapes_of(snapshot)), device)
        found = differences(ours.model, theirs)
    verdict = {"ok": not found, "revision": code.revision, "root": str(code.root), "layout": layout,
               "scale": CHECK_SCALE, "differences": found, "device_files": ours.stats["device_files"],
               "seconds": round(time.perf_counter() - t0, 2), "on_device": device is not None}
    if device is None:
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps(verdict, indent=1))
    return verdict


def _shapes_of(snapshot: Path) -> dict[str, list[int]]:
    from tasks.checkpoint import Checkpoint

    with Checkpoint(snapshot) as ck:
        return {k: list(ck.shape(k)) for k in ck.keys()}


def serving_layout(code: PortCode) -> str:
    """The layout revision whose targets this port's constructors ask for, found by listing what they build for
    the published N1.6 shapes (no bytes: a fraction of a second)."""
    from pipeline.state_dict import tensor_specs as key_specs

    shapes = {s.key: list(s.shape) for s in key_specs(VERSION, "full")}
    listing = _Listing()
    _construct(code, port_config(code, shapes), shapes, None, listing)
    fits = _layouts_serving(listing.requests, shapes, "port")
    if not fits:
        plan = {t.sources: t for t in build_plan(VERSION, {k: tuple(v) for k, v in shapes.items()}, "port",
                                                  N16.port["layouts"][0]).targets}
        first = next(r for r in listing.requests if not _serves(plan.get(r.sources), r))
        raise PortError(f"{code.root} (port revision {code.revision}) builds {first.describe()}: no supported "
                        f"layout revision ({', '.join(N16.port['layouts'])}) has it; this port "
                        "revision is not supported")
    return fits[0]
