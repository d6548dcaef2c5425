"""What each fresh child process measures (`python -m bench --child NAME ARGS`); each prints one JSON object.
Imports happen inside each child function, so that none of them is timed and each child loads only what it needs."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path


def _child_allocate(a: dict) -> dict:
    """Touch `mb` megabytes and let go: the harness's own test of its peak-RSS figure (tests/test_commands.py)."""
    import numpy as np

    t0 = time.perf_counter()
    block = np.ones(int(a["mb"]) << 20, np.uint8)
    return {"seconds": time.perf_counter() - t0, "touched": int(block.sum())}


def _child_convert(a: dict) -> dict:
    """A cold convert: the parent emptied the cache root (bench/harness.py `remove`), so nothing is reused or hit."""
    from pipeline.jobs.convert import ConvertOptions, convert

    s = convert(ConvertOptions(a["version"], profile=a["profile"], hf_cache=Path(a["hf"]) if a.get("hf") else None,
                               cache_root=Path(a["cache"]), progress=False, scheduler=a.get("scheduler", "threads"),
                               workers=a.get("workers"), layout=a.get("layout", "generic"), synthetic=a.get("synthetic"),
                               snapshot=Path(a["snapshot"]) if a.get("snapshot") else None))
    return {"seconds": s["seconds"], "stage_seconds": s["stage_seconds"], "bytes": s["bytes_written"],
            "reused_chunks": s.get("reused_chunks", 0), "cache_path": s["cache_path"]}


def _child_raw_copy(a: dict) -> dict:
    """Baseline for convert: read every source byte and write as many bytes, with numpy, then sync (as publish does)."""
    import numpy as np

    out_dir = Path(a["scratch"])
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    total = 0
    for i, shard in enumerate(sorted(Path(a["snapshot"]).glob("*.safetensors"))):
        data = np.fromfile(shard, dtype=np.uint8)
        data.tofile(out_dir / f"copy-{i}.bin")
        total += data.nbytes
        del data
    os.sync()
    seconds = time.perf_counter() - t0
    for p in out_dir.glob("copy-*.bin"):
        p.unlink()
    return {"seconds": seconds, "bytes": total}


def _child_copy_changed(a: dict) -> dict:
    """The floor of a fine-tune's convert after its release: copy the files of its entry that it wrote itself (one
    link: not shared with the release's entry) into a fresh folder, made durable as publish makes them
    (tasks/entries/publish.py `fsync_tree`). A convert that writes what changed cannot take less."""
    import shutil

    from tasks.entries.publish import fsync_tree

    files = [p for p in sorted(Path(a["entry"]).rglob("*")) if p.is_file() and p.stat().st_nlink == 1]
    out_dir = Path(a["scratch"])
    out_dir.mkdir(parents=True)
    t0 = time.perf_counter()
    for i, f in enumerate(files):
        shutil.copyfile(f, out_dir / str(i))
    fsync_tree(out_dir)
    seconds = time.perf_counter() - t0
    total = sum(f.stat().st_size for f in files)
    shutil.rmtree(out_dir)
    return {"seconds": seconds, "bytes": total, "files": len(files)}


def _child_sha256(a: dict) -> dict:
    """The fine-tune's largest shard through hashlib's sha256, as `sha256sum` would: one stream cannot be split
    across cores, so no convert that records every shard's sha256 before it publishes is faster than this."""
    import hashlib

    path = max(Path(a["snapshot"]).glob("*.safetensors"), key=lambda p: p.stat().st_size)
    t0 = time.perf_counter()
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    return {"seconds": time.perf_counter() - t0, "bytes": path.stat().st_size, "sha256": digest}


def _child_load(a: dict) -> dict:
    import torch  # noqa: F401  (imports are not timed)

    from pipeline.jobs.load import load

    if a.get("ttnn_host"):
        from tasks.device.ttnn_edge import ttnn_module

        ttnn_module()

    t0 = time.perf_counter()
    w = load(a["version"], a["cache"], embodiment=a.get("embodiment"), profile=a.get("profile", "bf16"),
             into="ttnn" if a.get("ttnn_host") else "torch", layout=a.get("layout", "generic"))
    return {"seconds": time.perf_counter() - t0, "bytes": w.stats["bytes_read"], "tensors": w.stats["tensors"]}


def _entry_files(path: Path, packed: bool) -> list[Path]:
    from pipeline.cache import entry_at

    entry = entry_at(path)
    return [entry.store.path(entry.device_object(name, slot) if packed and rec.tensorbin else entry.chunk_object(name, slot))
            for name, arr in entry.manifest.arrays.items() for slot, rec in arr.chunks.items()]


def _child_raw_read(a: dict) -> dict:
    """Baseline for reload: readinto preallocated buffers of exactly the files a full reload reads, all kept."""
    import numpy as np

    files = _entry_files(Path(a["entry"]), a.get("packed", False))
    t0 = time.perf_counter()
    keep, total = [], 0
    for path in files:
        buf = np.empty(path.stat().st_size, np.uint8)
        with open(path, "rb", buffering=0) as fh:
            fh.readinto(buf)
        keep.append(buf)
        total += buf.nbytes
    return {"seconds": time.perf_counter() - t0, "bytes": total}


def _naive_targets(version: str, snapshot: Path, profile: str = "bf16"):
    """The GR00T port's path: load_file every shard into one dict, then transform every target, all 32 slots."""
    import torch
    from safetensors.torch import load_file

    from pipeline.model.recipe import build_plan

    index = json.loads((snapshot / "model.safetensors.index.json").read_text())
    state: dict = {}
    for shard in sorted(set(index["weight_map"].values())):
        state.update(load_file(str(snapshot / shard)))
    plan = build_plan(version, {k: tuple(v.shape) for k, v in state.items()}, profile, "generic")
    for t in plan.targets:
        src = [state[k] for k in t.sources]
        if t.transform in ("transpose", "flatten_transpose", "fuse_transpose"):
            x = torch.cat([s.reshape(s.shape[0], -1) for s in src]).T.contiguous()
        elif t.transform in ("row", "fuse_row"):
            x = torch.cat([s.reshape(-1) for s in src]).reshape(1, -1)
        elif t.transform == "slot_row":
            x = src[0].reshape(32, 1, -1)
        else:
            x = src[0]
        yield t, x


def _child_cat(a: dict) -> dict:
    """What the OS alone does with the same files: `cat` them to /dev/null (the ceiling raw_read is held to)."""
    import subprocess

    files = _entry_files(Path(a["entry"]), a.get("packed", False))
    t0 = time.perf_counter()
    subprocess.run(["cat", *map(str, files)], stdout=subprocess.DEVNULL, check=True)
    return {"seconds": time.perf_counter() - t0, "bytes": sum(p.stat().st_size for p in files)}


def _child_naive(a: dict) -> dict:
    import ttnn

    from tasks.device.ttnn_edge import configure_ttnn_env, device_present

    configure_ttnn_env(os.environ, device_present())
    t0 = time.perf_counter()
    n = 0
    for t, x in _naive_targets(a["version"], Path(a["snapshot"])):
        layout = ttnn.TILE_LAYOUT if t.layout == "TILE" else ttnn.ROW_MAJOR_LAYOUT
        ttnn.from_torch(x, dtype=ttnn.bfloat16, layout=layout)
        n += 1
    return {"seconds": time.perf_counter() - t0, "tensors": n}


def _child_as_tensor(a: dict) -> dict:
    """tt-metal's cache: `ttnn.as_tensor(cache_file_name=…)` per target (first run converts, later runs load)."""
    import ttnn

    from tasks.device.ttnn_edge import configure_ttnn_env, device_present

    configure_ttnn_env(os.environ, device_present())
    cache_dir = Path(a["cache_dir"])
    cache_dir.mkdir(parents=True, exist_ok=True)  # the parent removed the last run's (bench/harness.py `remove`)
    t0 = time.perf_counter()
    touched = 0
    dtypes = {"bfloat16": ttnn.bfloat16, "bfloat8_b": ttnn.bfloat8_b}
    targets = _naive_targets(a["version"], Path(a["snapshot"]), a["profile"]) if a["first"] else _targets_only(a)
    for t, x in targets:
        layout = ttnn.TILE_LAYOUT if t.layout == "TILE" else ttnn.ROW_MAJOR_LAYOUT
        dtype = dtypes[t.device_dtype]
        ttnn.as_tensor(x, dtype=dtype, layout=layout, cache_file_name=str(cache_dir / t.name))
    if not a["first"]:  # the touch pass: load_tensor maps its file, so read every byte as an upload would — the
        import numpy as np  # same way our reload does: hash a read-only map of the file
        import xxhash

        for path in cache_dir.glob("*.tensorbin"):
            data = np.memmap(path, dtype=np.uint8, mode="r")
            xxhash.xxh3_64_hexdigest(data)
            touched += data.nbytes
    return {"seconds": time.perf_counter() - t0, "bytes": touched}


def _targets_only(a: dict):
    """Warm as_tensor runs: the tensor argument is never read on a cache hit, so pass an empty placeholder
    (what tt-metal model code does with `cache_file_name` and dummy weights)."""
    import torch

    from pipeline.model.state_dict import tensor_specs
    from pipeline.model.recipe import build_plan

    plan = build_plan(a["version"], {s.key: s.shape for s in tensor_specs(a["version"], a["scale"])}, a["profile"], "generic")
    empty = torch.empty(0, dtype=torch.bfloat16)
    for t in plan.targets:
        yield t, empty


def _child_plain_loop(a: dict) -> dict:
    """The Dask-overhead baseline: a convert whose graph (the one `build_graph` makes, the same wiring) is run by a
    plain loop on one thread, each task once its inputs are computed, as Dask's `get_sync` orders them, instead of
    by a Dask scheduler."""
    import pipeline.jobs.build_entry
    from pipeline.jobs.convert import ConvertOptions, convert
    from pipeline.jobs.graph import dependencies

    def in_order(graph, key, *_, **__):
        deps, values, order, seen = dependencies(graph), {}, [], set()
        todo = [(key, False)]
        while todo:  # depth first, each task after its dependencies
            k, ready = todo.pop()
            if ready:
                order.append(k)
            elif k not in seen:
                seen.add(k)
                todo.append((k, True))
                todo.extend((d, False) for d in sorted(deps[k], key=str, reverse=True) if d not in seen)
        for k in order:
            values[k] = graph[k]({d: values[d] for d in deps[k]})
        return values[key], {"stage_seconds": {}, "stage_tasks": {}}

    scheduled, pipeline.jobs.build_entry.run = pipeline.jobs.build_entry.run, in_order
    try:
        s = convert(ConvertOptions(a["version"], hf_cache=Path(a["hf"]) if a.get("hf") else None,
                                   snapshot=Path(a["snapshot"]) if a.get("snapshot") else None,
                                   cache_root=Path(a["cache"]), layout="generic", profile=a.get("profile"),
                                   synthetic=a.get("synthetic"), progress=False))
    finally:
        pipeline.jobs.build_entry.run = scheduled
    return {"seconds": s["seconds"], "cache_path": s["cache_path"]}


def _port_tensors(a: dict):
    """The port's own load path (devkit/port_oracle.py, written from its files): `load_file` every shard, then its
    preprocessing of every weight, all 32 slots; yields (file name, tensor, dtype)."""
    from pipeline.model.recipe import build_plan
    from pipeline.model.state_dict import dims_of
    from pipeline.model.versions import load_config
    from devkit.port_oracle import hf_state, port_oracle

    state = hf_state(Path(a["snapshot"]))
    shapes = {k: tuple(v.shape) for k, v in state.items()}
    dims = dict(dims_of(load_config(a["version"]), shapes))
    plan = a.get("plan", "port")  # another dtype plan: each tensor in the dtype our plan gives it (same names)
    dtype_of = {t.name: t.device_dtype for t in build_plan(a["version"], shapes, plan, "tt-n16").targets}
    for name, (x, dtype) in port_oracle(state, dims, range(dims["embodiments"])).items():
        dtype = dtype if dtype == "host" or plan == "port" else dtype_of[name]
        for i, one in enumerate(x) if isinstance(x, list) else ((None, x),):
            yield name if i is None else f"{name}@{i}", one, dtype


def _child_port_path(a: dict) -> dict:
    """What the port's constructors do, host only: every device tensor through `ttnn.from_torch` in its dtype."""
    import ttnn

    from tasks.device.ttnn_edge import configure_ttnn_env, device_present

    configure_ttnn_env(os.environ, device_present())
    t0 = time.perf_counter()
    n = 0
    for _, x, dtype in _port_tensors(a):
        if dtype != "host":  # host tensors are float32 torch tensors already
            ttnn.from_torch(x, dtype=getattr(ttnn, dtype), layout=ttnn.TILE_LAYOUT)
        n += 1
    return {"seconds": time.perf_counter() - t0, "tensors": n}


def _child_as_tensor_port(a: dict) -> dict:
    """The port's tensors through tt-metal's cache, `ttnn.as_tensor(cache_file_name=…)`: the first run converts
    and writes `.tensorbin` files, a warm run loads them (placeholder inputs, as model code passes on a hit) and
    reads every byte once through a read-only map."""
    import numpy as np
    import torch
    import ttnn
    import xxhash

    from tasks.device.ttnn_edge import configure_ttnn_env, device_present

    configure_ttnn_env(os.environ, device_present())
    cache_dir = Path(a["cache_dir"])
    cache_dir.mkdir(parents=True, exist_ok=True)  # the parent removed the last run's (bench/harness.py `remove`)
    t0 = time.perf_counter()
    touched = n = 0
    if a["first"]:
        tensors = _port_tensors(a)
    else:  # device tensors from the cache; the port's host tensors (embed_tokens, q/k_norm) from the checkpoint
        from safetensors import safe_open

        names = json.loads((cache_dir / "names.json").read_text())
        empty = torch.empty(0, dtype=torch.bfloat16)
        tensors = ((name, empty, dtype) for name, dtype in names)
        index = json.loads((Path(a["snapshot"]) / "model.safetensors.index.json").read_text())
        host = [k for k in index["weight_map"] if k.endswith(("embed_tokens.weight", "q_norm.weight", "k_norm.weight"))
                and "language_model" in k]
        for key in host:
            with safe_open(str(Path(a["snapshot"]) / index["weight_map"][key]), "pt") as f:
                f.get_tensor(key).to(torch.float32)
            n += 1
    written = []
    for name, x, dtype in tensors:
        n += 1
        if dtype == "host":
            continue
        ttnn.as_tensor(x, dtype=getattr(ttnn, dtype), layout=ttnn.TILE_LAYOUT, cache_file_name=str(cache_dir / name))
        written.append((name, dtype))
    if a["first"]:
        (cache_dir / "names.json").write_text(json.dumps(written))
    else:
        for path in cache_dir.glob("*.tensorbin"):
            data = np.memmap(path, dtype=np.uint8, mode="r")
            xxhash.xxh3_64_hexdigest(data)
            touched += data.nbytes
    return {"seconds": time.perf_counter() - t0, "bytes": touched, "tensors": n}


def _child_zarr_io(a: dict) -> dict:
    """Our Zarr v3 writer/reader against zarr-python's on the same arrays (every bf16 array of an entry, whole
    banks): write timed per array with its data already in memory, then read it all back. `impl` is ours or
    zarr-python; both write uncompressed uint16 chunks of the same shapes."""
    import shutil

    import numpy as np
    import zarr

    from pipeline.cache import entry_at
    from tasks.entries.names import chunk_coords
    from tasks.entries.store import LocalStore
    from tasks.entries.zarr_v3 import chunk_path, write_chunk

    entry, out = entry_at(Path(a["entry"])), Path(a["scratch"])
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    arrays = entry.manifest.arrays
    write = read = 0.0
    total = 0
    group = zarr.open_group(str(out), mode="w", zarr_format=3) if a["impl"] == "zarr-python" else None
    for name, arr in arrays.items():
        ndim = len(arr.logical_shape)
        chunks = {slot: np.fromfile(entry.store.path(entry.chunk_object(name, slot)), np.uint16).reshape(arr.chunk_shape)
                  for slot in arr.chunks}
        total += sum(c.nbytes for c in chunks.values())
        t0 = time.perf_counter()
        if group is not None:
            z = group.create_array(name, shape=arr.shape, chunks=arr.chunk_shape, dtype="uint16",
                                   compressors=None, filters=None, fill_value=0)
            for slot, data in chunks.items():
                z[(slice(slot, slot + 1),) if slot is not None else ...] = data
        else:
            (out / name).mkdir()
            for slot, data in chunks.items():
                write_chunk(out / name, chunk_coords(ndim, slot), data)
        write += time.perf_counter() - t0
        t0 = time.perf_counter()
        for slot, data in chunks.items():
            back = np.empty_like(data)
            if group is not None:
                back[...] = group[name][(slice(slot, slot + 1),) if slot is not None else ...]
            else:
                LocalStore(out).read_into(chunk_path(Path(name), chunk_coords(ndim, slot)).as_posix(), back)
        read += time.perf_counter() - t0
    shutil.rmtree(out, ignore_errors=True)
    return {"seconds": write + read, "write_seconds": write, "read_seconds": read, "bytes": total}


PORT_TREE = Path(__file__).resolve().parents[2] / "shared" / "consumers" / "tt-metal"


def _child_port_startup(a: dict) -> dict:
    """The port's own start-up, as its demo runs it on the host (device None): its weight loader reads every shard
    (safetensors `load_file`) and its constructors preprocess every weight, all 32 slots, through from_torch."""
    from tasks.device.ttnn_edge import configure_ttnn_env, device_present

    configure_ttnn_env(os.environ, device_present())
    from pipeline.port_n16 import PortCode, build_with_port, port_config, shapes_of

    code = PortCode.find(a.get("tt_metal", PORT_TREE))
    config = port_config(code, shapes_of(Path(a["snapshot"])))  # at the published dims: Gr00tN16Config.default()
    code.attr("tt.ttnn_groot_n16_model:Gr00tN16ModelTTNN")  # imported before the clock starts, like ours
    import diffusers.models.embeddings  # noqa: F401  (its constructor imports it: not timed, for either)

    t0 = time.perf_counter()
    build_with_port(code, Path(a["snapshot"]), config)
    return {"seconds": time.perf_counter() - t0}


def _child_handoff(a: dict) -> dict:
    """Ours: the port's model from the cache entry (pipeline/port_n16.build_model), on the host or the simulated
    device. Every tensor is read into memory (ttnn's load_tensor), as the port's are. `check` (default on, as
    `build_model`'s): hold the port revision to its own constructor first (once per revision: the verdict is kept,
    so only a cache without it pays)."""
    if a.get("simulated"):
        from devkit import simulator

        assert simulator.use(os.environ), simulator.unavailable_reason()
    from tasks.device.ttnn_edge import configure_ttnn_env, device_present

    configure_ttnn_env(os.environ, device_present())
    from pipeline.port_n16 import PortCode, build_model

    code = PortCode.find(a.get("tt_metal", PORT_TREE))
    code.attr("tt.ttnn_groot_n16_model:Gr00tN16ModelTTNN")
    import diffusers.models.embeddings  # noqa: F401  (imported by the port's constructor: not timed, for either)

    dev = None
    if a.get("simulated"):
        from tasks.device import ttnn_edge

        dev = ttnn_edge.open_device(0)
    t0 = time.perf_counter()
    built = build_model(Path(a["cache"]), code.root, dev, check=a.get("check", True))
    seconds = time.perf_counter() - t0
    if dev is not None:
        ttnn_edge.close_device(dev)
    return {"seconds": seconds, **{k: v for k, v in built.stats.items() if k != "seconds"}}


CHILDREN = {f.__name__[len("_child_"):]: f for f in (_child_allocate, _child_port_startup, _child_handoff, _child_convert, _child_raw_copy, _child_copy_changed, _child_sha256, _child_load, _child_raw_read, _child_cat,
                                                     _child_naive, _child_as_tensor, _child_plain_loop,
                                                     _child_port_path, _child_as_tensor_port, _child_zarr_io)}


