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
    were compared (ttnn, on_device, torch, values). (Over 60 lines: one walk with one case per kind of value,
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
        shutil.rmtree(scratch, ignore_errors=True)
    return found


def build_with_port(code: PortCode, snapshot: Path, config, device=None):
    """The port's own way, for comparison: its weight loader reads the snapshot and its constructors preprocess."""
    loader_class = code.attr(str(N16.port["loader"]))
    model_class = code.attr(str(N16.port["model"]))
    return model_class(config, loader_class(model_path=str(snapshot)), device)


