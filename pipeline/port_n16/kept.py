"""Kept models: what the port's constructors built on traced weights, kept per port revision and entry, so that a start
after the first skips the tracing (0.13-0.20 s for the full N1.6 here) and goes straight to the files.

It is written as data, never as a pickle (a pickle is code run at load): one JSON document of the model's object
graph and one file of the torch tensors the port computed itself (RoPE tables, the causal mask before its
`from_torch`). Objects are rebuilt as `cls.__new__(cls)` with their `__dict__` set, and only classes of the port's
own package or diffusers' torch modules are rebuilt; anything else the walk meets (a ttnn object the port made some
other way, an object with slots) means this port revision's model is not kept, and every start traces it.

The JSON file starts with the xxh3 of the rest, and holds the tensor file's; a kept model whose files do not match,
do not parse or name what the walk would not have written is not used, and the model is traced and kept again. The
name is a hash of everything that decides the model: the port's revision, the entry (named by its content, recipes
included), whether it goes to a device, and this module's and trace.py's own code.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
from collections import OrderedDict
from dataclasses import asdict
from pathlib import Path
from typing import Any

import xxhash

from pipeline.port_n16.code import PortCode
from pipeline.port_n16.trace import Listing, Pending, Request, traced_class
from tasks.io.bulk_write import write_bytes_atomic
from tasks.entries.names import PORT_MODELS

KEPT_FORMAT = 1
PRIMITIVES = (str, int, float, bool, type(None))


class NotKept(Exception):
    """The model holds something this format does not write, or a kept file is not what was written."""


@functools.cache
def _own_code() -> bytes:
    """This module's and trace.py's source: what they write and read is theirs (read once per process)."""
    return b"".join(Path(__file__).with_name(n).read_bytes() for n in ("kept.py", "trace.py"))


def kept_path(root: Path, code: PortCode, entry: str, on_device: bool) -> Path:
    """`<cache>/port-models/<entry>/<key>.json` (its tensors beside it as `.bin`): removed with its entry."""
    key = hashlib.sha256(f"{KEPT_FORMAT}\0{code.revision}\0{entry}\0{on_device}\0".encode() + _own_code())
    return root / PORT_MODELS / entry / f"{code.revision}-{key.hexdigest()[:20]}.json"


class _Writer:
    """The object graph as a table of nodes; a value is a JSON primitive, {"$": node} or {"p": request index}."""

    def __init__(self, code: PortCode, traced: type, listing: Listing, device) -> None:
        self.code, self.traced, self.device = code, traced, device
        self.made = {id(m.result): m for m in listing.made}
        self.nodes: list = []
        self.index: dict[int, int] = {}
        self.blobs: list[bytes] = []
        self.offset = 0
        self.alive: list = []  # what was indexed by id stays alive until the walk ends

    def value(self, v) -> Any:
        if type(v) is Pending:
            return {"p": v.index}
        if type(v) in PRIMITIVES:  # exactly: an IntEnum or a str subclass is an object to rebuild, not a value
            return v
        if id(v) in self.index:
            return {"$": self.index[id(v)]}
        at = self.index[id(v)] = len(self.nodes)
        self.alive.append(v)
        self.nodes.append(None)
        self.nodes[at] = self.node(v)
        return {"$": at}

    def node(self, v) -> list:
        import torch

        if v is self.device and v is not None:
            return ["device"]
        if type(v) in (dict, OrderedDict):
            pairs = [[self.value(k), self.value(x)] for k, x in v.items()]
            return ["odict" if type(v) is OrderedDict else "dict", pairs]
        if type(v) in (list, tuple):
            return [type(v).__name__, [self.value(x) for x in v]]
        if type(v) is set and all(type(x) in PRIMITIVES for x in v):
            return ["set", sorted(v, key=repr)]
        if isinstance(v, self.traced):
            return ["traced", {"sources": list(v.sources), "slot": v.slot, "bank": v.bank, "ops": list(v.ops),
                               "shape": list(v.shape), "dtype": str(v.dtype).removeprefix("torch.")}]
        if type(v) is torch.Tensor and v.device.type == "cpu" and not v.requires_grad:
            return ["tensor", self.tensor(v)]
        if id(v) in self.made:
            m = self.made[id(v)]
            return ["made", {"tensor": self.value(m.tensor), "dtype": m.dtype, "layout": m.layout,
                             "on_device": m.on_device, "dram": m.dram}]
        cls = type(v)
        slots = any("__slots__" in k.__dict__ for k in cls.__mro__ if k is not object)  # values outside __dict__
        if _rebuildable(cls, self.code) and not slots and hasattr(v, "__dict__"):
            attributes = [[k, self.value(x)] for k, x in vars(v).items()]
            return ["object", [f"{cls.__module__}:{cls.__qualname__}", attributes]]
        raise NotKept(f"{cls.__module__}.{cls.__qualname__}")

    def tensor(self, t) -> dict:
        import torch

        data = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        spec = {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "offset": self.offset,
                "nbytes": len(data)}
        self.blobs.append(data)
        self.offset += len(data)
        return spec


def _rebuildable_module(module: str, code: PortCode) -> bool:
    return module.startswith(code.package + ".") or module.startswith("diffusers.")


def _rebuildable(cls: type, code: PortCode) -> bool:
    """A class of the port's own package, or one of diffusers' torch modules (`Timesteps`)."""
    import torch

    if "<locals>" in cls.__qualname__ or not _rebuildable_module(cls.__module__, code):
        return False
    return cls.__module__.startswith(code.package + ".") or issubclass(cls, torch.nn.Module)


def keep(path: Path, code: PortCode, model, traced: type, listing: Listing, device) -> bool:
    """Write the traced model and its listing; False (nothing written) when it holds what this format does not."""
    writer = _Writer(code, traced, listing, device)
    try:
        root = writer.value(model)
    except Exception:  # noqa: BLE001 (NotKept, or a value torch will not give as bytes): this start traced, as before
        return False
    blob = b"".join(writer.blobs)
    body = json.dumps({"format": KEPT_FORMAT, "revision": code.revision, "root": root, "nodes": writer.nodes,
                       "requests": [asdict(r) for r in listing.requests], "bin_xxh3": xxhash.xxh3_64_hexdigest(blob)},
                      separators=(",", ":")).encode()
    write_bytes_atomic(path.with_suffix(".bin"), blob)
    write_bytes_atomic(path, xxhash.xxh3_64_hexdigest(body).encode() + b"\n" + body)  # last: it names the .bin's hash
    return True


def restore(path: Path, code: PortCode, device) -> tuple[Any, type, Listing]:
    """The model, its Traced class and its listing as `trace.construct` returned them when it was kept. Raises
    NotKept for a file that is missing, damaged, or names what `keep` would not have written."""
    try:
        head, _, body = path.read_bytes().partition(b"\n")
        if head.decode() != xxhash.xxh3_64_hexdigest(body):
            raise NotKept("damaged")
        doc = json.loads(body)
        blob = _mapped_whole(path.with_suffix(".bin"))
    except (OSError, ValueError) as e:
        raise NotKept(str(e)) from None
    if doc.get("format") != KEPT_FORMAT or doc.get("revision") != code.revision or \
            xxhash.xxh3_64_hexdigest(blob) != doc.get("bin_xxh3"):
        raise NotKept("damaged")
    reader = _Reader(code, doc["nodes"], blob, device)
    try:
        model = reader.value(doc["root"])
        requests = [Request(**{**r, "sources": tuple(r["sources"]), "shape": tuple(r["shape"])})
                    for r in doc["requests"]]
    except Exception as e:  # noqa: BLE001 (whatever a file that checks yet does not rebuild raises: trace instead)
        raise NotKept(f"{type(e).__name__}: {e}") from None
    return model, reader.traced, Listing(requests=requests)


def _mapped_whole(path: Path):
    """The file as a private copy-on-write mapping: the tensors are views of it (23 MB for the full N1.6: its RoPE
    tables). The page cache's pages, not fresh memory, which this VM hands out at 30-70 ms for 23 MB (as
    LocalStore.map); writes stay private."""
    import numpy as np

    if path.stat().st_size == 0:
        return np.empty(0, np.uint8)
    return np.memmap(path, dtype=np.uint8, mode="c")


class _Reader:
    def __init__(self, code: PortCode, nodes: list, blob: bytes, device) -> None:
        self.code, self.nodes, self.blob, self.device = code, nodes, blob, device
        self.built: dict[int, Any] = {}
        self.traced = traced_class()

    def value(self, v) -> Any:
        if type(v) is dict:
            if "p" in v:
                return Pending(int(v["p"]))
            at = int(v["$"])
            return self.built[at] if at in self.built else self.node(at)
        if type(v) not in PRIMITIVES:
            raise ValueError(f"a value of type {type(v).__name__}")
        return v

    def node(self, at: int) -> Any:
        """Node `at`, built once; containers and objects are registered before their contents (cycles)."""
        import torch
        import ttnn

        kind, spec = (self.nodes[at] + [None])[:2]
        if kind == "device":
            out = self.device
        elif kind in ("dict", "odict"):
            out = self.built[at] = OrderedDict() if kind == "odict" else {}
            out.update((self.value(k), self.value(x)) for k, x in spec)
        elif kind == "list":
            out = self.built[at] = []
            out.extend(self.value(x) for x in spec)
        elif kind == "tuple":
            out = tuple(self.value(x) for x in spec)
        elif kind == "set":
            out = set(spec)
        elif kind == "traced":
            meta = torch.empty(spec["shape"], dtype=getattr(torch, spec["dtype"]), device="meta")
            out = self.traced.make(meta, spec["sources"], spec["slot"], spec["bank"], spec["ops"])
        elif kind == "tensor":
            dtype, offset, nbytes = getattr(torch, spec["dtype"]), int(spec["offset"]), int(spec["nbytes"])
            if offset < 0 or offset + nbytes > len(self.blob):
                raise ValueError(f"a tensor at bytes {offset}-{offset + nbytes} of {len(self.blob)}")
            flat = torch.frombuffer(self.blob, dtype=torch.uint8, count=nbytes, offset=offset) if nbytes else \
                torch.empty(0, dtype=torch.uint8)
            out = flat.view(dtype).reshape(spec["shape"])  # a view of the file's buffer, not a copy
        elif kind == "made":
            out = ttnn.from_torch(self.value(spec["tensor"]), dtype=getattr(ttnn.DataType, spec["dtype"]),
                                  layout=getattr(ttnn.Layout, spec["layout"]),
                                  device=self.device if spec["on_device"] else None,
                                  memory_config=ttnn.DRAM_MEMORY_CONFIG if spec["dram"] else None)
        elif kind == "object":
            module, _, name = spec[0].partition(":")
            refused = ValueError(f"{spec[0]} is not a class the port's model is rebuilt from")
            if not _rebuildable_module(module, self.code):  # checked before the import: nothing else is imported
                raise refused
            cls = importlib.import_module(module)
            for part in name.split("."):
                cls = getattr(cls, part)
            if not isinstance(cls, type) or not _rebuildable(cls, self.code):
                raise refused
            out = self.built[at] = cls.__new__(cls)
            out.__dict__.update((k, self.value(x)) for k, x in spec[1])
        else:
            raise ValueError(f"node kind {kind!r}")
        self.built[at] = out
        return out
