"""A Dask cluster whose workers share nothing with the client but the bucket (issue 49), as one machine can stand it
in: moto's S3 server (tests/conftest.py), a `dask scheduler`, and two `dask worker` processes, each in a mount
namespace of its own (`unshare -m`, root) with an empty tmpfs over the client's cache folder, as a worker on another
machine sees it. The checkpoint is in a folder all of them can read, or in the bucket.

- Into the bucket: the workers put every object themselves, and the entry is byte for byte what a local convert
  of the same source makes; a fresh process loads the same tensors from the bucket.
- Into a local cache folder: one sentence naming the folder and the remedy, exit 2, nothing published."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.cache import roots
from pipeline.jobs.convert import ConvertOptions, convert
from pipeline.jobs.load import load
from tasks.entries.cache_root import open_store
from tasks.entries.store import LocalStore
from tests.buckets import entry_md5s, named_objects, upload
from tests.clusters import EMBODIMENT, NEEDS_ROOT, VERSIONS_HERE, started_cluster
from tests.conftest import ROOT, run_cli

pytestmark = NEEDS_ROOT


@pytest.fixture(scope="module")
def cluster(s3_url, tmp_path_factory):
    """(scheduler address, the client's cache folder the workers cannot see)."""
    hidden = tmp_path_factory.mktemp("client-only")
    with started_cluster(hidden) as address:
        yield address, hidden


@pytest.mark.parametrize("version", VERSIONS_HERE)
def test_workers_on_other_machines_write_the_entry_into_the_bucket(cluster, s3_url, hf_cache, tmp_path, monkeypatch,
                                                                   version):
    scheduler, hidden = cluster
    monkeypatch.setattr(roots, "DEFAULT_ROOT", hidden / "cache")  # the client's own folder: no worker sees it
    bucket_url = f"{s3_url}-cluster"
    embodiment = EMBODIMENT[version]
    opts = dict(layout="generic", embodiments=f"{embodiment},new_embodiment" if version == "n16" else embodiment,
                hf_cache=hf_cache, synthetic="micro", progress=False)
    before = open_store(bucket_url).sizes("objects")
    done = convert(ConvertOptions(version, scheduler=scheduler, cache_root=bucket_url, **opts))
    assert not done["cache_hit"] and done["cache_path"].startswith(f"{bucket_url}/entries/")
    assert not (hidden / "cache" / "entries").exists()  # nothing built on the client's disk
    local = convert(ConvertOptions(version, scheduler="threads", cache_root=tmp_path / "local", **opts))
    assert local["fingerprint"] == done["fingerprint"]
    bucket, folder = open_store(bucket_url), LocalStore(tmp_path / "local")
    name = Path(local["cache_path"]).name
    found = entry_md5s(bucket, name)
    assert len(found) >= done["targets"] > 70  # a chunk for every target at least
    assert found == entry_md5s(folder, name), "an object differs from the local convert's"
    named = set().union(*named_objects(bucket, name).values())
    sizes = bucket.sizes("")
    assert done["pushed_bytes"] == sum(sizes[k] for k in named - set(before)) + sizes[f"entries/{name}/MANIFEST.json"]
    # a fresh process elsewhere loads the same tensors from the bucket
    script = ("import hashlib, json, sys\nfrom pipeline.jobs.load import load\n"
              f"got = load({version!r}, {bucket_url!r}, layout='generic', embodiment={embodiment!r})\n"
              "print(json.dumps({k: hashlib.sha256(t.contiguous().view(-1).view(__import__('torch').uint8).numpy()"
              ".tobytes()).hexdigest() for k, t in got.tensors.items()}))")
    elsewhere = {**os.environ, "GR00T_CACHE": str(tmp_path / "elsewhere")}  # that machine's own local cache
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=elsewhere)
    assert proc.returncode == 0, proc.stderr[-2000:]
    remote = json.loads(proc.stdout.strip().splitlines()[-1])
    import hashlib

    import torch

    want = load(version, tmp_path / "local", layout="generic", embodiment=embodiment)
    assert remote == {k: hashlib.sha256(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
                      for k, t in want.tensors.items()}


@pytest.mark.parametrize("version", VERSIONS_HERE)
def test_workers_read_a_checkpoint_in_the_bucket_and_write_the_entry_there(cluster, s3_url, micro_snapshots, tmp_path,
                                                                           monkeypatch, version):
    """The source in the bucket too (`--snapshot s3://…`): the client plans from ranged reads of the headers, each
    worker reads its own tasks' byte ranges, and the entry is byte for byte the local convert's of the same files
    from a folder."""
    scheduler, hidden = cluster
    monkeypatch.setattr(roots, "DEFAULT_ROOT", hidden / "cache")
    plain = tmp_path / "plain"
    shutil.copytree(micro_snapshots[version], plain)  # the files themselves (an HF snapshot's are links into blobs/)
    source, bucket_url = f"{s3_url}-cluster-sources/{version}-micro", f"{s3_url}-cluster-from-bucket"
    upload(plain, source)
    opts = dict(layout="generic", embodiments=EMBODIMENT[version], progress=False)
    done = convert(ConvertOptions(None, snapshot=source, scheduler=scheduler, cache_root=bucket_url, **opts))
    assert not done["cache_hit"] and done["source"]["snapshot"] == source
    assert not (hidden / "cache" / "entries").exists()
    local = convert(ConvertOptions(None, snapshot=plain, scheduler="threads", cache_root=tmp_path / "local", **opts))
    assert local["fingerprint"] == done["fingerprint"]
    bucket, folder = open_store(bucket_url), LocalStore(tmp_path / "local")
    name = Path(local["cache_path"]).name
    found = entry_md5s(bucket, name)
    assert len(found) >= done["targets"] > 70 and found == entry_md5s(folder, name)


def test_a_worker_killed_mid_convert_changes_nothing_in_the_entry(cluster, s3_url, snapshots, tmp_path, monkeypatch):
    """A worker process killed (SIGKILL) once the workers have begun putting objects: its nanny starts another,
    Dask reruns what the dead one held, and the entry is byte for byte the local convert's."""
    import signal
    import threading

    from distributed import Client

    scheduler, hidden = cluster
    monkeypatch.setattr(roots, "DEFAULT_ROOT", hidden / "cache")
    bucket_url = f"{s3_url}-cluster-killed"
    opts = dict(layout="generic", embodiments="gr1", progress=False, snapshot=snapshots["n16"])
    with Client(scheduler, timeout=10) as client:
        pids = client.run(os.getpid)
        done: dict = {}
        converting = threading.Thread(target=lambda: done.update(
            convert(ConvertOptions("n16", scheduler=scheduler, cache_root=bucket_url, **opts))))
        converting.start()
        bucket, deadline = open_store(bucket_url), time.time() + 120
        while len(bucket.list("objects")) < 50 and converting.is_alive() and time.time() < deadline:
            time.sleep(0.2)
        victim = sorted(pids.items())[0]
        assert converting.is_alive(), "the convert ended before a worker could be killed"
        os.kill(victim[1], signal.SIGKILL)
        converting.join(300)
        client.wait_for_workers(2, timeout=60)
        assert victim[1] not in client.run(os.getpid).values()  # it did die, and another took its place
    assert done and not done["cache_hit"]
    local = convert(ConvertOptions("n16", scheduler="threads", cache_root=tmp_path / "local", **opts))
    assert local["fingerprint"] == done["fingerprint"]
    name = Path(local["cache_path"]).name
    found = entry_md5s(bucket, name)
    assert len(found) > 900 and found == entry_md5s(LocalStore(tmp_path / "local"), name)


def test_a_local_cache_the_workers_cannot_see_is_one_sentence(cluster, hf_cache):
    scheduler, hidden = cluster
    cache = hidden / "local-cache"
    proc = run_cli("convert", "--version", "n16", "--synthetic", "tiny", "--hf-cache", str(hf_cache), "--embodiments",
                   "gr1", "--scheduler", scheduler, "--cache", str(cache))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert f"error: {cache}/entries/n16-" in proc.stderr and "cannot see this folder" in proc.stderr
    assert "--cache s3://bucket/prefix" in proc.stderr and "a filesystem they share" in proc.stderr
    assert not any(p for p in (cache / "entries").iterdir()), "nothing published, nothing left half-built"
