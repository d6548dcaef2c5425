"""A shared cache on an object store: a real S3 API (moto's server on 127.0.0.1: tests/conftest.py), no rename.

The object-store mechanics are the same for every layout; these tests convert into `generic`, which keeps one object
per target (no `.tensorbin` beside it), so that each push to the test server stays small."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest
import torch

from pipeline.jobs.convert import ConvertOptions, convert
from pipeline.jobs.load import load
from tasks.errors import CacheError
from tasks.entries.store import LocalStore, open_store
from tests.buckets import md5s, upload
from tests.conftest import run_cli


def test_convert_once_push_and_reload_from_s3(s3_url, hf_cache, tmp_path, monkeypatch):
    monkeypatch.setenv("GR00T_CACHE", str(tmp_path / "local"))
    first = convert(ConvertOptions("n17", layout="generic", embodiments="new_embodiment", hf_cache=hf_cache, synthetic="tiny", cache_root=s3_url, progress=False))
    assert not first["cache_hit"] and first["cache_path"].startswith(f"{s3_url}/entries/n17-generic-bf16-")
    assert first["pushed_bytes"] > 7e6
    # a colleague with an empty local cache: the entry is found on S3, nothing is converted
    monkeypatch.setenv("GR00T_CACHE", str(tmp_path / "colleague"))
    again = convert(ConvertOptions("n17", layout="generic", embodiments="new_embodiment", hf_cache=hf_cache, synthetic="tiny", cache_root=s3_url, progress=False))
    assert again["cache_hit"] and again["fingerprint"] == first["fingerprint"]
    assert not (tmp_path / "colleague" / "entries").exists()
    assert not (tmp_path / "local" / "entries").exists()  # the entry went straight into the bucket, built nowhere
    convert(ConvertOptions("n17", layout="generic", embodiments="new_embodiment", hf_cache=hf_cache, synthetic="tiny",
                           cache_root=tmp_path / "local", progress=False))
    bucket, folder = open_store(s3_url), LocalStore(tmp_path / "local")
    prefix = f"entries/{first['cache_path'].rsplit('/', 1)[1]}"
    objects = {k: n for k, n in bucket.sizes(prefix).items() if not k.endswith("MANIFEST.json")}
    assert objects == {k: n for k, n in folder.sizes(prefix).items() if not k.endswith("MANIFEST.json")}
    assert md5s(bucket, prefix, objects) == md5s(folder, prefix, objects)  # every array, device file and document
    remote = load("n17", s3_url, layout="generic", embodiment="new_embodiment")
    local = load("n17", tmp_path / "local", layout="generic", embodiment="new_embodiment")
    assert remote.entry == local.entry and remote.stats["bytes_read"] == local.stats["bytes_read"]
    assert remote.tensors.keys() == local.tensors.keys()
    for name, t in local.tensors.items():
        assert torch.equal(remote.tensors[name].view(torch.int16), t.view(torch.int16)), name


def test_a_half_pushed_entry_is_invisible_and_gets_completed(s3_url, hf_cache, tmp_path, monkeypatch):
    monkeypatch.setenv("GR00T_CACHE", str(tmp_path / "local"))
    opts = ConvertOptions("n16", embodiments="gr1", hf_cache=hf_cache, synthetic="tiny", cache_root=s3_url, progress=False)
    done = convert(opts)
    store = open_store(s3_url)
    name = done["cache_path"].rsplit("/", 1)[1]
    store.put(f"entries/{name}/MANIFEST.json.bak", store.get(f"entries/{name}/MANIFEST.json"))
    store.delete(f"entries/{name}/MANIFEST.json")  # as if the push died before its last object
    with pytest.raises(CacheError, match="never completely pushed"):
        load("n16", s3_url, embodiment="gr1")
    again = convert(opts)  # the manifest is missing: the workers find every object there, and send none again
    documents = sum(n for k, n in store.sizes(f"entries/{name}").items() if k.endswith(("/zarr.json", "/MANIFEST.json")))
    assert not again["cache_hit"] and again["pushed_bytes"] == documents < done["pushed_bytes"] / 2
    assert load("n16", s3_url, embodiment="gr1").stats["tensors"] == done["targets"]


def test_a_tampered_object_is_refused(s3_url, hf_cache, tmp_path, monkeypatch):
    monkeypatch.setenv("GR00T_CACHE", str(tmp_path / "local"))
    done = convert(ConvertOptions("n15", layout="generic", embodiments="gr1", hf_cache=hf_cache, synthetic="tiny", cache_root=s3_url, progress=False))
    store = open_store(s3_url)
    name = done["cache_path"].rsplit("/", 1)[1]
    key = f"entries/{name}/llm.norm.weight/c.0.0"
    data = bytearray(store.get(key))
    data[0] ^= 1
    store.put(key, bytes(data))
    with pytest.raises(CacheError, match="does not match its manifest checksum"):
        load("n15", s3_url, layout="generic", embodiment="gr1")


def test_gr00t_cache_may_name_the_bucket(s3_url, hf_cache, tmp_path, monkeypatch):
    from pipeline.cache import roots

    monkeypatch.setenv("GR00T_CACHE", s3_url)  # no --cache anywhere: the team bucket is the default
    monkeypatch.setattr(roots, "DEFAULT_ROOT", tmp_path / "local")  # the client's own folder: source memo only
    done = convert(ConvertOptions("n17", layout="generic", embodiments="11", hf_cache=hf_cache, synthetic="tiny", progress=False))
    assert done["cache_path"].startswith(s3_url) and not (tmp_path / "local" / "entries").exists()
    assert load("n17", layout="generic", embodiment=11).entry == done["cache_path"].rsplit("/", 1)[1]


def test_cache_ls_verify_and_gc_work_on_an_object_store(s3_url, hf_cache):
    from pipeline.commands.cli import main

    s3_url = f"{s3_url}-gc"  # a prefix of its own: gc verifies every entry under it, not every test's
    convert(ConvertOptions("n17", layout="generic", embodiments="new_embodiment", hf_cache=hf_cache, synthetic="tiny", cache_root=s3_url,
                           progress=False))
    store = open_store(s3_url)
    name = store.get_json("refs/n17-generic-bf16.synthetic.json")["entry"]
    assert main(["cache", "verify", name, "--cache", s3_url]) == 0  # (other tests tamper with their own entries)
    assert main(["cache", "gc", "--older-than-days", "0", "--cache", s3_url]) == 0  # in use: kept
    assert store.get_json(f"entries/{name}/MANIFEST.json") is not None
    key = next(k for k in store.list(f"entries/{name}") if "/c." in k)
    store.put(key, b"\x00" * len(store.get(key)))
    assert main(["cache", "verify", name, "--cache", s3_url]) == 2
    assert main(["cache", "gc", "--cache", s3_url]) == 0  # corrupt: removed with its ref
    assert store.list(f"entries/{name}") == [] and store.get_json("refs/n17-generic-bf16.synthetic.json") is None
    assert main(["cache", "verify", "nothere", "--cache", s3_url]) == 2


def test_gc_during_a_publish_loses_nothing_and_removes_a_push_abandoned_past_the_grace_period(s3_url, hf_cache,
                                                                                              tmp_path, monkeypatch):
    """A convert into the bucket is held just before its manifest (its workers' objects are in, a reader cannot see
    it yet) while another process runs `cache gc`: the push is left alone, and the entry publishes and loads. A
    push abandoned that way (no manifest, nothing written since) goes once it is older than `--grace-hours`."""
    import threading

    import pipeline.jobs.graph
    from pipeline.commands.cli import main
    from tasks.entries.publish import publish_into_store

    s3_url = f"{s3_url}-grace"
    monkeypatch.setenv("GR00T_CACHE", str(tmp_path / "local"))
    held, go_on = threading.Event(), threading.Event()

    def publish_later(*args):
        held.set()
        assert go_on.wait(60)
        return publish_into_store(*args)

    monkeypatch.setattr(pipeline.jobs.graph, "publish_into_store", publish_later)
    options = ConvertOptions("n17", layout="generic", embodiments="new_embodiment", hf_cache=hf_cache,
                             synthetic="tiny", cache_root=s3_url, progress=False)
    done: dict = {}
    converting = threading.Thread(target=lambda: done.update(convert(options)))
    converting.start()
    try:
        assert held.wait(120)
        store = open_store(s3_url)
        (name,) = store.children("entries")
        in_flight = store.sizes(f"entries/{name}")
        assert in_flight and not any(k.endswith("MANIFEST.json") for k in in_flight)
        assert main(["cache", "gc", "--cache", s3_url]) == 0  # the default grace period: a push in flight stays
        assert store.sizes(f"entries/{name}") == in_flight
    finally:
        go_on.set()
        converting.join()
    assert done["cache_path"].endswith(name) and store.get_json(f"entries/{name}/MANIFEST.json") is not None
    elsewhere = open_store(f"{s3_url}-abandoned")  # a prefix of its own: gc verifies every published entry
    abandoned = "n17-generic-bf16-0123456789abcdef0123"  # a push whose client died before its manifest
    for key in list(in_flight)[:3]:
        elsewhere.put(key.replace(name, abandoned), store.get(key))
    assert main(["cache", "gc", "--cache", elsewhere.describe("")]) == 0
    assert elsewhere.list(f"entries/{abandoned}"), "written moments ago: within the grace period"
    time.sleep(1.1)
    assert main(["cache", "gc", "--grace-hours", "0.0002", "--cache", elsewhere.describe("")]) == 0  # 0.72 s
    assert elsewhere.list(f"entries/{abandoned}") == []


def _target_of(key: str) -> str:
    """The target an entry's object belongs to: `entries/E/<target>/c.…`, or `entries/E/tensorbin/<target>[@slot].tensorbin`."""
    from tasks.entries.names import PACKED_DIR

    within = key.split("/", 2)[2]
    if within.startswith(f"{PACKED_DIR}/"):
        return within[len(PACKED_DIR) + 1:].removesuffix(".tensorbin").split("@")[0]
    return within.split("/")[0]


def test_a_fine_tune_into_the_bucket_sends_only_what_changed(s3_url, hf_cache, tmp_path, monkeypatch):
    """Issue 49: after its release, a fine-tune converts and sends only its changed targets; every object it
    shares with the release is copied inside the bucket (S3 CopyObject), and the entry is byte for byte what a
    cold local convert of the fine-tune makes."""
    from pipeline.model.state_dict import tensor_specs
    from pipeline.inputs.synth import synthesize
    from tasks.entries.store import FsspecStore

    head = frozenset(s.key for s in tensor_specs("n16", "tiny") if s.key.startswith("action_head."))
    tuned_hf = tmp_path / "tuned-hf"
    synthesize("n16", tuned_hf, "tiny", mutate=head)
    monkeypatch.setenv("GR00T_CACHE", str(tmp_path / "local"))
    bucket = f"{s3_url}-finetune"
    opts = dict(embodiments="gr1,new_embodiment", synthetic="tiny", progress=False)
    convert(ConvertOptions("n16", hf_cache=hf_cache, cache_root=bucket, **opts))
    sent, put, put_many = [], FsspecStore.put, FsspecStore.put_many
    monkeypatch.setattr(FsspecStore, "put", lambda self, k, d: (sent.append(len(d)), put(self, k, d))[1])
    monkeypatch.setattr(FsspecStore, "put_many", lambda self, o: (sent.extend(map(len, o.values())), put_many(self, o))[1])
    tuned = convert(ConvertOptions("n16", hf_cache=tuned_hf, cache_root=bucket, **opts))
    monkeypatch.setattr(FsspecStore, "put", put)
    monkeypatch.setattr(FsspecStore, "put_many", put_many)
    cold = convert(ConvertOptions("n16", hf_cache=tuned_hf, cache_root=tmp_path / "cold", reuse=False, **opts))
    assert tuned["fingerprint"] == cold["fingerprint"] and tuned["reused_chunks"] > 0
    name = cold["cache_path"].rsplit("/", 1)[1]
    folder, store = LocalStore(tmp_path / "cold"), open_store(bucket)
    objects = folder.sizes(f"entries/{name}")
    there = store.sizes(f"entries/{name}")
    assert there.keys() == objects.keys()  # every array, device file and document: the same bytes (the manifest
    same = [k for k in objects if not k.endswith("MANIFEST.json")]  # says when)
    assert md5s(store, f"entries/{name}", same) == md5s(folder, f"entries/{name}", same)
    arrays = json.loads(folder.get(f"entries/{name}/MANIFEST.json"))["arrays"]
    changed = {n for n, a in arrays.items() if set(a["attributes"]["sources"]) & head}
    documents = sum(n for k, n in there.items() if k.endswith(".json"))
    changed_bytes = sum(n for k, n in objects.items() if _target_of(k) in changed and not k.endswith(".json"))
    assert changed and changed_bytes > 0
    ref = len(store.get("refs/n16-tt-n16-port.synthetic.json"))
    assert sum(sent) == changed_bytes + documents + ref  # the changed targets, the documents and the ref: no more
    assert tuned["pushed_bytes"] == sum(sent) - ref
    remote = load("n16", bucket, embodiment="new_embodiment", entry=name)
    local = load("n16", tmp_path / "cold", embodiment="new_embodiment", entry=name)
    for tensor, t in local.tensors.items():
        assert torch.equal(remote.tensors[tensor].view(torch.int16), t.view(torch.int16)), tensor


@pytest.mark.parametrize("case", ["unreachable", "no such bucket", "no credentials"])
def test_a_bucket_that_cannot_be_used_is_one_sentence_and_exit_2(case, s3_url, hf_cache, tmp_path):
    """Issue 49 item 5: the bucket unreachable, missing, or no credentials: one sentence naming the URL and the
    remedy, exit 2, no traceback, nothing published."""
    env = {**os.environ, "GR00T_CACHE": str(tmp_path / "client")}
    url = s3_url
    if case == "unreachable":
        env["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{_closed_port()}"
    elif case == "no such bucket":
        url = "s3://no-such-bucket/gr00t"
    else:
        for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            env.pop(k)
        env.update(AWS_CONFIG_FILE=str(tmp_path / "none"), AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
                   AWS_EC2_METADATA_DISABLED="true")
    said = {"unreachable": "the object store cannot be reached", "no such bucket": "the bucket s3://no-such-bucket does "
            "not exist", "no credentials": "no credentials for the object store"}[case]
    r = run_cli("convert", "--version", "n16", "--synthetic", "tiny", "--hf-cache", str(hf_cache), "--embodiments",
                "gr1", "--cache", url, env=env, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stderr.strip().splitlines()[-1].startswith(f"error: {url}: {said}"), r.stderr[-2000:]


def test_access_denied_is_one_sentence(s3_url, monkeypatch):
    store = open_store(f"{s3_url}/denied")

    def refuse(*_a, **_k):
        raise PermissionError("Access Denied")

    monkeypatch.setattr(store.fs, "cat_file", refuse)
    with pytest.raises(CacheError, match=rf"^{s3_url}/denied: access denied by the object store; check the credentials"):
        store.get("refs/x.json")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # free again once closed: nothing listens there


def test_a_load_keeps_what_it_fetched_and_the_next_load_fetches_only_what_differs(s3_url, hf_cache, tmp_path,
                                                                                  monkeypatch):
    """Issue 49 item 4: a load from the bucket keeps each chunk it fetched on this machine, by content; a second
    fine-tune of the same release, loaded next, fetches only the chunks in which the two differ. Every object
    fetched is counted at the store interface; the tensors equal a load of the same entry from a local folder."""
    from pipeline.model.state_dict import tensor_specs
    from pipeline.inputs.synth import synthesize
    from tasks.entries.store import FsspecStore

    changed = frozenset(s.key for s in tensor_specs("n16", "tiny")
                        if s.key.startswith("action_head.model.transformer_blocks.0."))
    tuned_hf = tmp_path / "tuned-hf"
    synthesize("n16", tuned_hf, "tiny", mutate=changed)
    monkeypatch.setenv("GR00T_CACHE", str(tmp_path / "client"))
    bucket = f"{s3_url}-kept"
    opts = dict(embodiments="new_embodiment", layout="generic", synthetic="tiny", progress=False)
    first = convert(ConvertOptions("n16", hf_cache=tuned_hf, cache_root=bucket, **opts))
    second = convert(ConvertOptions("n16", hf_cache=hf_cache, cache_root=bucket, **opts))
    assert first["fingerprint"] != second["fingerprint"]
    fetched, cat_file = [], FsspecStore.get
    monkeypatch.setattr(FsspecStore, "get", lambda self, k: (lambda d: (fetched.append((k, len(d or b""))), d)[1])(cat_file(self, k)))
    names = [s["cache_path"].rsplit("/", 1)[1] for s in (first, second)]
    one = load("n16", bucket, "new_embodiment", layout="generic", entry=names[0])
    chunks = [(k, n) for k, n in fetched if "/c." in k]
    assert sum(n for _, n in chunks) == one.stats["bytes_read"] > 0
    assert one.stats["bytes_fetched"] == one.stats["bytes_read"]
    fetched.clear()
    two = load("n16", bucket, "new_embodiment", layout="generic", entry=names[1])
    store = open_store(bucket)
    a, b = (json.loads(store.get(f"entries/{n}/MANIFEST.json"))["arrays"] for n in names)
    differ = sum(rec["nbytes"] for t, arr in b.items() for s, rec in arr["chunks"].items()
                 if s in ("all", str(one.slot)) and a[t]["chunks"].get(s, {}).get("xxh3") != rec["xxh3"])
    assert 0 < differ < two.stats["bytes_read"] / 4
    assert sum(n for k, n in fetched if "/c." in k) == differ  # only the chunks in which the two entries differ
    assert two.stats["bytes_fetched"] == differ and two.stats["bytes_kept_here"] == two.stats["bytes_read"] - differ
    convert(ConvertOptions("n16", hf_cache=hf_cache, cache_root=tmp_path / "local", **opts))
    local = load("n16", tmp_path / "local", "new_embodiment", layout="generic")
    assert local.tensors.keys() == two.tensors.keys()
    for name, t in local.tensors.items():
        assert torch.equal(two.tensors[name].view(torch.int16), t.view(torch.int16)), name


def test_gc_removes_kept_fetches_unused_that_long_and_nothing_else(tmp_path):
    import os
    import time

    from pipeline.cache import collect_garbage
    from tasks.entries.names import FETCHED

    root = LocalStore(tmp_path)
    (tmp_path / FETCHED).mkdir()
    old, recent = tmp_path / FETCHED / "aa-3", tmp_path / FETCHED / "bb-4"
    old.write_bytes(b"old")
    recent.write_bytes(b"used")
    os.utime(old, (time.time() - 3 * 86400,) * 2)
    assert collect_garbage(root, older_than_days=2, dry_run=True)[0]["bytes"] == 3 and old.exists()
    rows = collect_garbage(root, older_than_days=2)
    assert [r["entry"] for r in rows] == [f"{FETCHED}/ (1 files)"] and not old.exists() and recent.exists()
    assert collect_garbage(root) == [] and recent.exists()  # without an age, kept fetches stay


def test_device_files_loaded_from_the_bucket_are_kept_under_a_name_ttnn_takes(s3_url, hf_cache, tmp_path, monkeypatch):
    """ttnn's load_tensor refuses a file not named `.tensorbin`: a kept device file keeps that suffix. The second
    ttnn load fetches nothing and gives the same tensors as the first."""
    import ttnn

    monkeypatch.setenv("GR00T_CACHE", str(tmp_path / "client"))
    bucket = f"{s3_url}-kept-ttnn"
    convert(ConvertOptions("n16", embodiments="gr1", hf_cache=hf_cache, synthetic="tiny", cache_root=bucket, progress=False))
    first = load("n16", bucket, "gr1", into="ttnn", synthetic=True)
    second = load("n16", bucket, "gr1", into="ttnn", synthetic=True)
    assert first.stats["bytes_fetched"] == first.stats["bytes_read"] > 0
    assert second.stats["bytes_fetched"] == 0 and second.stats["bytes_kept_here"] == second.stats["bytes_read"]
    assert any(p.suffix == ".tensorbin" for p in (tmp_path / "client" / "fetched").iterdir())
    for name, t in first.tensors.items():
        a = t if isinstance(t, torch.Tensor) else ttnn.to_torch(t)
        b = second.tensors[name] if isinstance(second.tensors[name], torch.Tensor) else ttnn.to_torch(second.tensors[name])
        assert torch.equal(a.float(), b.float()), name


def test_a_checkpoint_in_the_bucket_converts_as_the_same_folder_on_disk_does(s3_url, tmp_path):
    """`--snapshot s3://…`: LeRobot's own `pretrained_model/` (tests/fixtures) read from the bucket by the same
    folder rules (its weight file, the trained tag and map in policy_preprocessor.json, the normalizer files left
    alone), converted into the same entry, byte for byte, as the folder on disk. A prefix that holds nothing is one
    sentence, exit 2."""
    from tests.conftest import ROOT

    folder = ROOT / "tests" / "fixtures" / "lerobot-n17" / "pretrained_model"
    url = f"{s3_url}-sources/runs/pretrained_model"
    upload(folder, url)
    common = ("--embodiments", "trained", "--layout", "generic", "--json")
    remote = run_cli("convert", "--snapshot", url, "--cache", str(tmp_path / "a"), *common)
    assert remote.returncode == 0, remote.stderr[-3000:]
    here = run_cli("convert", "--snapshot", str(folder), "--cache", str(tmp_path / "b"), *common)
    assert here.returncode == 0, here.stderr[-3000:]
    got, want = json.loads(remote.stdout), json.loads(here.stdout)
    assert got["fingerprint"] == want["fingerprint"] and got["slots"] == want["slots"] == [10]
    assert got["source"]["snapshot"] == url and got["source"]["trained_embodiments"] == ["new_embodiment"]
    assert got["source"]["trained_from"] == f"{url}/policy_preprocessor.json"
    assert got["shards_checked_against"] == want["shards_checked_against"] == {"model.safetensors": "content identity"}
    assert [n.replace(url, "F") for n in got["notes"]] == [n.replace(str(folder), "F") for n in want["notes"]]
    assert any("policy_preprocessor_step_2" in n and "not read" in n for n in got["notes"])
    a, b = LocalStore(tmp_path / "a"), LocalStore(tmp_path / "b")
    prefix = f"entries/{got['cache_path'].rsplit('/', 1)[1]}"
    objects = {k: n for k, n in b.sizes(prefix).items() if not k.endswith(("MANIFEST.json", "/zarr.json"))
               or k.count("/") > 2}
    assert len(objects) > 100 and all(a.get(k) == b.get(k) for k in objects)
    gone = run_cli("convert", "--snapshot", f"{s3_url}-sources/runs/nothing-here", "--cache", str(tmp_path / "c"))
    assert gone.returncode == 2 and "Traceback" not in gone.stderr, gone.stderr[-2000:]
    assert gone.stderr.strip().splitlines() == [gone.stderr.strip()] and "nothing-here: does not exist" in gone.stderr
