"""An entry's chunks as tensors, in each form a consumer takes: torch on the host, ttnn on the host, ttnn on a device.

Every byte is checked against its manifest record before it is used. This module knows nothing of which entry,
or why: the caller (pipeline/jobs/load.py, pipeline/port_n16/) chooses the entry, holds its lease and owns the pool.
Uncompressed Zarr v3 chunks are raw bytes, so a local chunk is memory-mapped copy-on-write (the page cache's pages;
writes stay private) and an object-store chunk is fetched on its own.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from tasks.device import ttnn_edge as tt
from tasks.device import one_file, tensorbin
from tasks.entries.entry import Entry
from tasks.entries.manifest import Manifest
from tasks.errors import CacheError

Chunk = tuple[str, "int | None"]  # (array, slot): slot None is the whole array


def plan_reads(manifest: Manifest, slot: int | None) -> list[Chunk]:
    """Every chunk to read, in the manifest's order: whole arrays, and of each bank the slot asked for (None: every
    slot, each of which the entry must hold). For one embodiment a bank contributes about 1/32 of its bytes."""
    reads: list[Chunk] = []
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


def read_bytes(entry: Entry, chunks: list[Chunk], from_device_files: bool = False) -> int:
    """What reading these chunks reads: each chunk's bytes, or its device file's where one is read instead."""
    return sum(entry.device_file_size(n, s) if from_device_files and entry.has_device_file(n, s)
               else entry.manifest.arrays[n].chunks[s].nbytes for n, s in chunks)


def read_objects(entry: Entry, chunks: list[Chunk], from_device_files: bool = False) -> dict[str, int]:
    """The objects reading these chunks reads (`read_bytes`), key -> size: each chunk's, or its device file's."""
    objects = {}
    for name, slot in chunks:
        if from_device_files and entry.has_device_file(name, slot):
            objects[entry.device_object(name, slot)] = entry.device_file_size(name, slot)
        else:
            objects[entry.chunk_object(name, slot)] = entry.manifest.arrays[name].chunks[slot].nbytes
    return objects


def torch_tensors(entry: Entry, chunks: list[Chunk], every_slot: bool, pool: ThreadPoolExecutor) -> dict:
    """torch bf16 tensors by array name. `every_slot`: a bank becomes one `[slots, ...]` tensor, its slots read
    straight into one buffer (no stacking copy); else each chunk is its own tensor."""
    import torch  # lazy: 1-2 s to import, and `cache`/`convert` never need it

    arrays = entry.manifest.arrays
    banks = {n: np.empty([len(arrays[n].chunks)] + arrays[n].logical_shape, arrays[n].storage_dtype)
             for n, _ in chunks if every_slot and arrays[n].bank}
    read = pool.map(lambda c: entry.read_chunk(*c, banks[c[0]][c[1]] if c[0] in banks else None), chunks)
    buffers = {n: data for (n, _), data in zip(chunks, read) if n not in banks} | banks
    return {n: torch.from_numpy(buf).view(torch.bfloat16) for n, buf in buffers.items()}  # host tables: host_table


def host_table(entry: Entry, name: str, check_mapped: bool = False):
    """A host-only array (tt-n16: q_norm, k_norm, embed_tokens) as the port keeps it: a torch float32 tensor. Stored
    as float32 (converter 3 on), it is the chunk's private mapping itself, its file read and checked in full
    first: no copy, and embed_tokens' 1.24 GB cost no fresh memory. `check_mapped` hashes the mapping instead,
    which brings every page into memory (the port hand-off, as `device_tensors`). A table stored as bf16 (entries
    of converter 2) is widened block by block as it is read and checked, so 622 MB need 4 MB besides the result."""
    import torch

    arr = entry.manifest.arrays[name]
    if arr.storage_dtype == np.float32:
        return torch.from_numpy(entry.read_chunk(name, None) if check_mapped else entry.checked_chunk(name, None))
    out = torch.empty(arr.logical_shape, dtype=torch.float32)
    flat = out.view(-1)

    def widen(block: memoryview, pos: int) -> None:  # blocks of whole values (4 MiB)
        values = torch.frombuffer(block, dtype=torch.bfloat16)
        flat[pos // 2:pos // 2 + values.numel()].copy_(values)

    entry.each_chunk_block(name, None, widen)
    return out


def takes_device_files(device) -> bool:
    """Whether chunks with a `.tensorbin` come from it (ttnn's own file, as it stored it): on the host and on one
    device. A mesh takes everything from the bf16 chunks through `upload_array`, the one place that decides which
    targets are split across its devices."""
    return device is None or tt.mesh_size(device) == 1


def ttnn_tensors(entry: Entry, chunks: list[Chunk], pool: ThreadPoolExecutor, device=None) -> dict:
    """ttnn tensors by chunk in their device dtype and layout, on the host (`device` None) or on `device`: those
    with a `.tensorbin` straight from it (`device_tensors`), the rest converted from their bf16 chunk."""
    arrays = entry.manifest.arrays
    from_file = takes_device_files(device)
    packed = [c for c in chunks if from_file and entry.has_device_file(*c)]
    plain = [c for c in chunks if not (from_file and entry.has_device_file(*c))]
    out = dict(zip(packed, device_tensors(entry, packed, pool, device)))
    for (name, slot), data in zip(plain, pool.map(lambda c: entry.read_chunk(*c), plain)):
        arr = arrays[name]
        out[(name, slot)] = tensorbin.host_tensor(data, arr.device_dtype, arr.device_layout) if device is None else \
            tt.upload_array(data, arr.device_dtype, arr.device_layout, str(arr.attributes["kind"]), device)
    return {c: out[c] for c in chunks}


def device_tensors(entry: Entry, chunks: list[Chunk], pool: ThreadPoolExecutor, device=None,
                   check_mapped: bool = False) -> list:
    """ttnn's `load_tensor` of each chunk's `.tensorbin`, on the host or on `device`, every file read and checked
    against its record on the pool before ttnn opens the first, then loaded one by one (0.06 s for the 953 files
    of a one-embodiment N1.6). ttnn maps a host tensor's file lazily, so its pages come into memory, and count in
    RSS, only when used: such a reload peaks at 0.9 GB. Loading each file as soon as it was checked took longer
    (0.9-1.2 s against 0.5-0.6 s for the checks alone): ttnn's mappings and the other threads' reads wait for
    each other. `check_mapped` (host only) hashes the mapping ttnn made instead, for a caller that uses every
    byte at once (the port hand-off): each byte is read once, into memory, and the bytes checked are the very
    ones the tensor holds. On a device they go up one at a time."""
    arrays = entry.manifest.arrays
    load = lambda c, path, on=None: one_file.device_tensor(path, on) if arrays[c[0]].tiled else \
        tt.load_packed(path, on)  # noqa: E731
    if device is not None or not check_mapped:
        files = list(pool.map(lambda c: entry.device_file(*c), chunks))
        return [load(c, f, device) for c, f in zip(chunks, files)]
    paths = entry.device_paths(chunks)  # a missing file, or one of another size, is refused before ttnn opens it
    tensors = [load(c, p) for c, p in zip(chunks, paths)]
    mapped = tt.mapped_files(paths)

    def check(i: int) -> None:
        record, view = entry.device_record(*chunks[i]), mapped.get(paths[i])
        if view is None or len(view) < record.nbytes or not record.matches(view[:record.nbytes]):
            entry.device_file(*chunks[i])  # read and checked here: a bad file is refused by name

    list(pool.map(check, range(len(chunks))))
    return tensors
