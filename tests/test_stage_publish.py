"""The stage and publish contracts (tasks/stage.py, tasks/entries/publish.py), without a convert: what a staged chunk is on
disk (read back with zarr-python, an independent reader), how a killed run's progress is trusted or not, what an
array's content id is a function of, and how an entry becomes visible (manifest last, one rename, a lost race is
success, nothing half-published)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import zarr

from tasks import stage
from tasks.entries import publish
from tasks.device.host_tensors import Converted
from tasks.entries.entry import open_entry
from tasks.entries.manifest import Identity, content_id
from tasks.entries.names import CACHE_FORMAT, MANIFEST, PROGRESS_DIR, packed_path
from tasks.entries.progress import already_staged, staged_records
from tasks.errors import CacheError
from tasks.stage import stage_target
from tasks.entries.store import LocalStore
from tasks.entries.zarr_v3 import array_metadata, create_array

WHOLE = np.arange(12, dtype=np.uint16).reshape(3, 4)
SLOT = np.full((2, 4), 7, np.uint16)


def _arrays() -> dict[str, dict]:
    """The `zarr.json` documents of a whole target `t` and a 32-slot bank `b`."""
    out = {}
    for name, shape, chunks, source in (("t", (3, 4), (3, 4), "k1"), ("b", (32, 2, 4), (1, 2, 4), "k2")):
        attrs = {"sources": [source], "transform": "identity", "device_dtype": "bfloat16", "device_layout": "TILE",
                 "logical_shape": list(shape[-2:]), "embodiment_bank": name == "b", "dtype": "bfloat16"}
        out[name] = array_metadata(shape, chunks, attrs)
    return out


def _build(tmp: Path, behind: bool = False) -> list:
    """A tiny entry being built: `t` with a device file, and slot 5 of `b` (`behind`: the writes handed off)."""
    tmp.mkdir(parents=True)
    for name, meta in _arrays().items():
        create_array(tmp / name, meta)
    made = {"device_dtype": "bfloat16", "layout": "TILE", "padded_shape": (32, 32), "max_abs_err": 0.0, "pcc": 1.0}
    return [stage_target(tmp, Converted(name="t", slot=None, array=WHOLE, packed=b"packed bytes", **made), behind),
            stage_target(tmp, Converted(name="b", slot=5, array=SLOT, **made), behind)]


def test_a_staged_chunk_is_its_raw_bytes_and_zarr_reads_it(tmp_path):
    staged = _build(tmp_path / "e")
    assert (tmp_path / "e" / "t" / "c.0.0").read_bytes() == WHOLE.astype("<u2").tobytes()
    assert (tmp_path / "e" / "b" / "c.5.0.0").read_bytes() == SLOT.astype("<u2").tobytes()
    assert packed_path(tmp_path / "e", "t", None).read_bytes() == b"packed bytes"
    assert np.array_equal(zarr.open_array(str(tmp_path / "e" / "t"), mode="r")[...], WHOLE)
    assert np.array_equal(zarr.open_array(str(tmp_path / "e" / "b"), mode="r")[5], SLOT)
    assert [(s.name, s.slot, s.record.nbytes, s.record.tensorbin and s.record.tensorbin.nbytes) for s in staged] == \
        [("t", None, 24, 12), ("b", 5, 16, None)]


def test_progress_records_are_trusted_only_while_the_bytes_match(tmp_path):
    entry = tmp_path / "e"
    staged = _build(entry)
    records = staged_records(entry)
    assert records == {("t", None): staged[0], ("b", 5): staged[1]}
    assert all(already_staged(entry, r, 2) for r in records.values())
    log = next((entry / PROGRESS_DIR).glob("*.jsonl"))
    log.write_text(log.read_text() + '{"name": "t", "slo')  # a line torn by a kill: skipped
    assert staged_records(entry) == records
    chunk = entry / "t" / "c.0.0"
    chunk.write_bytes(b"\1" + chunk.read_bytes()[1:])  # a chunk torn under its final name
    assert not already_staged(entry, records[("t", None)], 2)
    chunk.write_bytes(WHOLE.astype("<u2").tobytes())
    assert already_staged(entry, records[("t", None)], 2)
    packed_path(entry, "t", None).write_bytes(b"packed bytez")
    assert not already_staged(entry, records[("t", None)], 2)  # its device file is torn
    packed_path(entry, "t", None).unlink()
    assert not already_staged(entry, records[("t", None)], 2)  # or gone
    (entry / "b" / "c.5.0.0").unlink()
    assert not already_staged(entry, records[("b", 5)], 2)


BASE = {"dtype": "bfloat16", "source_dtypes": ["BF16"], "transform": "identity", "transform_params": [],
        "device_dtype": "bfloat16", "device_layout": "TILE", "logical_shape": [3, 4]}


@pytest.mark.parametrize("change", [
    ("sources", ["other"]), ("transform", "transpose"), ("transform_params", [3, 5, 8]),
    ("device_dtype", "bfloat8_b"), ("device_layout", "ROW_MAJOR"), ("logical_shape", [4, 3]), ("converter", "2"),
    ("source_dtypes", ["F32"]), ("dtype", "float32"),
])
def test_a_content_id_changes_with_everything_the_bytes_depend_on(change):
    field, value = change
    sources, attrs, converter = ["a"], dict(BASE), "1"
    before = content_id(sources, attrs, converter)
    assert content_id(list(sources), dict(BASE), converter) == before  # a pure function of its inputs
    if field == "sources":
        sources = value
    elif field == "converter":
        converter = value
    else:
        attrs[field] = value
    assert content_id(sources, attrs, converter) != before


def test_a_content_id_changes_with_the_chunks_layout(monkeypatch):
    before = content_id(["a"], BASE, "1")
    from tasks.entries import manifest

    monkeypatch.setattr(manifest, "CONTENT_FORMAT", manifest.CONTENT_FORMAT + 1)
    assert content_id(["a"], BASE, "1") != before


IDENTITY = Identity(fingerprint="ab" * 10 + "0" * 44, cache_format=CACHE_FORMAT, converter="1", version="n16",
                    revision=None, synthetic=None, layout="tt-n16", profile="port", shards={"s": "0" * 64},
                    recipes_sha256="0" * 64, slots=[5], source={}, source_shapes={})
NAME = "n16-tt-n16-port-" + "ab" * 10
VERIFIED = [SimpleNamespace(tensor_xxh3={"k1": "h1", "k2": "h2"}, header=SimpleNamespace(path=Path("s")), sha256="ab" * 32)]


def _publish(root: Path, tag: str, replace: bool = False) -> dict:
    tmp = root / "entries" / f"{NAME}.tmp-1-{tag}"
    staged = _build(tmp)
    (tmp / "t" / "c.0.0.deadbeef.partial").write_bytes(b"a killed run's half write")
    return publish.publish_entry(str(tmp), str(root / "entries" / NAME), IDENTITY, _arrays(),
                                 [publish.unit_done("u", staged, VERIFIED)], VERIFIED, replace=replace)


def test_publishing_writes_the_manifest_and_renames_the_whole_entry(tmp_path):
    done = _publish(tmp_path, "aaaaaaaa")
    final = tmp_path / "entries" / NAME
    assert done["published_here"] and done["cache_path"] == str(final)
    assert sorted(p.name for p in (tmp_path / "entries").iterdir()) == [NAME]  # the temporary is gone
    assert not (final / PROGRESS_DIR).exists() and not list(final.rglob("*.partial"))
    entry = open_entry(LocalStore(tmp_path), NAME)
    assert entry.verify() == [] and entry.manifest.chunks == 2 and entry.manifest.bytes == 40
    assert entry.manifest.arrays["t"].source_xxh3 == {"k1": "h1"}
    assert entry.manifest.arrays["t"].content_id == content_id(["h1"], entry.manifest.arrays["t"].attributes, "1")
    group = zarr.open_group(str(final), mode="r")  # the consolidated group metadata, read by zarr-python
    assert sorted(group.array_keys()) == ["b", "t"] and group.attrs["gr00t_cache"]["fingerprint"] == IDENTITY.fingerprint


def test_the_publish_waits_for_the_writes_a_stage_handed_off(tmp_path, monkeypatch):
    """With the threads scheduler a stage task hands its writes that go to the disk directly off and returns; the
    manifest and the rename come only once every chunk, device file and progress record is on disk."""
    monkeypatch.setattr(stage, "DIRECT_MIN", 0)  # every file as big as a real checkpoint's big ones
    real_write, gate = stage.write_chunk, threading.Event()

    def slow_write_chunk(*args):
        assert gate.wait(10)
        real_write(*args)

    monkeypatch.setattr(stage, "write_chunk", slow_write_chunk)
    tmp = tmp_path / "entries" / f"{NAME}.tmp-1-aaaaaaaa"
    staged = _build(tmp, behind=True)
    assert not (tmp / "t" / "c.0.0").exists() and staged_records(tmp) == {}  # returned first; a record follows its bytes
    threading.Timer(0.3, gate.set).start()
    publish.publish_entry(str(tmp), str(tmp_path / "entries" / NAME), IDENTITY, _arrays(),
                          [publish.unit_done("u", staged, VERIFIED)], VERIFIED)
    entry = open_entry(LocalStore(tmp_path), NAME)
    assert entry.verify() == [] and entry.manifest.chunks == 2
    assert (tmp_path / "entries" / NAME / "t" / "c.0.0").read_bytes() == WHOLE.astype("<u2").tobytes()


def test_a_target_too_small_for_the_disk_directly_is_written_before_its_stage_task_returns(tmp_path, monkeypatch):
    """Handing a write off costs more than a write the page cache takes at once: such a target's chunk and record
    are there when its stage task returns, even where the writes are handed off."""
    handed = []
    monkeypatch.setattr(stage, "write_behind", lambda *args: handed.append(args))
    tmp = tmp_path / "entries" / f"{NAME}.tmp-1-aaaaaaaa"
    staged = _build(tmp, behind=True)
    assert handed == [] and (tmp / "t" / "c.0.0").exists() and len(staged_records(tmp)) == len(staged)


def test_losing_the_race_to_an_identical_entry_is_success_and_replace_swaps_it_whole(tmp_path):
    first = _publish(tmp_path, "aaaaaaaa")
    manifest = (Path(first["cache_path"]) / MANIFEST).read_text()
    second = _publish(tmp_path, "bbbbbbbb")
    assert not second["published_here"] and second["cache_path"] == first["cache_path"]
    assert sorted(p.name for p in (tmp_path / "entries").iterdir()) == [NAME]
    assert (Path(first["cache_path"]) / MANIFEST).read_text() == manifest  # the winner is left as it was
    forced = _publish(tmp_path, "cccccccc", replace=True)
    assert forced["published_here"] and sorted(p.name for p in (tmp_path / "entries").iterdir()) == [NAME]
    assert json.loads((Path(forced["cache_path"]) / MANIFEST).read_text())["published_unix"] > json.loads(manifest)["published_unix"]


def test_an_array_created_but_never_staged_is_never_published(tmp_path):
    tmp = tmp_path / "entries" / f"{NAME}.tmp-1-aaaaaaaa"
    staged = _build(tmp)
    arrays = {**_arrays(), "forgotten": array_metadata((2, 2), (2, 2), {"sources": ["k1"]})}
    create_array(tmp / "forgotten", arrays["forgotten"])
    with pytest.raises(CacheError, match="array 'forgotten' was created but nothing was staged into it"):
        publish.publish_entry(str(tmp), str(tmp_path / "entries" / NAME), IDENTITY, arrays,
                              [publish.unit_done("u", staged, VERIFIED)], VERIFIED)
    assert not (tmp_path / "entries" / NAME).exists() and not (tmp / MANIFEST).exists()
