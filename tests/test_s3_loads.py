"""Loads from a shared cache on an object store (moto's S3 server: tests/conftest.py): what a load fetches is kept
by content, and the next load fetches only what differs; a checkpoint in the bucket converts as the same folder on
disk does. (Converts, pushes, gc and sharing: tests/test_s3.py; two files, so that they run side by side.)"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import torch

from pipeline.jobs.convert import ConvertOptions, convert
from pipeline.jobs.load import load
from tasks.entries.cache_root import open_store
from tasks.entries.store import LocalStore
from tests.buckets import manifest_doc, upload
from tests.conftest import run_cli
from tests.test_simulated_device import dumped, entry_files, holds


def test_a_load_keeps_what_it_fetched_and_the_next_load_fetches_only_what_differs(s3_url, hf_cache, tmp_path,
                                                                                  monkeypatch):
    """Issue 49 item 4: a load from the bucket keeps each chunk it fetched on this machine, by content; a second
    fine-tune of the same release, loaded next, fetches only the chunks in which the two differ. Every object
    fetched is counted at the store interface; the tensors equal a load of the same entry from a local folder."""
    from pipeline.model.state_dict import tensor_specs
    from pipeline.inputs.synth import synthesize
    from tasks.entries.object_stores import S3Store

    changed = frozenset(s.key for s in tensor_specs("n16", "micro")
                        if s.key.startswith("action_head.model.transformer_blocks.0."))
    tuned_hf = tmp_path / "tuned-hf"
    synthesize("n16", tuned_hf, "micro", mutate=changed)
    monkeypatch.setenv("GR00T_CACHE", str(tmp_path / "client"))
    bucket = f"{s3_url}-kept"
    opts = dict(embodiments="new_embodiment", layout="generic", synthetic="micro", progress=False)
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
    """A device file fetched from the bucket is kept where ttnn loads it: a tiled chunk (format 7) by its object's
    name, which ttnn reads in place (tasks/device/one_file.py). The second ttnn load fetches nothing and gives the
    same tensors as the first."""
    import ttnn

    monkeypatch.setenv("GR00T_CACHE", str(tmp_path / "client"))
    bucket = f"{s3_url}-kept-ttnn"
    convert(ConvertOptions("n16", embodiments="gr1", hf_cache=hf_cache, synthetic="micro", cache_root=bucket, progress=False))
    first = load("n16", bucket, "gr1", into="ttnn", synthetic=True)
    second = load("n16", bucket, "gr1", into="ttnn", synthetic=True)
    assert first.stats["bytes_fetched"] == first.stats["bytes_read"] > 0
    assert second.stats["bytes_fetched"] == 0 and second.stats["bytes_kept_here"] == second.stats["bytes_read"]
    kept = {p.name for p in (tmp_path / "client" / "fetched").iterdir()}
    assert len(kept) > 90 and all(re.fullmatch(r"[0-9a-f]{64}", name) for name in kept)  # by content, and no more
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
    made = run_cli("convert", "--version", "n16", "--synthetic", "micro", "--hf-cache", str(hf_cache), "--layout",
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


def test_a_convert_with_a_device_open_into_the_bucket_pushes_what_it_built(simulated_device, hf_cache, tmp_path,
                                                                          s3_url, monkeypatch):
    """With a device open, a convert into an object store is built beside the device and pushed: its chunks and
    device files as objects named by their sha256, then its manifest. The bucket's entry is byte for byte the local
    build, and a load from the bucket onto the device gives what ttnn serializes as the entry's device files. (Here,
    not in tests/test_simulated_device.py: nothing in it depends on the architecture, and tests/test_blackhole.py
    runs that file again on a Blackhole.)"""
    from tasks.entries.cache_root import open_store
    from tests.buckets import entry_md5s

    monkeypatch.setenv("GR00T_CACHE", str(tmp_path / "local"))
    url = f"{s3_url}-device"
    summary = convert(ConvertOptions("n16", embodiments="gr1", hf_cache=hf_cache, synthetic="micro", cache_root=url,
                                     progress=False, device=simulated_device))
    name, built = summary["cache_path"].rsplit("/", 1)[1], Path(summary["local_build"])
    bucket = open_store(url)
    assert built.name == name and summary["pushed_bytes"] == sum(n for k, n in bucket.sizes("").items()
                                                                 if not k.startswith("refs/"))
    assert bucket.list(f"entries/{name}") == [f"entries/{name}/MANIFEST.json"]  # the bytes are objects/
    assert entry_md5s(bucket, name) == entry_md5s(LocalStore(built.parent.parent), name)
    loaded = load("n16", url, "gr1", into=simulated_device, entry=name, synthetic=True)
    files = entry_files(built.parent.parent, name)
    assert set(loaded.tensors) >= {t for t, _ in files} and len(files) > 90
    for (target, slot), path in files.items():
        if slot in (None, loaded.slot):
            assert holds(path, dumped(loaded.tensors[target])), target


def test_a_kept_copy_that_is_not_its_objects_bytes_is_fetched_again(s3_url, hf_cache, tmp_path, monkeypatch):
    """What a load keeps is checked as a fetch is: a kept chunk or device file whose bytes were changed on this
    machine (same size) is dropped, fetched again and kept whole; the tensors equal the first load's."""
    import hashlib

    import ttnn

    monkeypatch.setenv("GR00T_CACHE", str(tmp_path / "client"))
    bucket = f"{s3_url}-kept-damaged"
    convert(ConvertOptions("n16", embodiments="gr1", hf_cache=hf_cache, synthetic="micro", cache_root=bucket, progress=False))
    def as_torch(loaded) -> dict:  # copies: ttnn maps a kept device file, which is damaged below
        return {n: (t if isinstance(t, torch.Tensor) else ttnn.to_torch(t)).float().clone() for n, t in loaded.tensors.items()}

    first = {into: as_torch(load("n16", bucket, "gr1", into=into, synthetic=True)) for into in ("torch", "ttnn")}
    kept = sorted((tmp_path / "client" / "fetched").iterdir())
    for path in kept:
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    for into, before in first.items():
        again = load("n16", bucket, "gr1", into=into, synthetic=True)
        assert again.stats["bytes_fetched"] == 0  # counted as kept (their size is right); read, refused, fetched
        assert as_torch(again).keys() == before.keys()
        for name, t in as_torch(again).items():
            assert torch.equal(t, before[name]), (into, name)
    assert all(hashlib.sha256(p.read_bytes()).hexdigest() == p.name.split(".")[0] for p in kept)  # kept whole again
