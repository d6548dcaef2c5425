"""The cluster of tests/test_cluster.py through a network that fails, and with workers that lack the bucket's
credentials."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline.cache import roots
from pipeline.jobs.convert import ConvertOptions, convert
from tasks.entries.cache_root import open_store
from tasks.entries.store import LocalStore
from tests.buckets import entry_md5s, forget_s3_clients
from tests.clusters import NEEDS_ROOT, started_cluster
from tests.conftest import run_cli

pytestmark = NEEDS_ROOT


@pytest.fixture(scope="module")
def faulty_cluster(s3_url, tmp_path_factory):
    """(scheduler address, the client's folder, the proxy every worker's requests go through)."""
    from tests.faulty_network import FaultyProxy

    proxy = FaultyProxy(int(os.environ["AWS_ENDPOINT_URL"].rsplit(":", 1)[1]), seed=64)
    hidden = tmp_path_factory.mktemp("client-only-faulty")
    try:
        with started_cluster(hidden, {**os.environ, "AWS_ENDPOINT_URL": proxy.url}) as address:
            yield address, hidden, proxy
    finally:
        proxy.close()


@pytest.mark.timeout(300)
def test_workers_through_a_bad_network_write_the_entry_a_good_one_does(faulty_cluster, hf_cache, tmp_path,
                                                                     monkeypatch, s3_url, request):
    """Two workers put the entry through 2% cuts each way, 2% SlowDown and stalls past the client's stall limit
    (which the workers take from the client: theirs is unset): the entry is byte for byte a local convert's, and
    the summary counts the retries the workers made."""
    from tasks.io.network import STALL_ENV
    from tests.test_network_faults import BAD

    scheduler, hidden, proxy = faulty_cluster
    monkeypatch.setattr(roots, "DEFAULT_ROOT", hidden / "cache")
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    request.addfinalizer(forget_s3_clients)  # the s3fs filesystems made meanwhile hold the proxy's endpoint
    forget_s3_clients()
    monkeypatch.setenv(STALL_ENV, "1")
    url = f"{s3_url}-cluster-faults"
    opts = dict(layout="generic", embodiments="gr1", hf_cache=hf_cache, synthetic="micro", progress=False)
    proxy.set(**BAD)
    done = convert(ConvertOptions("n16", scheduler=scheduler, cache_root=url, **opts))
    proxy.set()
    assert not done["cache_hit"] and sum(done["store_retries"].values()) > 0, done.get("store_retries")
    local = convert(ConvertOptions("n16", scheduler="threads", cache_root=tmp_path / "local", **opts))
    name = Path(local["cache_path"]).name
    assert done["fingerprint"] == local["fingerprint"]
    found = entry_md5s(open_store(url), name)
    assert len(found) > 70 and found == entry_md5s(LocalStore(tmp_path / "local"), name)


@pytest.fixture(scope="module")
def uncredentialed_cluster(s3_url, tmp_path_factory):
    """Workers started without the store's credentials (exported in the client's shell only)."""
    hidden = tmp_path_factory.mktemp("client-only-uncredentialed")
    bare = {k: v for k, v in os.environ.items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    bare.update(AWS_CONFIG_FILE=str(hidden / "none"), AWS_SHARED_CREDENTIALS_FILE=str(hidden / "none"),
                AWS_EC2_METADATA_DISABLED="true")
    with started_cluster(hidden, bare) as address:
        yield address, hidden


def test_a_worker_without_credentials_is_named_in_one_sentence(uncredentialed_cluster, s3_url, hf_cache):
    """The client has credentials, the workers none: one sentence naming a worker, what it lacks and the remedy,
    before any task runs; exit 2, nothing in the bucket."""
    scheduler, hidden = uncredentialed_cluster
    url = f"{s3_url}-cluster-uncredentialed"
    proc = run_cli("convert", "--version", "n16", "--synthetic", "micro", "--hf-cache", str(hf_cache), "--embodiments",
                   "gr1", "--layout", "generic", "--scheduler", scheduler, "--cache", url,
                   env={**os.environ, "GR00T_CACHE": str(hidden / "cache")})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith(f"error: the Dask worker tcp://127.0.0.1:") and f"cannot use {url} (2 of" in proc.stderr
    assert "no credentials for the object store" in proc.stderr and "in its own environment" in proc.stderr
    assert open_store(url).sizes("") == {}
