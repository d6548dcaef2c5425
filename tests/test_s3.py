"""A shared cache on an object store: a real S3 API (moto's server on 127.0.0.1: tests/conftest.py), no rename.

The object-store mechanics are the same for every layout; these tests convert into `generic`, which keeps one object
per target (no `.tensorbin` beside it), so that each push to the test server stays small."""

from __future__ import annotations

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
from tests.buckets import entry_md5s, manifest_doc, named_objects
from tests.conftest import run_cli


def test_convert_once_push_and_reload_from_s3(s3_url, hf_cache, tmp_path, monkeypatch):
    s3_url = f"{s3_url}-once"  # a prefix of its own: every object in it is this entry's
    monkeypatch.setenv("GR00T_CACHE", str(tmp_path / "local"))
    first = convert(ConvertOptions("n17", layout="generic", embodiments="new_embodiment", hf_cache=hf_cache, synthetic="micro", cache_root=s3_url, progress=False))
    assert not first["cache_hit"] and first["cache_path"].startswith(f"{s3_url}/entries/n17-generic-bf16-")
    bucket = open_store(s3_url)
    prefix = f"entries/{first['cache_path'].rsplit('/', 1)[1]}"
    assert list(bucket.sizes(prefix)) == [f"{prefix}/MANIFEST.json"]  # the entry is its manifest: the bytes are objects
    assert bucket.get(f"{prefix}/MANIFEST.json")[:2] == b"\x1f\x8b"  # gzipped: it is sent and read whole every time
    assert first["pushed_bytes"] == sum(bucket.sizes("").values()) - len(bucket.get(
        "refs/n17-generic-bf16.synthetic.json")) > 8e5  # each object once, and the manifest
    # a colleague with an empty local cache: the entry is found on S3, nothing is converted
    monkeypatch.setenv("GR00T_CACHE", str(tmp_path / "colleague"))
    again = convert(ConvertOptions("n17", layout="generic", embodiments="new_embodiment", hf_cache=hf_cache, synthetic="micro", cache_root=s3_url, progress=False))
    assert again["cache_hit"] and again["fingerprint"] == first["fingerprint"]
    assert not (tmp_path / "colleague" / "entries").exists()
    assert not (tmp_path / "local" / "entries").exists()  # the entry went straight into the bucket, built nowhere
    convert(ConvertOptions("n17", layout="generic", embodiments="new_embodiment", hf_cache=hf_cache, synthetic="micro",
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
    opts = ConvertOptions("n16", embodiments="gr1", hf_cache=hf_cache, synthetic="micro", cache_root=s3_url, progress=False)
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
    done = convert(ConvertOptions("n15", layout="generic", embodiments="gr1", hf_cache=hf_cache, synthetic="micro", cache_root=s3_url, progress=False))
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
    done = convert(ConvertOptions("n17", layout="generic", embodiments="11", hf_cache=hf_cache, synthetic="micro", progress=False))
    assert done["cache_path"].startswith(s3_url) and not (tmp_path / "local" / "entries").exists()
    assert load("n17", layout="generic", embodiment=11).entry == done["cache_path"].rsplit("/", 1)[1]


def test_cache_ls_verify_and_gc_work_on_an_object_store(s3_url, hf_cache):
    from pipeline.commands.cli import main

    s3_url = f"{s3_url}-gc"  # a prefix of its own: gc verifies every entry under it, not every test's
    convert(ConvertOptions("n17", layout="generic", embodiments="new_embodiment", hf_cache=hf_cache, synthetic="micro", cache_root=s3_url,
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

    import tasks.places
    from pipeline.commands.cli import main
    from tasks.entries.publish import publish_into_store

    s3_url = f"{s3_url}-grace"
    monkeypatch.setenv("GR00T_CACHE", str(tmp_path / "local"))
    held, go_on = threading.Event(), threading.Event()

    def publish_later(*args):
        held.set()
        assert go_on.wait(60)
        return publish_into_store(*args)

    monkeypatch.setattr(tasks.places, "publish_into_store", publish_later)
    store = open_store(s3_url)

    def converted_while(gc_args: list[str], embodiments: str) -> dict:
        done: dict = {}
        options = ConvertOptions("n17", layout="generic", embodiments=embodiments, hf_cache=hf_cache,
                                 synthetic="micro", cache_root=s3_url, progress=False)

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
    import pipeline.cache.homes
    from pipeline.model.state_dict import tensor_specs
    from pipeline.inputs.synth import synthesize
    from tasks.entries.object_stores import S3Store

    head = frozenset(s.key for s in tensor_specs("n16", "micro") if s.key.startswith("action_head."))
    tuned_hf = tmp_path / "tuned-hf"
    synthesize("n16", tuned_hf, "micro", mutate=head)
    monkeypatch.setenv("GR00T_CACHE", str(tmp_path / "local"))
    bucket = f"{s3_url}-finetune"
    opts = dict(embodiments="gr1,new_embodiment", synthetic="micro", progress=False)
    convert(ConvertOptions("n16", hf_cache=hf_cache, cache_root=bucket, **opts))
    store = open_store(bucket)
    release = store.written("")
    time.sleep(1.1)  # S3 keeps LastModified to the second
    monkeypatch.setattr(pipeline.cache.homes, "FRESH_FOR", 0.5)  # the release's objects count as old
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
    opts = dict(layout="generic", hf_cache=hf_cache, synthetic="micro", cache_root=url, progress=False)
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
    r = run_cli("convert", "--version", "n16", "--synthetic", "micro", "--hf-cache", str(hf_cache), "--embodiments",
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


def test_a_bucket_that_does_not_exist_is_named_as_missing_by_every_command(s3_url, tmp_path):
    """A typo in --cache (the bucket moto holds is team-weights) is never an empty cache: load, cache ls and cache
    verify each say the bucket does not exist, in one sentence, exit 2."""
    url = s3_url.replace("team-weights", "team-weightz")
    env = {**os.environ, "GR00T_CACHE": str(tmp_path / "client")}
    for args in (("load", "--version", "n16", "--embodiment", "gr1"), ("cache", "ls"), ("cache", "verify")):
        proc = run_cli(*args, "--cache", url, env=env)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, (args, proc.stderr[-2000:])
        assert lines == [f"error: {url}: the bucket s3://team-weightz does not exist; create it (for S3: `aws s3 mb "
                         "s3://team-weightz`) or name one that does"], (args, lines)
