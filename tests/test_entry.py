"""The entry-format contract (tasks/entries/), without a convert: an entry written by hand (tests/handmade.py), as
cache/README.md describes it, is read, verified and refused exactly as the document says; the typed records round-trip the JSON."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tasks.entries import entry as fmt, manifest as records, names
from tasks.entries import refs as refs_mod
from tasks.errors import CacheError
from tasks.entries.store import LocalStore
from tests.handmade import NAME, write_entry as _write_entry


def test_the_manifest_records_round_trip_the_documented_json(tmp_path):
    doc = _write_entry(tmp_path)
    manifest = records.Manifest.from_json(doc)
    assert manifest.arrays["b"].chunks[7].nbytes == 8 and manifest.arrays["t"].chunks[None].tensorbin.nbytes == 12
    assert json.loads(json.dumps(manifest.to_json())) == doc  # every field kept, none invented
    assert list(manifest.to_json()) == list(doc)              # in the documented order


def test_names_are_the_documented_ones():
    assert names.manifest_key(NAME) == f"entries/{NAME}/MANIFEST.json"
    assert names.ref_key("n17", "tt-port", "port") == "refs/n17-tt-port-port.json"
    assert names.ref_key("n17", "tt-port", "port", synthetic=True) == "refs/n17-tt-port-port.synthetic.json"
    assert names.chunk_file(Path("e"), "w", 2, None) == Path("e/w/c.0.0")
    assert names.chunk_file(Path("e"), "W", 2, 31) == Path("e/W/c.31.0.0")  # a bank's slot is its first coordinate
    assert names.packed_path(Path("e"), "W", 31) == Path("e/tensorbin/W@31.tensorbin")
    assert names.chunk_key(None) == "all" and names.slot_of("all") is None and names.slot_of(names.chunk_key(5)) == 5


def test_an_entry_reads_its_chunks_and_device_files_checked(tmp_path):
    _write_entry(tmp_path)
    entry = fmt.open_entry(LocalStore(tmp_path), NAME)
    assert entry.read_chunk("t", None).tolist() == [[0, 1, 2], [3, 4, 5]]
    out = np.zeros((2, 2), np.uint16)
    assert entry.read_chunk("b", 7, out) is out and out.tolist() == [[107, 107], [107, 107]]
    assert entry.device_file("t", None).read_bytes() == b"device bytes"
    assert entry.verify() == [] and entry.manifest.holds_slot(4) and not entry.manifest.holds_slot(5)
    assert not entry.manifest.holds_slot(None)  # every slot: this entry has two of 32


def test_each_read_of_a_chunk_or_device_file_reads_its_bytes_once(tmp_path, monkeypatch):
    """The check is the pass that touches every byte: once per read, never again to say the same (a full N1.6's
    device files are gigabytes)."""
    _write_entry(tmp_path)
    entry = fmt.open_entry(LocalStore(tmp_path), NAME)
    checked, file_check, bytes_check = [], records.FileRecord.matches_file, records.FileRecord.matches
    monkeypatch.setattr(records.FileRecord, "matches_file", lambda r, p, size=None: (checked.append(p), file_check(r, p, size))[1])
    monkeypatch.setattr(records.FileRecord, "matches", lambda r, d: (checked.append(r), bytes_check(r, d))[1])
    entry.device_file("t", None)
    entry.read_chunk("t", None)
    entry.each_chunk_block("t", None, lambda block, pos: None)
    assert len(checked) == 2  # the device file's and the read chunk's (each_chunk_block hashes as it reads)


@pytest.mark.parametrize("damage,expected", [
    (lambda e: (e / "t" / "c.0.0").write_bytes(b"\0" * 12), "chunk all does not match its manifest checksum"),
    (lambda e: (e / "t" / "c.0.0").write_bytes(b"\0" * 11), "chunk holds 11 bytes, expected 12; the entry is corrupt"),
    (lambda e: (e / "t" / "c.0.0").unlink(), "chunk is missing from the cache entry"),
])
def test_a_damaged_chunk_is_refused_by_name(tmp_path, damage, expected):
    _write_entry(tmp_path)
    damage(tmp_path / "entries" / NAME)
    entry = fmt.open_entry(LocalStore(tmp_path), NAME)
    with pytest.raises(CacheError, match=expected) as err:
        entry.read_chunk("t", None)
    assert str(tmp_path / "entries" / NAME / "t") in str(err.value)
    assert len(entry.verify()) == 1


def test_a_damaged_device_file_is_refused_and_verify_names_it(tmp_path):
    _write_entry(tmp_path)
    (tmp_path / "entries" / NAME / "tensorbin" / "t.tensorbin").write_bytes(b"device bytez")
    entry = fmt.open_entry(LocalStore(tmp_path), NAME)
    with pytest.raises(CacheError, match="t.tensorbin: device file [(]what ttnn loads[)] does not match its manifest checksum"):
        entry.device_file("t", None)
    assert entry.verify() == [f"{tmp_path}/entries/{NAME}/tensorbin/t.tensorbin: device file (what ttnn loads) is missing or does "
                              "not match the manifest checksum"]


@pytest.mark.parametrize("manifest,expected", [
    (None, "no MANIFEST.json; the entry was never completely published"),
    ("{", "manifest is not valid JSON"),
    ('{"fingerprint": "x"}', "manifest lacks 'cache_format' or has the wrong type"),
])
def test_an_unreadable_manifest_is_one_sentence(tmp_path, manifest, expected):
    _write_entry(tmp_path)
    path = tmp_path / "entries" / NAME / "MANIFEST.json"
    path.unlink() if manifest is None else path.write_text(manifest)
    with pytest.raises(CacheError, match=expected):
        fmt.open_entry(LocalStore(tmp_path), NAME)


def test_a_manifest_may_name_only_objects_of_the_store_and_may_be_gzipped(tmp_path):
    """A record's `object` (format 6: an object store's bytes) is an `objects/<sha256>` key or the manifest is
    refused in one sentence (a stranger's manifest naming `../../x` would read outside the cache); a gzipped
    manifest (as an object store keeps it) reads as the plain one, and gzip bytes cut short are one sentence."""
    import gzip
    import re

    doc = _write_entry(tmp_path)
    path = tmp_path / "entries" / NAME / "MANIFEST.json"
    plain = fmt.open_entry(LocalStore(tmp_path), NAME).manifest
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    assert fmt.open_entry(LocalStore(tmp_path), NAME).manifest == plain
    path.write_bytes(gzip.compress(json.dumps(doc).encode())[:40])
    with pytest.raises(CacheError, match=r"manifest is gzip data that does not decompress .*; convert again"):
        fmt.open_entry(LocalStore(tmp_path), NAME)
    for bad in ("../../../etc/passwd", "objects/" + "a" * 63, "objects/" + "A" * 64):
        doc["arrays"]["t"]["chunks"]["all"]["object"] = bad
        path.write_text(json.dumps(doc))
        refused = rf"manifest records array 't', which names '{re.escape(bad)}'.*not an object under objects/; convert"
        with pytest.raises(CacheError, match=refused):
            fmt.open_entry(LocalStore(tmp_path), NAME)
    doc["arrays"]["t"]["chunks"]["all"]["object"] = names.object_key("a" * 64)
    path.write_text(json.dumps(doc))
    assert fmt.open_entry(LocalStore(tmp_path), NAME).chunk_object("t", None) == "objects/" + "a" * 64


def test_another_format_or_a_fingerprint_of_another_name_is_refused(tmp_path):
    _write_entry(tmp_path, cache_format=2)
    with pytest.raises(fmt.OldFormatError, match="written in cache format 2, which this converter does not read") as err:
        fmt.open_entry(LocalStore(tmp_path), NAME)
    assert err.value.cache_format == 2 and f"cache rm {NAME} --include-current" in str(err.value)
    other = "n16-tt-n16-port-" + "cd" * 10
    _write_entry(tmp_path, name=other)  # a copy whose manifest names another entry
    with pytest.raises(CacheError, match=f"fingerprint {'ab' * 10} does not match the entry name {other}"):
        fmt.open_entry(LocalStore(tmp_path), other)


def test_listing_tells_published_from_building_broken_and_old(tmp_path):
    _write_entry(tmp_path)
    _write_entry(tmp_path, name="n16-tt-n16-port-" + "ef" * 10, fingerprint="ef" * 10 + "0" * 44, cache_format=2)
    (tmp_path / "entries" / f"{NAME}.tmp-123-deadbeef").mkdir()
    (tmp_path / "entries" / ("n16-tt-n16-port-" + "12" * 10)).mkdir()  # a final name without a manifest
    states = {name: state for name, _, state in fmt.list_entries(LocalStore(tmp_path))}
    assert states == {NAME: "published", f"{NAME}.tmp-123-deadbeef": "incomplete",
                      "n16-tt-n16-port-" + "12" * 10: "broken",
                      "n16-tt-n16-port-" + "ef" * 10: "cache format 2 (unreadable here: gc removes it)"}


def test_refs_point_to_entries_and_synthetic_refs_are_their_own(tmp_path):
    store = LocalStore(tmp_path)
    refs_mod.write_ref(store, "n16", "tt-n16", "port", "real-entry")
    refs_mod.write_ref(store, "n16", "tt-n16", "port", "fake-entry", synthetic=True)
    assert refs_mod.read_ref(store, "n16", "tt-n16", "port") == "real-entry"
    assert refs_mod.read_ref(store, "n16", "tt-n16", "port", synthetic=True) == "fake-entry"
    assert refs_mod.refs(store) == {"real-entry": ["n16-tt-n16-port"], "fake-entry": ["n16-tt-n16-port.synthetic"]}
