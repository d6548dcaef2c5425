"""Comparing two built models, attribute by attribute and byte by byte; and the port's own way of building one."""

from __future__ import annotations

import inspect
import shutil
import tempfile
from pathlib import Path

from pipeline.port_n16.code import N16, PortCode


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
    were compared (ttnn, on_device, torch, values)."""
    scratch = Path(tempfile.mkdtemp(prefix="port-compare-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
    comparison = _Comparison(limit, counts if counts is not None else {}, scratch)
    try:
        comparison.walk(ours, theirs, "model")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return comparison.found


class _Comparison:
    """One walk of two models side by side: what differs (up to `limit`), and how many of each kind were compared."""

    def __init__(self, limit: int, tally: dict, scratch: Path):
        import torch
        import ttnn

        self.torch, self.ttnn = torch, ttnn  # imported once, not at every node of the walk
        self.limit, self.tally, self.scratch = limit, tally, scratch
        self.found: list[str] = []
        self.seen: set[tuple[int, int]] = set()
        for kind in ("ttnn", "on_device", "torch", "values"):
            tally.setdefault(kind, 0)

    def walk(self, a, b, path: str) -> None:
        torch, ttnn = self.torch, self.ttnn
        if len(self.found) >= self.limit or (id(a), id(b)) in self.seen:
            return
        self.seen.add((id(a), id(b)))
        if type(a) is not type(b) and not (isinstance(a, dict) and isinstance(b, dict)):
            self.found.append(f"{path}: {type(a).__name__} against {type(b).__name__}")
        elif isinstance(a, ttnn.Tensor):
            self._ttnn(a, b, path)
        elif isinstance(a, torch.Tensor):
            self._torch(a, b, path)
        elif isinstance(a, dict):
            if list(a) != list(b):
                self.found.append(f"{path}: keys {list(a)[:8]} against {list(b)[:8]}")
            for k in a:
                if k in b:
                    self.walk(a[k], b[k], f"{path}[{k!r}]")
        elif isinstance(a, (list, tuple)):
            if len(a) != len(b):
                self.found.append(f"{path}: {len(a)} items against {len(b)}")
            for i, (x, y) in enumerate(zip(a, b)):
                self.walk(x, y, f"{path}[{i}]")
        else:
            self._value_or_object(a, b, path)

    def _ttnn(self, a, b, path: str) -> None:
        ttnn = self.ttnn
        self.tally["ttnn"] += 1
        self.tally["on_device"] += a.storage_type() == ttnn.StorageType.DEVICE
        facts = lambda t: (t.dtype, t.layout, tuple(t.shape), tuple(t.padded_shape), t.storage_type(),  # noqa: E731
                           str(t.memory_config()) if t.storage_type() == ttnn.StorageType.DEVICE else None)
        if facts(a) != facts(b):
            self.found.append(f"{path}: {facts(a)} against {facts(b)}")
        elif _tensor_bytes(a, self.scratch) != _tensor_bytes(b, self.scratch):
            self.found.append(f"{path}: the bytes differ")

    def _torch(self, a, b, path: str) -> None:
        torch = self.torch
        self.tally["torch"] += 1
        if (a.dtype, tuple(a.shape)) != (b.dtype, tuple(b.shape)):
            self.found.append(f"{path}: {a.dtype} {list(a.shape)} against {b.dtype} {list(b.shape)}")
        elif a.is_meta or b.is_meta or not torch.equal(a.contiguous().view(torch.uint8) if a.dim() else a,
                                                       b.contiguous().view(torch.uint8) if b.dim() else b):
            self.found.append(f"{path}: the values differ")

    def _value_or_object(self, a, b, path: str) -> None:
        if isinstance(a, (str, bytes, int, float, bool, type(None))):
            self.tally["values"] += 1
            if a != b:
                self.found.append(f"{path}: {a!r} against {b!r}")
        elif inspect.isroutine(a) or inspect.isclass(a) or type(a).__module__.startswith("ttnn") or \
                not hasattr(a, "__dict__"):
            if a is not b and a != b:  # devices, functions, enums
                self.found.append(f"{path}: {a!r} against {b!r}")
        else:  # the port's objects, its config dataclasses, diffusers' Timesteps module
            keys_a, keys_b = sorted(vars(a)), sorted(vars(b))
            if keys_a != keys_b:
                self.found.append(f"{path}: attributes {sorted(set(keys_a) ^ set(keys_b))} on one side only")
            for k in keys_a:
                if k in vars(b):
                    self.walk(vars(a)[k], vars(b)[k], f"{path}.{k}")


def build_with_port(code: PortCode, snapshot: Path, config, device=None):
    """The port's own way, for comparison: its weight loader reads the snapshot and its constructors preprocess."""
    loader_class = code.attr(str(N16.port["loader"]))
    model_class = code.attr(str(N16.port["model"]))
    return model_class(config, loader_class(model_path=str(snapshot)), device)


