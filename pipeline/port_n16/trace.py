"""Tracing: the port's own constructors run on weights without bytes, and every `ttnn.from_torch` of one is listed.

A traced weight is a meta tensor that carries a checkpoint key's shape and dtype, and remembers which keys (and
which embodiment slot) every tensor derived from it came from. While the constructors run, `from_torch` of one is
answered with a placeholder (`Pending`) and listed as a `Request`; everything else the port computes (RoPE tables,
the causal mask, `Timesteps`, padded dims) it computes itself, from the checkpoint's real shapes.
"""

from __future__ import annotations

import contextlib
import inspect
import math
from dataclasses import dataclass, field
from typing import Iterator, Mapping

from pipeline.port_n16.code import N16, PortCode, PortError
from pipeline.model.state_dict import dims_of
from tasks.errors import ConfigError


def traced_class():
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
            inputs = _traced_among(args, kwargs, Traced)
            with torch._C.DisableTorchFunctionSubclass():
                out = func(*args, **kwargs)
            if not isinstance(out, torch.Tensor) or not inputs:
                return out
            sources = inputs[0].sources if len(inputs) == 1 else \
                tuple(dict.fromkeys(s for t in inputs for s in t.sources))
            slot = next((t.slot for t in inputs if t.slot is not None), None)
            first = inputs[0]
            name = getattr(func, "__name__", str(func))
            if name == "__getitem__" and first.bank and slot is None and isinstance(args[1], int):
                return Traced.make(out, sources, args[1], False, (*first.ops, f"slot {args[1]}"))
            return Traced.make(out, sources, slot, first.bank and out.dim() == first.dim(), (*first.ops, name))

    return Traced


def _traced_among(args: tuple, kwargs: dict, traced: type) -> list:
    """The traced tensors among a torch call's arguments (the port nests at most a list in them). Called for
    every torch operation the port's constructors make (6,600 for N1.6), so a loop, not a generator."""
    found = []
    for x in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(x, traced):
            found.append(x)
        elif isinstance(x, (list, tuple)):
            found.extend(y for y in x if isinstance(y, traced))
    return found


HOST_OPS = frozenset({"to", "float", "contiguous", "clone", "detach"})  # what the port may do to a host table


@dataclass(frozen=True, kw_only=True)
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


@dataclass(frozen=True, kw_only=True)
class Made:
    """One `ttnn.from_torch` the port made of a tensor it computed itself (the causal mask): kept.py makes it again
    from `tensor` the same way."""

    result: object
    tensor: object
    dtype: str
    layout: str
    on_device: bool
    dram: bool


@dataclass
class Listing:
    """What the port's constructors asked for, in order: each request, and the placeholder handed back for it
    (filled with the loaded tensor once the files are read); and the tensors it made itself (`keepable` is False
    when one was made in a way kept.py does not make again)."""

    requests: list[Request] = field(default_factory=list)
    made: list[Made] = field(default_factory=list)
    keepable: bool = True


class Pending:
    """Handed to the port in place of a device tensor, until the entry's files are read and it is filled in.
    The port's constructors only store what from_torch returns; one that used it would find out here."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index

    def __getattr__(self, name):
        raise PortError(f"the port's constructor uses the tensor ttnn.from_torch returned ({name}) while it is being "
                        "built; a hand-off from converted tensors cannot serve this port revision")



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
def intercepted(listing: Listing, traced_type) -> Iterator[None]:
    """While the port's constructors run, `ttnn.from_torch` of a traced weight is listed and answered with a
    placeholder; any other tensor (the causal mask) goes to ttnn as before. ttnn's own function is put back
    afterwards, however the constructors end."""
    import ttnn

    real = ttnn.from_torch
    signature = _from_torch_signature(real)
    by_keyword = {n for n, p in signature.parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    tensor_first = next(iter(signature.parameters)) == "tensor"

    def from_torch(*args, **kwargs):
        if tensor_first and len(args) == 1 and "tensor" not in kwargs and by_keyword.issuperset(kwargs):
            given = {"tensor": args[0], **kwargs}  # the port's way: what bind() gives, at a tenth of its cost
        else:
            try:
                given = signature.bind(*args, **kwargs).arguments
            except TypeError:
                return real(*args, **kwargs)  # ttnn says what is wrong with the call
        tensor = given.get("tensor")
        if not isinstance(tensor, traced_type):
            result = real(*args, **kwargs)
            _note_made(listing, result, given, ttnn)
            return result
        layout = _enum_name(given.get("layout") or ttnn.ROW_MAJOR_LAYOUT)
        request = Request(sources=tensor.sources, slot=tensor.slot, shape=tuple(tensor.shape),
                          dtype=_enum_name(given.get("dtype") or ttnn.bfloat16).lower(), layout=layout,
                          on_device=given.get("device") is not None)
        memory = given.get("memory_config")
        if memory is not None and memory != ttnn.DRAM_MEMORY_CONFIG:
            raise PortError(f"the port asks for {request.describe()} in {memory}; the hand-off loads weights "
                            "into DRAM only")
        unserved = [name for name in UNSERVED if given.get(name) is not None]
        if unserved:
            raise PortError(f"the port asks for {request.describe()} with {unserved[0]}=; the entry's device files "
                            "are made without it, so the hand-off cannot serve this port revision")
        listing.requests.append(request)
        return Pending(len(listing.requests) - 1)

    ttnn.from_torch = from_torch
    try:
        yield
    finally:
        ttnn.from_torch = real


def _note_made(listing: Listing, result, given: Mapping, ttnn) -> None:
    """List a tensor the port made itself, if it was made with only what kept.py gives again: a dtype, a layout,
    a device or none, and DRAM or no memory config."""
    import torch

    tensor, device, memory = given.get("tensor"), given.get("device"), given.get("memory_config")
    plain = set(given) <= {"tensor", "dtype", "layout", "device", "memory_config"} and type(tensor) is torch.Tensor
    if not plain or (memory is not None and memory != ttnn.DRAM_MEMORY_CONFIG):
        listing.keepable = False
        return
    listing.made.append(Made(result=result, tensor=tensor, dtype=_enum_name(given.get("dtype") or ttnn.bfloat16),
                             layout=str(given.get("layout") or ttnn.ROW_MAJOR_LAYOUT).rsplit(".", 1)[-1],
                             on_device=device is not None, dram=memory is not None))


def port_config(code: PortCode, source_shapes: Mapping[str, list[int]]):
    """The port's own Gr00tN16Config, default but for the fields configs/n16.toml [port.fields] derives from
    this checkpoint's dims (at the published dims: the default exactly)."""
    spec = N16.port
    config = code.attr(str(spec["config"]))()
    dims = dict(dims_of(N16, {k: tuple(v) for k, v in source_shapes.items()}))
    for path, factors in spec["fields"].items():
        *parents, leaf = path.split(".")
        owner = config
        for p in parents:
            owner = getattr(owner, p)
        setattr(owner, leaf, _field_value(path, factors, dims))
    return config


def _field_value(path: str, factors: str | list, dims: Mapping[str, int]) -> int:
    """One [port.fields] value: a dim, or the product of its factors (a dim, or `{isqrt = dim}`)."""
    value = 1
    for factor in factors if isinstance(factors, list) else [factors]:
        name = factor.get("isqrt") if isinstance(factor, dict) else factor
        if name not in dims:
            raise ConfigError(f"configs/n16.toml [port.fields] {path!r}: {factor!r} is not a dim of N1.6 (one of "
                              f"{', '.join(sorted(dims))})")
        value *= math.isqrt(dims[name]) if isinstance(factor, dict) else dims[name]
    return int(value)


def _traced_loader(code: PortCode, source_shapes: Mapping[str, list[int]], banks: set[str]):
    """The port's own weight loader, holding a traced tensor for every checkpoint key (its `load()` returns
    them: it reads no file)."""
    import torch

    traced = traced_class()
    loader = code.attr(str(N16.port["loader"]))()
    # The one private attribute of the port touched anywhere: common/weight_loader.py:57 keeps the loaded dict in
    # `_state_dict`, and `load()` (:61-62) returns it as it is once set, reading no file.
    loader._state_dict = {k: traced.make(torch.empty(shape, dtype=torch.bfloat16, device="meta"), (k,),
                                         bank=k in banks) for k, shape in source_shapes.items()}
    return loader, traced


def construct(code: PortCode, config, source_shapes: Mapping[str, list[int]], device, listing: Listing):
    """Run the port's own constructor on traced weights, each `from_torch` of one listed and answered with a
    placeholder."""
    loader, traced = _traced_loader(code, source_shapes, set(N16.embodiment_keys))
    model_class = code.attr(str(N16.port["model"]))
    with intercepted(listing, traced):
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


