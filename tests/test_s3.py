"""A shared cache on an object store: a real S3 API (moto's server on 127.0.0.1: tests/conftest.py), no rename.

The object-store mechanics are the same for every layout; these tests convert into `generic`, which keeps one object
per target (no `.tensorbin` beside it), so that each push to the test server stays small."""

from __future__ import annotations

import json
import os
import socket
import time

import pytest
import torch

from pipeline.jobs.convert import ConvertOptions, convert
from pipeline.jobs.load import load
from tasks.errors import CacheError
from tasks.entries.cache_root import open_store
from tasks.entries.store import LocalStore
from tests.buckets import entry_md5s, manifest_doc, named_objects, upload
from tests.conftest import run_cli


def test_convert_once_push_and_reload_from_s3(s3_url, hf_cache, tmp_path, monkeypatch):
    s3_url = f"{s3_url}-once"  # a prefix of its own: every object in it is this entry's
    monkeypatch.setenv("GR00T_CACHE", str(tmp_path / "local"))
    first = convert(ConvertOptions("n17", layout="generic", embodiments="new_embodiment", hf_cache=hf_cache, synthetic="tiny", cache_root=s3_url, progress=False))
    assert not first["cache_hit"] and first["cache_path"].startswith(f"{s3_url}/entries/n17-generic-bf16-")
    bucket = open_store(s3_url)
    prefix = f"entries/{first['cache_path'].rsplit('/', 1)[1]}"
    assert list(bucket.sizes(prefix)) == [f"{prefix}/MANIFEST.json"]  # the entry is its manifest: the bytes are objects
    assert bucket.get(f"{prefix}/MANIFEST.json")[:2] == b"\x1f\x8b"  # gzipped: it is sent and read whole every time
    assert first["pushed_bytes"] == sum(bucket.sizes("").values()) - len(bucket.get(
        "refs/n17-generic-bf16.synthetic.json")) > 6e6  # each object once, and the manifest
    # a colleague with an empty local cache: the entry is found on S3, nothing is converted
    monkeypatch.setenv("GR00T_CACHE", str(tmp_path / "colleague"))
    again = convert(ConvertOptions("n17", layout="generic", embodiments="new_embodiment", hf_cache=hf_cache, synthetic="tiny", cache_root=s3_url, progress=False))
    assert again["cache_hit"] and again["fingerprint"] == first["fingerprint"]
    assert not (tmp_path / "colleague" / "entries").exists()
    assert not (tmp_path / "local" / "entries").exists()  # the entry went straight into the bucket, built nowhere
    convert(ConvertOptions("n17", layout="generic", embodiments="new_embodiment", hf_cache=hf_cache, synthetic="tiny",
                           cache_root=tmp_path / "local", progress=False))
    folder = LocalStore(tmp_path / "local")
    name = prefix.split("/")[1]
    assert entry_md5s(bucket, name) == entry_md5s(folder, name)  # every chunk and device file
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
    assert not again["cache_hit"] and again["pushed_bytes"] == len(store.get(f"entries/{name}/MANIFEST.json"))
    assert again["pushed_bytes"] < done["pushed_bytes"] / 5
    assert load("n16", s3_url, embodiment="gr1").stats["tensors"] == done["targets"]


def test_a_tampered_object_is_refused(s3_url, hf_cache, tmp_path, monkeypatch):
    monkeypatch.setenv("GR00T_CACHE", str(tmp_path / "local"))
    done = convert(ConvertOptions("n15", layout="generic", embodiments="gr1", hf_cache=hf_cache, synthetic="tiny", cache_root=s3_url, progress=False))
    store = open_store(s3_url)
    name = done["cache_path"].rsplit("/", 1)[1]
    key = manifest_doc(store, name)["arrays"]["llm.norm.weight"]["chunks"]["all"]["object"]
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
    assert manifest_doc(store, name) is not None
    chunks = manifest_doc(store, name)["arrays"]["llm.norm.weight"]["chunks"]
    key = chunks["all"]["object"]
    store.put(key, b"\x00" * len(store.get(key)))
    assert main(["cache", "verify", name, "--cache", s3_url]) == 2
    objects = store.sizes("objects")
    assert main(["cache", "gc", "--cache", s3_url]) == 0  # corrupt: removed with its ref
    assert store.list(f"entries/{name}") == [] and store.get_json("refs/n17-generic-bf16.synthetic.json") is None
    assert store.sizes("objects") == objects  # named by no manifest now, but written within the grace period
    assert main(["cache", "gc", "--grace-hours", "0", "--cache", s3_url]) == 0
    assert store.sizes("objects") == {}  # then past it: gone
    assert main(["cache", "verify", "nothere", "--cache", s3_url]) == 2


def test_gc_during_a_publish_loses_nothing_and_removes_a_push_abandoned_past_the_grace_period(s3_url, hf_cache,
                                                                                              tmp_path, monkeypatch):
    """A convert into the bucket is held just before its manifest (its workers' objects are in, named by no manifest
    yet) while another process runs `cache gc`: they are left alone, and the entry publishes and loads. A gc with a
    grace period shorter than a convert takes such objects: that convert then publishes nothing, and says so.
    Objects abandoned that way (and an older push's entry folder without a manifest) go once older than
    `--grace-hours`."""
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
    store = open_store(s3_url)

    def converted_while(gc_args: list[str], embodiments: str) -> dict:
        done: dict = {}
        options = ConvertOptions("n17", layout="generic", embodiments=embodiments, hf_cache=hf_cache,
                                 synthetic="tiny", cache_root=s3_url, progress=False)

        def converting():
            try:
                done.update(convert(options))
            except CacheError as e:
                done["error"] = str(e)

        before = store.children("entries")
        thread = threading.Thread(target=converting)
        thread.start()
        try:
            assert held.wait(120)
            in_flight = store.sizes("objects")
            assert in_flight and store.children("entries") == before  # no manifest names them yet
            gc = run_cli("cache", "gc", *gc_args, "--cache", s3_url)  # another process, as another machine runs it
            assert gc.returncode == 0, gc.stderr[-2000:]
            done["left"] = store.sizes("objects")
            done["in_flight"] = in_flight
        finally:
            go_on.set()
            thread.join()
            held.clear()
            go_on.clear()
        return done

    first = converted_while([], "new_embodiment")  # the default grace period: what is in flight stays
    assert first["left"] == first["in_flight"] and "error" not in first
    name = first["cache_path"].rsplit("/", 1)[1]
    assert manifest_doc(store, name) is not None
    assert load("n17", s3_url, layout="generic", embodiment="new_embodiment", entry=name).stats["tensors"] > 0
    named = set(first["in_flight"])
    second = converted_while(["--grace-hours", "0"], "11")  # slot 11's objects are new: taken, the rest stay
    assert set(second["in_flight"]) > named and set(second["left"]) == named
    assert "gone from the store before" in second["error"] and "nothing was published" in second["error"]
    assert store.children("entries") == [name]

    elsewhere = open_store(f"{s3_url}-abandoned")  # a prefix of its own: gc verifies every published entry
    abandoned = "n17-generic-bf16-0123456789abcdef0123"  # a push of format 5 whose client died before its manifest
    for key in list(named)[:3]:
        elsewhere.put(key, store.get(key))
        elsewhere.put(f"entries/{abandoned}/{key}", store.get(key))
    assert main(["cache", "gc", "--cache", elsewhere.describe("")]) == 0
    assert len(elsewhere.list("")) == 6, "written moments ago: within the grace period"
    time.sleep(1.1)
    assert main(["cache", "gc", "--grace-hours", "0.0002", "--cache", elsewhere.describe("")]) == 0  # 0.72 s
    assert elsewhere.list("") == []


def test_a_fine_tune_into_the_bucket_sends_only_what_changed(s3_url, hf_cache, tmp_path, monkeypatch):
    """Issue 49: after its release, a fine-tune converts and sends only its changed targets, and adds only their
    objects and its manifest: every object it shares with the release is named by its manifest, not sent or
    copied; the release's old objects are freshened (so a gc cannot take them before the manifest is out). Its
    chunks and device files are byte for byte what a cold local convert of the fine-tune makes."""
    import pipeline.jobs.build_entry
    from pipeline.model.state_dict import tensor_specs
    from pipeline.inputs.synth import synthesize
    from tasks.entries.object_stores import S3Store

    head = frozenset(s.key for s in tensor_specs("n16", "tiny") if s.key.startswith("action_head."))
    tuned_hf = tmp_path / "tuned-hf"
    synthesize("n16", tuned_hf, "tiny", mutate=head)
    monkeypatch.setenv("GR00T_CACHE", str(tmp_path / "local"))
    bucket = f"{s3_url}-finetune"
    opts = dict(embodiments="gr1,new_embodiment", synthetic="tiny", progress=False)
    convert(ConvertOptions("n16", hf_cache=hf_cache, cache_root=bucket, **opts))
    store = open_store(bucket)
    release = store.written("")
    time.sleep(1.1)  # S3 keeps LastModified to the second
    monkeypatch.setattr(pipeline.jobs.build_entry, "FRESH_FOR", 0.5)  # the release's objects count as old
    sent, put, put_many = [], S3Store.put, S3Store.put_many
    monkeypatch.setattr(S3Store, "put", lambda self, k, d: (sent.append(len(d)), put(self, k, d))[1])
    monkeypatch.setattr(S3Store, "put_many", lambda self, o: (sent.extend(map(len, o.values())), put_many(self, o))[1])
    tuned = convert(ConvertOptions("n16", hf_cache=tuned_hf, cache_root=bucket, **opts))
    monkeypatch.setattr(S3Store, "put", put)
    monkeypatch.setattr(S3Store, "put_many", put_many)
    cold = convert(ConvertOptions("n16", hf_cache=tuned_hf, cache_root=tmp_path / "cold", reuse=False, **opts))
    assert tuned["fingerprint"] == cold["fingerprint"] and tuned["reused_chunks"] > 0
    name = cold["cache_path"].rsplit("/", 1)[1]
    assert entry_md5s(store, name) == entry_md5s(LocalStore(tmp_path / "cold"), name)
    after = store.sizes("")
    added = {k: n for k, n in after.items() if k not in release}
    manifest = manifest_doc(store, name)
    changed = {n for n, a in manifest["arrays"].items() if set(a["attributes"]["sources"]) & head}
    objects_of = named_objects(store, name)
    changed_objects = set().union(*(objects_of[n] for n in changed))
    assert changed and set(added) == (changed_objects - set(release)) | {f"entries/{name}/MANIFEST.json"}
    ref = len(store.get("refs/n16-tt-n16-port.synthetic.json"))
    assert sum(sent) == sum(added.values()) + ref  # the changed targets' new objects, the manifest and the ref
    assert tuned["pushed_bytes"] == sum(sent) - ref
    shared = set().union(*(objects_of[n] for n in manifest["arrays"] if n not in changed)) & set(release)
    written = store.written("objects")
    assert shared and all(written[k] > release[k] for k in shared)  # freshened, not sent
    remote = load("n16", bucket, embodiment="new_embodiment", entry=name)
    local = load("n16", tmp_path / "cold", embodiment="new_embodiment", entry=name)
    for tensor, t in local.tensors.items():
        assert torch.equal(remote.tensors[tensor].view(torch.int16), t.view(torch.int16)), tensor


def test_entries_sharing_objects_are_counted_once_and_removed_with_the_last_naming_them(s3_url, hf_cache, tmp_path,
                                                                                       monkeypatch):
    """Two entries of one checkpoint, one slot and two: `cache ls` counts what they share once; `cache rm` of one
    removes only the objects no other manifest names (past the grace period), and the other still verifies and
    loads; the last one's objects stay, being young, until a `cache gc` past the grace period."""
    from pipeline.cache import entry_rows, remove_entry
    from pipeline.commands.cli import main

    url = f"{s3_url}-shared"
    monkeypatch.setenv("GR00T_CACHE", str(tmp_path / "local"))
    opts = dict(layout="generic", hf_cache=hf_cache, synthetic="tiny", cache_root=url, progress=False)
    one = convert(ConvertOptions("n16", embodiments="gr1", **opts))["cache_path"].rsplit("/", 1)[1]
    two = convert(ConvertOptions("n16", embodiments="gr1,new_embodiment", **opts))["cache_path"].rsplit("/", 1)[1]
    store = open_store(url)
    named = {n: set().union(*named_objects(store, n).values()) for n in (one, two)}
    sizes, shared = store.sizes(""), named[one] & named[two]
    assert shared and named[one] < named[two]  # the second holds every object of the first, and new_embodiment's
    totals: dict = {}
    rows = {r["entry"]: r for r in entry_rows(store, totals=totals)}
    manifest = {n: sizes[f"entries/{n}/MANIFEST.json"] for n in (one, two)}
    for n in (one, two):
        assert rows[n]["bytes"] == sum(sizes[k] for k in named[n]) + manifest[n]
        assert rows[n]["shared_bytes"] == sum(sizes[k] for k in shared)
    assert totals["disk_bytes"] == sum(n for k, n in sizes.items() if not k.startswith("refs/"))
    removed = remove_entry(store, two, include_current=True, grace_hours=0)
    assert store.sizes("objects").keys() == named[one]  # new_embodiment's objects went; the shared stayed
    assert removed["freed_bytes"] == manifest[two] + sum(sizes[k] for k in named[two] - named[one])
    assert main(["cache", "verify", one, "--cache", url]) == 0
    assert load("n16", url, layout="generic", embodiment="gr1", entry=one).stats["tensors"] > 0
    removed = remove_entry(store, one, include_current=True)  # the default grace period: they are minutes old
    assert store.children("entries") == [] and store.sizes("objects").keys() == named[one]
    assert "written within the grace period (24 hours)" in removed["reason"] and removed["freed_bytes"] == manifest[one]
    assert main(["cache", "gc", "--grace-hours", "0", "--cache", url]) == 0 and store.sizes("objects") == {}


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
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {url}") and f": {said}" in last and "--force" not in last, r.stderr[-2000:]


def test_access_denied_is_one_sentence(s3_url, monkeypatch):
    """What S3 answers a request it refuses (botocore's ClientError AccessDenied, for a GET, a PUT or a listing)
    is one sentence, at once: a refusal is not retried."""
    from botocore.exceptions import ClientError

    store = open_store(f"{s3_url}/denied")

    def refuse(*_a, **_k):
        raise ClientError({"Error": {"Code": "AccessDenied", "Message": "Access Denied"}}, "GetObject")

    from tasks.io.network import retries_so_far

    for request in ("get_object", "put_object", "list_objects_v2"):
        monkeypatch.setattr(store._client, request, refuse)
    before = retries_so_far()
    said = rf"^{s3_url}/denied: access denied by the object store; check the credentials"
    for call in (lambda: store.get("refs/x.json"), lambda: store.put("a", b"1"), lambda: store.put_many({"a": b"1", "b": b"2"}),
                 lambda: store.sizes("entries")):
        with pytest.raises(CacheError, match=said):
            call()
    assert retries_so_far() == before


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
    from tasks.entries.object_stores import S3Store

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
    fetched, cat_file, read_into = [], S3Store.get, S3Store.read_into
    monkeypatch.setattr(S3Store, "get", lambda self, k: (lambda d: (fetched.append((k, len(d or b""))), d)[1])(cat_file(self, k)))
    monkeypatch.setattr(S3Store, "read_into",
                        lambda self, k, out: (read_into(self, k, out), fetched.append((k, out.nbytes))))
    names = [s["cache_path"].rsplit("/", 1)[1] for s in (first, second)]
    one = load("n16", bucket, "new_embodiment", layout="generic", entry=names[0])
    chunks = [(k, n) for k, n in fetched if k.startswith("objects/")]
    assert sum(n for _, n in chunks) == one.stats["bytes_read"] > 0
    assert one.stats["bytes_fetched"] == one.stats["bytes_read"]
    fetched.clear()
    two = load("n16", bucket, "new_embodiment", layout="generic", entry=names[1])
    store = open_store(bucket)
    a, b = (manifest_doc(store, n)["arrays"] for n in names)
    differ = sum(rec["nbytes"] for t, arr in b.items() for s, rec in arr["chunks"].items()
                 if s in ("all", str(one.slot)) and a[t]["chunks"].get(s, {}).get("xxh3") != rec["xxh3"])
    assert 0 < differ < two.stats["bytes_read"] / 4
    assert sum(n for k, n in fetched if k.startswith("objects/")) == differ  # only the chunks in which the two differ
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


def test_a_load_that_cannot_keep_what_it_fetched_says_so(s3_url, hf_cache, tmp_path):
    """Keeping fetched bytes is a courtesy, but a silent one cost a bench its figure (issue 63): a load whose local
    folder cannot take them (here a file where the folder goes, as a full disk refuses them) still loads, and says
    how many bytes it could not keep and why, in its line and its JSON."""
    url, client = f"{s3_url}-not-kept", tmp_path / "client"
    env = {**os.environ, "GR00T_CACHE": str(client)}
    made = run_cli("convert", "--version", "n16", "--synthetic", "tiny", "--hf-cache", str(hf_cache), "--layout",
                   "generic", "--embodiments", "gr1", "--cache", url, env=env)
    assert made.returncode == 0, made.stderr[-2000:]
    client.mkdir(exist_ok=True)
    (client / "fetched").write_text("a file where the folder of kept bytes goes")
    args = ("load", "--version", "n16", "--layout", "generic", "--embodiment", "gr1", "--cache", url)
    loaded = run_cli(*args, "--json", env=env)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    stats = json.loads(loaded.stdout)
    assert stats["bytes_not_kept"] == stats["bytes_fetched"] == stats["bytes_read"] > 0
    assert str(client / "fetched") in stats["not_kept_because"]
    said = run_cli(*args, env=env)
    assert said.returncode == 0 and "could not be kept here for the next load" in said.stdout, said.stdout
