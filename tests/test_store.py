"""The Store contract: a local folder and the object stores (S3 on moto's server, and fsspec's) behave the same behind the interface,
and an entry read through either gives the same manifest, chunks, device files and verification."""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from pipeline.cache import entry_at, home_of
from pipeline.jobs.convert import ConvertOptions, convert
from tasks.entries.entry import open_entry
from tasks.entries.names import WHOLE
from tasks.entries.publish import push
from tasks.errors import CacheError
from tasks.entries.cache_root import open_store
from tasks.entries.store import LocalStore, Store
from tests.buckets import manifest_doc


@pytest.fixture(params=["local", "s3", "fsspec"])
def store(request, tmp_path) -> Store:
    """Each backend the contract holds for: a folder, S3 (boto3, moto's server) and any other fsspec store (its
    in-memory filesystem)."""
    if request.param == "local":
        return LocalStore(tmp_path / "store")
    if request.param == "fsspec":
        return open_store(f"memory://contract-{uuid.uuid4().hex[:8]}/cache")
    return open_store(f"{request.getfixturevalue('s3_url')}/contract-{uuid.uuid4().hex[:8]}")


def test_objects_round_trip_whole_and_missing_ones_are_none(store):
    assert store.get("a/b.bin") is None
    store.put("a/b.bin", b"first")
    store.put("a/b.bin", b"second, longer")  # a whole object is replaced, never mixed
    assert store.get("a/b.bin") == b"second, longer"
    store.put_many({"m/1": b"one", "m/2/3": b"two", "a/b.bin": b"third"})
    assert [store.get(k) for k in ("m/1", "m/2/3", "a/b.bin")] == [b"one", b"two", b"third"]
    store.put_json("refs/x.json", {"entry": "e"})
    assert store.get_json("refs/x.json") == {"entry": "e"} and store.get_json("refs/none.json") is None
    store.put("refs/bad.json", b"{not json")
    with pytest.raises(CacheError, match=r"refs/bad\.json: not valid JSON"):
        store.get_json("refs/bad.json")


def test_listing_is_recursive_sorted_and_sized_and_children_are_one_level(store):
    for key, data in (("e/ab/z", b"1"), ("e/a/c/d", b"22"), ("e/a/b", b"333"), ("f/x", b"4444")):
        store.put(key, data)
    assert store.list("e/a") == ["e/a/b", "e/a/c/d"]  # not e/ab: a prefix is a folder, not a string prefix
    assert store.sizes("e") == {"e/a/b": 3, "e/a/c/d": 2, "e/ab/z": 1}
    assert store.children("e") == ["a", "ab"] and store.children("nothing") == [] and store.list("nothing") == []
    size, own, files = store.usage("e")
    assert (size, own, sum(files.values()), len(files)) == (6, 6, 6, 3)
    store.delete("e/a")
    assert store.list("e") == ["e/ab/z"] and store.get("f/x") == b"4444"


def test_written_times_each_object_and_last_written_is_the_newest_under_the_prefix(store):
    assert store.last_written("e") is None and store.written("e") == {}
    before = time.time()
    store.put("e/a/first", b"1")
    time.sleep(1.1)  # S3 keeps whole seconds
    store.put("e/b/second", b"2")
    store.put("f/other", b"3")
    first, newest = store.last_written("e/a"), store.last_written("e")
    assert before - 1 <= first < newest <= time.time() + 1
    assert store.last_written("e/b/second") == newest and store.last_written("nothing") is None
    assert store.written("e") == {"e/a/first": first, "e/b/second": newest}
    assert store.sizes_and_times("e") == {"e/a/first": (1, first), "e/b/second": (1, newest)}  # one listing


def test_freshening_writes_the_time_again_and_never_the_bytes(store):
    store.put("o/a", b"alpha" * 1000)
    store.put("o/b", b"beta")
    old = store.written("o")
    time.sleep(1.1)
    assert store.freshen(["o/a", "o/gone"]) == {"o/a"}  # one removed meanwhile is left out, not an error
    now = store.written("o")
    assert now["o/a"] > old["o/a"] and now["o/b"] == old["o/b"]
    assert store.get("o/a") == b"alpha" * 1000 and store.get("o/gone") is None and store.freshen([]) == set()


def test_a_convert_names_what_the_store_holds_and_freshens_the_old_first(store):
    """tasks/entries/objects.py: an object of the right size is held (not sent again); one written before
    `fresh_after` only once freshened, so not one gone since the listing; one of another size is not. (A fresh one
    is trusted: gc leaves it for the grace period, and the publish checks every object is there.)"""
    from tasks.entries.objects import present_objects, still_held

    store.put_many({"objects/old": b"1" * 10, "objects/new": b"2" * 20, "objects/other": b"3" * 5, "objects/gone": b"4"})
    present = present_objects(store)
    assert {k: n for k, (n, _) in present.items()} == store.sizes("objects")
    store.delete("objects/gone")
    time.sleep(1.1)
    cutoff = present["objects/new"][1] - 0.5  # "old" counts as old, "new" as fresh
    present = {**present, "objects/old": (10, cutoff - 100), "objects/gone": (1, cutoff - 100)}
    wanted = {"objects/old": 10, "objects/new": 20, "objects/other": 6, "objects/gone": 1, "objects/absent": 3}
    assert still_held(store, wanted, present, cutoff) == {"objects/old", "objects/new"}
    assert store.written("objects")["objects/old"] > store.written("objects")["objects/other"]  # freshened


def test_delete_many_removes_those_objects_only(store):
    store.put_many({"o/a": b"1", "o/b": b"2", "o/c/d": b"3"})
    store.delete_many(["o/a", "o/c/d", "o/never"])
    assert store.list("o") == ["o/b"]


def test_a_local_folder_links_and_an_object_store_names_shared_objects(store):
    """Where entries share bytes: a folder's entries hold files of their own, shared by hard links (copy_many);
    an object store has no links, so its entries name shared objects (pipeline/cache/homes.py)."""
    if not isinstance(store, LocalStore):
        assert not hasattr(store, "copy_many")
        return
    store.put("old/a", b"alpha")
    store.put("old/t/b", b"beta" * 1000)
    store.put("new/a", b"stale, from a killed run")  # replaced whole, never written through
    made = store.copy_many({"new/a": "old/a", "new/x/b": "old/t/b", "new/gone": "old/removed"})
    assert made == {"new/a", "new/x/b"}  # a source removed meanwhile is left out, not an error
    assert store.get("new/a") == b"alpha" and store.get("new/x/b") == b"beta" * 1000 and store.get("new/gone") is None
    assert store.local_path("new/a").stat().st_ino == store.local_path("old/a").stat().st_ino
    store.delete("old")
    assert store.get("new/a") == b"alpha" and store.get("new/x/b") == b"beta" * 1000  # the link outlives its source
    assert store.copy_many({}) == set()


def test_read_into_fills_exactly_and_refuses_missing_or_short_objects(store):
    data = np.arange(12, dtype=np.uint16).reshape(3, 4)
    store.put("c/0/0", data.tobytes())
    out = np.empty((3, 4), np.uint16)
    store.read_into("c/0/0", out)
    assert np.array_equal(out, data)
    mapped = store.map("c/0/0", np.uint16, (3, 4))
    mapped[0, 0] = 99  # a caller's writes stay private
    assert np.array_equal(np.asarray(mapped)[1:], data[1:]) and store.get("c/0/0") == data.tobytes()
    with pytest.raises(CacheError, match=r"c/0/1: chunk is missing from the cache entry"):
        store.read_into("c/0/1", out)
    with pytest.raises(CacheError, match=r"c/0/0: chunk holds 24 bytes, expected 48"):
        store.read_into("c/0/0", np.empty((6, 4), np.uint16))
    local = store.local_file("c/0/0")
    assert local.read_bytes() == data.tobytes() and store.local_file("c/9") is None


def test_a_folder_is_home_to_entries_published_by_rename_and_a_bucket_to_pushed_ones(tmp_path, s3_url):
    """What a final name without its manifest means, by the store's home: a folder's cannot be half-published (a
    rename makes it), so it is broken; an object store's manifest goes last, so it is a push in flight."""
    folder, bucket = home_of(LocalStore(tmp_path)), home_of(open_store(s3_url))
    assert folder.unpublished_state == "broken" and bucket.unpublished_state.startswith("incomplete")
    assert folder.local_root == tmp_path and not folder.over_network and bucket.over_network


def test_a_local_path_is_the_object_itself_and_an_object_store_has_none(store):
    """Where a key is a file on this machine: a folder's own file; an object store has none."""
    store.put("e/n/c/0/0", b"bytes")
    path = store.local_path("e/n/c/0/0")
    if isinstance(store, LocalStore):  # the key's own file (no copy), and where a key not yet written goes
        assert path.read_bytes() == b"bytes" and path.stat().st_nlink == 1
        path.write_bytes(b"other")
        assert store.get("e/n/c/0/0") == b"other" and not store.local_path("e/n/none").exists()
    else:  # an object store: reached through get/put only
        assert path is None and store.local_path("e/n/none") is None


def test_an_entry_reads_the_same_through_either_store(hf_cache, tmp_path, store, micro_snapshots):
    """Convert once locally; push the entry into the store under test (a local folder gets a copy of the entry's
    folder); every reader answers the same, and the chunks equal the source read with safetensors itself."""
    summary = convert(ConvertOptions("n17", embodiments="new_embodiment", hf_cache=hf_cache, synthetic="micro",
                                     cache_root=tmp_path / "built", progress=False, profile="bfp8"))
    built = entry_at(Path(summary["cache_path"]))
    if not isinstance(store, LocalStore):  # every chunk and device file once, as the object of its sha256, then the manifest
        sent = push(built, store)
        manifest = len(store.get(f"entries/{built.name}/MANIFEST.json"))
        files = {p.read_bytes() for p in built.path.rglob("*")
                 if p.is_file() and p.name not in ("MANIFEST.json", "zarr.json")}
        assert sent == sum(map(len, files)) + manifest == sum(store.sizes("").values())
        by_sha256 = {hashlib.sha256(f).hexdigest(): f for f in files}
        objects = store.list("objects")
        assert {k.rsplit("/", 1)[1].split(".")[0] for k in objects} == set(by_sha256)
        # byte for byte for a seeded sample (every object's bytes are held to the manifest by verify() below)
        for key in random.Random(0).sample(objects, 64):
            assert store.get(key) == by_sha256[key.rsplit("/", 1)[1].split(".")[0]], key
        assert push(built, store) == manifest  # nothing sent again
    else:
        shutil.copytree(built.path, store.local_path(f"entries/{built.name}"))
    entry = open_entry(store, built.name)
    assert _records(entry.manifest) == _records(built.manifest) and entry.verify() == []
    doc = manifest_doc(store, built.name)
    assert doc["arrays"]["language.norm.weight"]["chunks"][WHOLE]["xxh3"] == entry.manifest.arrays["language.norm.weight"].chunks[None].xxh3
    arr = entry.manifest.arrays["language.norm.weight"]
    assert entry.read_chunk("language.norm.weight", None).shape == tuple(arr.logical_shape)
    assert entry.device_file("language.norm.weight", None).read_bytes() == \
        built.store.get(built.device_object("language.norm.weight", None))
    bank = next(n for n, a in entry.manifest.arrays.items() if a.bank)
    slot, (source_key,) = entry.manifest.slots[0], entry.manifest.arrays[bank].attributes["sources"]
    index = json.loads((micro_snapshots["n17"] / "model.safetensors.index.json").read_text())["weight_map"]
    with safe_open(str(micro_snapshots["n17"] / index[source_key]), "pt") as f:  # the source, read independently
        want = f.get_tensor(source_key)[slot].view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(entry.read_chunk(bank, slot), want)
    damaged = entry.chunk_object(bank, slot)
    store.put(damaged, b"\0" * len(store.get(damaged)))
    assert [p.split(": ", 1)[1] for p in entry.verify()] == ["chunk bytes do not match the manifest checksum "
                                                              "(tampered or corrupt)"]
    with pytest.raises(CacheError, match=f"{bank}: chunk {slot} does not match its manifest checksum"):
        entry.read_chunk(bank, slot)


def _records(manifest) -> dict:
    """A manifest with its chunks' places left out (an object store's name objects, a folder's do not)."""
    doc = manifest.to_json()
    for arr in doc["arrays"].values():
        for rec in arr["chunks"].values():
            rec.pop("object", None)
            rec.get("tensorbin", {}).pop("object", None)
    return doc


def test_local_files_asked_for_by_many_threads_at_once_all_stay(store, monkeypatch):
    """The load path asks for local files from a thread pool (ttnn loads from a path); an object store downloads
    each into one folder of its own, which must be made once, not once per thread that found it missing."""
    import tempfile
    import time
    from concurrent.futures import ThreadPoolExecutor

    made = tempfile.TemporaryDirectory
    monkeypatch.setattr(tempfile, "TemporaryDirectory", lambda **kw: time.sleep(0.05) or made(**kw))  # a wider window
    for i in range(32):
        store.put(f"objects/{i}", bytes([i]) * (i + 1))
    fresh = open_store(store.describe(""))  # nothing made yet
    with ThreadPoolExecutor(8) as pool:
        paths = list(pool.map(lambda i: fresh.local_file(f"objects/{i}"), range(32)))
    assert [p.read_bytes() for p in paths] == [bytes([i]) * (i + 1) for i in range(32)]


def test_an_object_store_reads_an_object_from_the_socket_into_the_array_and_keeps_the_connection(s3_url, monkeypatch):
    """urllib3 2's `readinto` reads into a new bytes object and copies it: a chunk goes from http.client straight
    into the caller's array instead, and the connection goes back to the pool for the next read."""
    from urllib3.response import HTTPResponse

    store = open_store(f"{s3_url}/straight-{uuid.uuid4().hex[:8]}")
    data = np.random.default_rng(0).integers(0, 256, 3 << 20, dtype=np.uint8)
    store.put("c/0", data.tobytes())
    monkeypatch.setattr(HTTPResponse, "readinto", lambda *_: pytest.fail("read through urllib3's copy"))
    pools = store._client._endpoint.http_session._manager.pools  # (the client is shared by the process's stores)

    def connections_made() -> int:
        return sum(pool.num_connections for pool in pools._container.values())
    made = None
    for _ in range(5):
        out = np.empty_like(data)
        store.read_into("c/0", out)
        assert np.array_equal(out, data)
        made = connections_made() if made is None else made
    assert connections_made() == made  # each read after the first took the connection the one before gave back
