"""The reload contract (tasks/entries/reload.py), without a convert: an entry written here by hand comes back in each form,
equal to the values written (torch bf16 read back plainly, ttnn's own `dump_tensor` files), and a damaged byte is
refused by name before it is used."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
import xxhash

from tasks.entries import entry as fmt, manifest, names
from tasks.entries import reload
from tasks.errors import CacheError
from tasks.entries.object_stores import FsspecStore
from tasks.entries.store import LocalStore

ttnn = pytest.importorskip("ttnn")

NAME = "n16-tt-n16-port-" + "ab" * 10
SLOTS = 32


def _bf16(shape, seed: int) -> np.ndarray:
    """bf16 values as the raw uint16 an entry stores, from torch's own bf16 rounding."""
    values = torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
    return values.view(torch.int16).numpy().view("<u2")


def _record(data: bytes) -> dict:
    return {"nbytes": len(data), "xxh3": xxhash.xxh3_64_hexdigest(data)}


def _write_entry(root: Path) -> dict[str, np.ndarray]:
    """Four arrays: `w` [32, 64] with the `.tensorbin` ttnn dumps for it (bf16, TILE); `r` [3, 5], ROW_MAJOR and no
    device file; `h` [4, 8], host-only; `b`, a bank of 32 slots of [2, 32]. Returns the values written."""
    entry = root / "entries" / NAME
    values = {"w": _bf16((32, 64), 1), "r": _bf16((3, 5), 2), "h": _bf16((4, 8), 3), "b": _bf16((SLOTS, 2, 32), 4)}
    arrays = {}
    for name, layout, host_only in (("w", "TILE", False), ("r", "ROW_MAJOR", False), ("h", "ROW_MAJOR", True)):
        (entry / name).mkdir(parents=True)
        (entry / name / "c.0.0").write_bytes(values[name].tobytes())
        chunk = _record(values[name].tobytes()) | {"max_abs_err": 0.0, "pcc": 1.0}
        if name == "w":
            (entry / "tensorbin").mkdir()
            path = entry / "tensorbin" / "w.tensorbin"
            host = torch.from_numpy(values["w"].view(np.int16)).view(torch.bfloat16)
            ttnn.dump_tensor(str(path), ttnn.from_torch(host, dtype=ttnn.bfloat16, layout=ttnn.TILE_LAYOUT))
            chunk["tensorbin"] = _record(path.read_bytes())
        arrays[name] = {"shape": list(values[name].shape), "chunk_shape": list(values[name].shape),
                        "attributes": _attributes(list(values[name].shape), False, layout, host_only),
                        "source_xxh3": {name: "1"}, "content_id": name, "chunks": {"all": chunk}}
    (entry / "b").mkdir()
    for s in range(SLOTS):
        (entry / "b" / f"c.{s}.0.0").write_bytes(values["b"][s].tobytes())
    arrays["b"] = {"shape": [SLOTS, 2, 32], "chunk_shape": [1, 2, 32],
                   "attributes": _attributes([2, 32], True, "TILE", False), "source_xxh3": {"b": "1"},
                   "content_id": "b", "chunks": {str(s): _record(values["b"][s].tobytes()) | {"max_abs_err": 0.0,
                                                                                               "pcc": 1.0}
                                                 for s in range(SLOTS)}}
    manifest = {
        "fingerprint": "ab" * 10 + "0" * 44, "cache_format": names.CACHE_FORMAT, "converter": "1", "version": "n16",
        "revision": None, "synthetic": None, "layout": "tt-n16", "profile": "port", "shards": {"s": "0" * 64},
        "recipes_sha256": "0" * 64, "slots": list(range(SLOTS)), "source": {}, "source_shapes": {},
        "published_unix": 1.0, "arrays": arrays, "bytes": 0, "chunks": 3 + SLOTS}
    (entry / "MANIFEST.json").write_text(json.dumps(manifest))
    return values


def _attributes(logical: list[int], bank: bool, layout: str, host_only: bool) -> dict:
    return {"logical_shape": logical, "embodiment_bank": bank, "device_dtype": "bfloat16", "device_layout": layout,
            "host_only": host_only, "sources": ["k"], "transform": "identity", "dtype": "bfloat16", "kind": "matmul"}


@pytest.fixture
def written(tmp_path):
    values = _write_entry(tmp_path)
    with ThreadPoolExecutor(2) as pool:
        yield fmt.open_entry(LocalStore(tmp_path), NAME), values, pool


def _plain(values: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(values.view(np.int16)).view(torch.bfloat16)


def test_the_plan_reads_whole_arrays_and_the_slot_asked_for(written):
    entry, _, _ = written
    assert reload.plan_reads(entry.manifest, 9) == [("w", None), ("r", None), ("h", None), ("b", 9)]
    assert reload.plan_reads(entry.manifest, None)[3:] == [("b", s) for s in range(SLOTS)]


def test_a_slot_the_entry_lacks_is_refused_with_the_slots_it_holds(written):
    entry, _, _ = written
    del entry.manifest.arrays["b"].chunks[5]  # as if slot 5 was never converted
    with pytest.raises(CacheError, match=r"b: embodiment slot 5 was not converted into this entry .*convert with "
                                         r"--embodiments 5 or all"):
        reload.plan_reads(entry.manifest, None)
    assert reload.plan_reads(entry.manifest, 6)[-1] == ("b", 6)


def test_torch_tensors_are_the_values_written(written):
    entry, values, pool = written
    one = reload.torch_tensors(entry, reload.plan_reads(entry.manifest, 9), False, pool)
    assert torch.equal(one["w"], _plain(values["w"])) and torch.equal(one["b"], _plain(values["b"][9]))
    every = reload.torch_tensors(entry, reload.plan_reads(entry.manifest, None), True, pool)
    assert every["b"].shape == (SLOTS, 2, 32) and torch.equal(every["b"], _plain(values["b"]))


def test_a_host_table_is_the_bf16_values_in_float32(written):
    entry, values, _ = written
    table = reload.host_table(entry, "h")
    assert table.dtype == torch.float32 and torch.equal(table, _plain(values["h"]).float())


@pytest.mark.parametrize("check_mapped", [False, True], ids=["read-then-mapped", "checked-where-mapped"])
def test_a_float32_host_table_is_its_chunk_mapped_privately_and_checked(written, check_mapped):
    entry, values, _ = written
    wide = _plain(values["h"]).float()  # what converter 3 stores: the float32 the port keeps
    chunk, data = entry.path / "h" / "c.0.0", wide.numpy().tobytes()
    chunk.write_bytes(data)
    arr = entry.manifest.arrays["h"]
    arr.attributes["dtype"] = "float32"
    arr.chunks[None] = manifest.ChunkRecord(len(data), xxhash.xxh3_64_hexdigest(data))
    table = reload.host_table(entry, "h", check_mapped)
    assert table.dtype == torch.float32 and torch.equal(table, wide)
    table += 1  # the port's copy is its own: the entry's file keeps its bytes
    assert chunk.read_bytes() == data
    chunk.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(CacheError, match="h: chunk all does not match its manifest checksum"):
        reload.host_table(entry, "h", check_mapped)


def test_ttnn_host_tensors_come_from_the_device_file_or_the_chunk(written):
    entry, values, pool = written
    out = reload.ttnn_tensors(entry, [("w", None), ("r", None), ("b", 3)], pool)
    assert list(out) == [("w", None), ("r", None), ("b", 3)]
    assert (out[("w", None)].layout, out[("r", None)].layout) == (ttnn.TILE_LAYOUT, ttnn.ROW_MAJOR_LAYOUT)
    for (name, slot), tensor in out.items():
        want = _plain(values[name] if slot is None else values[name][slot])
        assert tensor.dtype == ttnn.bfloat16 and torch.equal(ttnn.to_torch(tensor), want), name
    assert reload.read_bytes(entry, [("w", None)], from_device_files=True) == \
        (entry.path / "tensorbin" / "w.tensorbin").stat().st_size
    assert reload.read_bytes(entry, [("w", None), ("b", 3)]) == values["w"].nbytes + values["b"][3].nbytes


@pytest.mark.parametrize("check_mapped", [False, True], ids=["read-then-loaded", "checked-where-mapped"])
@pytest.mark.parametrize("damage", ["flipped", "truncated", "missing"])
def test_a_damaged_device_file_is_refused_by_name_before_ttnn_uses_it(written, damage, check_mapped):
    entry, values, pool = written
    (sound,) = reload.device_tensors(entry, [("w", None)], pool, check_mapped=check_mapped)
    assert torch.equal(ttnn.to_torch(sound), _plain(values["w"]))
    path = entry.path / "tensorbin" / "w.tensorbin"
    data = bytearray(path.read_bytes())
    if damage == "flipped":
        data[-1] ^= 1
        path.write_bytes(bytes(data))
    elif damage == "truncated":
        path.write_bytes(bytes(data[:-1]))
    else:
        path.unlink()
    with pytest.raises(CacheError, match="w.tensorbin: device file [(]what ttnn loads[)] (does not match its manifest checksum|listed in "
                                         "the manifest is missing)"):
        reload.device_tensors(entry, [("w", None)], pool, check_mapped=check_mapped)


@pytest.mark.parametrize("damage", ["flipped", "truncated", "missing"])
def test_an_object_stores_damaged_device_file_is_refused_by_name_too(tmp_path, damage):
    """The same entry in an object store: each `.tensorbin` is fetched into a local file for ttnn, and one that is
    short, missing or changed is refused by name before ttnn opens it (the hand-off's read path); a tensor loaded
    from an earlier fetch keeps its bytes (ttnn maps its file: a fetch rewriting that file in place changed them)."""
    values = _write_entry(tmp_path / "local")
    store = FsspecStore(f"memory://{tmp_path.name}")
    store.put_many({f.relative_to(tmp_path / "local").as_posix(): f.read_bytes()
                    for f in (tmp_path / "local").rglob("*") if f.is_file()})
    entry = fmt.open_entry(store, NAME)
    with ThreadPoolExecutor(2) as pool:
        (sound,) = reload.device_tensors(entry, [("w", None)], pool, check_mapped=True)
        assert torch.equal(ttnn.to_torch(sound), _plain(values["w"]))
        key = entry.device_object("w", None)
        data = bytearray(store.get(key))
        if damage == "flipped":
            data[-1] ^= 1
            store.put(key, bytes(data))
        elif damage == "truncated":
            store.put(key, bytes(data[:-1]))
        else:
            store.delete(key)
        with pytest.raises(CacheError, match="w.tensorbin: device file [(]what ttnn loads[)] (does not match its manifest checksum|"
                                             "listed in the manifest is missing)"):
            reload.device_tensors(entry, [("w", None)], pool, check_mapped=True)
        assert torch.equal(ttnn.to_torch(sound), _plain(values["w"]))


def test_a_damaged_chunk_is_refused_in_every_form(written):
    entry, _, pool = written
    for name in ("r", "h"):
        (entry.path / name / "c.0.0").write_bytes(b"\0" * (entry.manifest.arrays[name].chunks[None].nbytes))
    with pytest.raises(CacheError, match="r: chunk all does not match its manifest checksum"):
        reload.torch_tensors(entry, [("r", None)], False, pool)
    with pytest.raises(CacheError, match="r: chunk all does not match its manifest checksum"):
        reload.ttnn_tensors(entry, [("r", None)], pool)
    with pytest.raises(CacheError, match="h: chunk all does not match its manifest checksum"):
        reload.host_table(entry, "h")
