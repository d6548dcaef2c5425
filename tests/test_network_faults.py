"""The object store through a network that fails (issue 63): moto's S3 server behind tests/faulty_network.py's
proxy, which cuts connections mid-request and mid-response, answers 503 SlowDown and stalls, at rates of its own.

Each command either gives what it gives on a good network (an entry byte for byte a fault-free convert's, the same
tensors, exit 0) or, once the retries run out, one sentence that calls it a network fault, exit 2, nothing
published. A hang fails its test: every test here has a watchdog (pytest-timeout), as every test of the suite does.
The tests of a cluster's workers through the same proxy are in tests/test_cluster.py."""

from __future__ import annotations

import os
import pickle

import pytest
import torch

from pipeline.jobs.convert import ConvertOptions, convert
from pipeline.jobs.load import load
from tasks.entries.cache_root import open_store
from tasks.entries.store import LocalStore
from tasks.io.network import STALL_ENV
from tests.buckets import entry_md5s, forget_s3_clients, upload
from tests.conftest import run_cli
from tests.faulty_network import FaultyProxy

# 2% of requests cut mid-request, 2% cut mid-response, 2% throttled, 0.5% stalled past the stall limit; and 2% of
# those that ask for `100 Continue` cut during that interim response (none do here: botocore looped forever on it)
BAD = dict(cut_request=0.02, cut_response=0.02, slowdown=0.02, stall=0.005, cut_interim=0.02)
STALL = "1"  # seconds: the proxy stalls for 3

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def bad_network(s3_url, monkeypatch):
    """The proxy in front of moto, every request of this process through it, with a stall limit of 1 s."""
    moto = os.environ["AWS_ENDPOINT_URL"]
    proxy = FaultyProxy(int(moto.rsplit(":", 1)[1]), seed=63)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    monkeypatch.setenv(STALL_ENV, STALL)
    forget_s3_clients()
    proxy.moto = moto
    yield proxy
    proxy.close()
    forget_s3_clients()


def _through(proxy: FaultyProxy, **env: str) -> dict:
    """The environment a command through the proxy runs in (run_cli)."""
    return {**os.environ, "AWS_ENDPOINT_URL": proxy.url, STALL_ENV: STALL, **env}


@pytest.mark.timeout(60)
def test_a_put_is_sent_without_waiting_for_an_interim_response_that_can_be_cut(bad_network):
    """botocore asks S3 for `100 Continue` before a PUT's body, and loops forever when the connection closes in
    the middle of that interim response (the hang of issue 63). A PUT here never asks: with every interim
    response cut, the objects still go in, whole."""
    bad_network.set(cut_interim=1.0)
    store = open_store("s3://team-weights/interim")
    data = {f"objects/{i}": os.urandom(40_000 + i) for i in range(8)}
    store.put_many(data)
    store.put("refs/one.json", b"{}")
    assert bad_network.asked_to_continue == 0 and bad_network.requests >= 9
    bad_network.set()
    assert {k: store.get(k) for k in data} == data


def test_convert_load_verify_and_gc_through_a_bad_network_give_what_a_good_one_does(bad_network, s3_url, hf_cache,
                                                                                    tmp_path, monkeypatch):
    """Into the bucket through 2% cuts each way, 2% SlowDown and stalls: the entry is byte for byte a local
    convert's, the summary counts the retries, a load gives the same tensors, and `cache verify` and `cache gc`
    through the same network exit 0 and remove nothing."""
    monkeypatch.setenv("GR00T_CACHE", str(tmp_path / "client"))
    opts = dict(layout="generic", embodiments="gr1,new_embodiment", hf_cache=hf_cache, synthetic="micro",
                progress=False)
    url = f"{s3_url}-faults"
    bad_network.set(**BAD)
    done = convert(ConvertOptions("n16", cache_root=url, **opts))
    assert not done["cache_hit"] and sum(done["store_retries"].values()) > 0, done.get("store_retries")
    local = convert(ConvertOptions("n16", cache_root=tmp_path / "local", **opts))
    name = local["cache_path"].rsplit("/", 1)[1]
    assert done["fingerprint"] == local["fingerprint"]
    bad_network.set()
    bucket = open_store(url)
    assert entry_md5s(bucket, name) == entry_md5s(LocalStore(tmp_path / "local"), name)
    bad_network.set(**BAD)
    faults_before = sum(bad_network.counts.values())
    remote = load("n16", url, "new_embodiment", layout="generic", entry=name)
    want = load("n16", tmp_path / "local", "new_embodiment", layout="generic", entry=name)
    assert remote.tensors.keys() == want.tensors.keys()
    for tensor, t in want.tensors.items():
        assert torch.equal(remote.tensors[tensor].view(torch.int16), t.view(torch.int16)), tensor
    assert sum(bad_network.counts.values()) > faults_before and "store_retries" in remote.stats
    env = _through(bad_network, GR00T_CACHE=str(tmp_path / "client"))
    verified = run_cli("cache", "verify", name, "--cache", url, env=env, timeout=240)
    assert verified.returncode == 0 and "Traceback" not in verified.stderr, verified.stderr[-2000:]
    collected = run_cli("cache", "gc", "--grace-hours", "0", "--cache", url, env=env, timeout=240)
    assert collected.returncode == 0 and "Traceback" not in collected.stderr, collected.stderr[-2000:]
    bad_network.set()
    assert entry_md5s(bucket, name) == entry_md5s(LocalStore(tmp_path / "local"), name)  # nothing removed


def test_a_checkpoint_in_the_bucket_converts_through_a_bad_network(bad_network, s3_url, micro_snapshots, tmp_path):
    """`--snapshot s3://…`: its headers, index and ranged reads of its tensors through the same faults; the entry
    is the same, file for file, as the same files' from a folder."""
    import shutil

    plain = tmp_path / "plain"
    shutil.copytree(micro_snapshots["n16"], plain)
    source = f"{s3_url}-fault-sources/n16"
    upload(plain, source)
    common = ("--embodiments", "gr1", "--layout", "generic", "--json")
    bad_network.set(**BAD)
    remote = run_cli("convert", "--snapshot", source, "--cache", str(tmp_path / "a"), *common,
                     env=_through(bad_network), timeout=240)
    assert remote.returncode == 0 and "Traceback" not in remote.stderr, remote.stderr[-3000:]
    here = run_cli("convert", "--snapshot", str(plain), "--cache", str(tmp_path / "b"), *common)
    assert here.returncode == 0, here.stderr[-3000:]
    import json

    got, want = json.loads(remote.stdout), json.loads(here.stdout)
    assert got["fingerprint"] == want["fingerprint"] and sum(got["store_retries"].values()) > 0
    a, b = LocalStore(tmp_path / "a"), LocalStore(tmp_path / "b")
    prefix = f"entries/{got['cache_path'].rsplit('/', 1)[1]}"
    files = [k for k in b.sizes(prefix) if not k.endswith(("MANIFEST.json", "/zarr.json")) or k.count("/") > 2]
    assert len(files) > 100 and all(a.get(k) == b.get(k) for k in files)


def json_of(proc) -> dict:
    import json

    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_a_workers_error_reaches_the_client_as_the_same_sentence():
    """A worker's error crosses to the client pickled, with tblib's help, as distributed sends it: the error an
    object store's refusal becomes (raised while botocore's own is handled) arrives as itself, the one sentence,
    not as `Exception("CacheError(...)")`."""
    import tblib.pickling_support
    from botocore.exceptions import NoCredentialsError

    from tasks.errors import CacheError, CheckpointError, without_library_causes

    def refused():
        try:
            raise NoCredentialsError()
        except NoCredentialsError:
            raise CacheError("s3://b/x: no credentials for the object store; set AWS_ACCESS_KEY_ID")

    def truncated():
        try:
            raise NoCredentialsError()
        except NoCredentialsError as e:
            raise CheckpointError("s3://b/model.safetensors", "could not be read", key="a.weight") from e

    for task, kind in ((refused, CacheError), (truncated, CheckpointError)):
        try:
            without_library_causes(task)
        except kind as e:
            raised = e
        tblib.pickling_support.install(raised)
        back = pickle.loads(pickle.dumps(raised))
        assert type(back) is kind and str(back) == str(raised)


def test_what_is_a_network_fault_and_what_is_not():
    """Only the network's faults are retried: a cut, a timeout, an endpoint out of reach, 5xx and SlowDown. A
    refusal, a missing key, missing credentials, or a file whose name holds '503' are not, and are said at once."""
    import errno

    from botocore.exceptions import (ClientError, ConnectionClosedError, EndpointConnectionError,
                                      NoCredentialsError, ReadTimeoutError, ResponseStreamingError)

    from tasks.io.network import CUT, SERVER, THROTTLED, TIMEOUT, UNREACHABLE, ShortBody, fault_of

    def answer(code: str, status: int) -> ClientError:
        return ClientError({"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject")

    network = {ConnectionClosedError(endpoint_url="http://x"): CUT, ResponseStreamingError(error="broken"): CUT,
               ShortBody("ended early"): CUT, ConnectionResetError(): CUT, BrokenPipeError(): CUT,
               ReadTimeoutError(endpoint_url="http://x"): TIMEOUT, TimeoutError(): TIMEOUT,
               EndpointConnectionError(endpoint_url="http://x"): UNREACHABLE, ConnectionRefusedError(): UNREACHABLE,
               answer("SlowDown", 503): THROTTLED, answer("ServiceUnavailable", 503): THROTTLED,
               answer("InternalError", 500): SERVER, answer("502", 502): SERVER,
               OSError(errno.EBUSY, "Please reduce your request rate."): THROTTLED}
    for error, fault in network.items():
        assert fault_of(error) == fault, error
    for error in (answer("NoSuchKey", 404), answer("AccessDenied", 403), NoCredentialsError(), PermissionError(),
                  FileNotFoundError(2, "No such file", "model-00503-of-00009.safetensors"), ValueError("503")):
        assert fault_of(error) is None, error


@pytest.mark.timeout(180)
def test_the_stall_limit_asked_for_is_what_every_request_waits_for(bad_network, s3_url, hf_cache, micro_snapshots,
                                                                   tmp_path, monkeypatch):
    """`stall_seconds=` (`--stall-seconds`) reaches the requests as an argument: to the cache's store, to a checkpoint
    in the bucket (its listing and its reads), on the command line and through the Python API alike, over the
    environment's setting. Here every request stalls for 3 s and the environment says 30: a limit of 0.5 s is what
    each request gives up after, and what the sentence names (a limit of 30 would see the proxy close the
    connection at 3 s instead: a cut)."""
    from tasks.errors import PipelineError
    from tasks.io.network import BACKOFF_ENV

    source, url = f"{s3_url}-stall-sources/n16", f"{s3_url}-stall"
    upload(micro_snapshots["n16"], source)
    convert(ConvertOptions("n16", embodiments="gr1", hf_cache=hf_cache, synthetic="micro", cache_root=url,
                           progress=False))
    monkeypatch.setenv(STALL_ENV, "30")
    monkeypatch.setenv(BACKOFF_ENV, "0.01")
    bad_network.set(stall=1.0)
    with pytest.raises(PipelineError, match=r"no byte moved within the stall limit of 0\.5 s \(--stall-seconds\)"):
        load("n16", url, "gr1", synthetic=True, stall_seconds=0.5)
    with pytest.raises(PipelineError, match=r"no byte moved within the stall limit"):
        convert(ConvertOptions("n16", embodiments="gr1", snapshot=source, cache_root=tmp_path / "c", progress=False,
                               stall_seconds=0.5))
    listed = run_cli("cache", "ls", "--cache", url, "--stall-seconds", "0.5",
                     env=_through(bad_network, **{STALL_ENV: "30", BACKOFF_ENV: "0.01"}), timeout=120)
    assert listed.returncode == 2 and "Traceback" not in listed.stderr, listed.stderr[-2000:]
    assert "no byte moved within the stall limit of 0.5 s (--stall-seconds)" in listed.stderr, listed.stderr
