"""A Dask cluster whose workers share nothing with the client but the bucket (issue 49), as one machine can stand it
in: moto's S3 server (tests/conftest.py), a `dask scheduler`, and two `dask worker` processes, each in a mount
namespace of its own (`unshare -m`, root) with an empty tmpfs over the client's cache folder, as a worker on another
machine sees it. The checkpoint is in a folder all of them can read, or in the bucket.

- Into the bucket: the workers put every object themselves, and the entry is byte for byte what a local convert
  of the same source makes; a fresh process loads the same tensors from the bucket.
- Into a local cache folder: one sentence naming the folder and the remedy, exit 2, nothing published."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.cache import roots
from pipeline.inputs.synth import fine_tune_form
from pipeline.jobs.convert import ConvertOptions, convert
from pipeline.jobs.load import load
from tasks.entries.cache_root import open_store
from tasks.entries.store import LocalStore
from tests.required import needs
from tests.buckets import entry_md5s, forget_s3_clients, named_objects, upload
from tests.conftest import ROOT, _free_port, run_cli

# `make test` runs N1.6's; GR00T_CLUSTER_VERSIONS=all runs every version (issue 49's "for every version")
VERSIONS_HERE = ["n15", "n16", "n17"] if os.environ.get("GR00T_CLUSTER_VERSIONS") == "all" else ["n16"]
EMBODIMENT = {"n15": "gr1", "n16": "gr1", "n17": "new_embodiment"}

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason=needs(
    "cluster", "workers in mount namespaces of their own need root and unshare (CI has both)"))


@contextlib.contextmanager
def _started_cluster(hidden: Path, worker_env: dict | None = None, tls: dict | None = None, workers: int = 2):
    """A `dask scheduler` and `workers` `dask worker`s, each in a mount namespace of its own with an empty tmpfs
    over `hidden` (the client's folder); yields the scheduler's address. `worker_env`: the workers' environment
    (default this process's); `tls`: dask's `--tls-*` options (ca-file, cert, key), then the address is tls://."""
    port = _free_port()
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    scheme = "tls" if tls else "tcp"
    security = [f"--tls-{k}={v}" for k, v in (tls or {}).items()]
    procs = [subprocess.Popen([str(bin_dir / "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(port),
                               "--no-dashboard", *(["--protocol", "tls"] if tls else []), *security], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    worker = (f"mount -t tmpfs client-only {hidden} && exec {bin_dir / 'dask'} worker {scheme}://127.0.0.1:{port} "
              f"--nthreads 1 --nworkers 1 --no-dashboard --memory-limit 0 {' '.join(security)}")
    for _ in range(workers):  # another machine: its own view of the filesystem, the client's cache folder empty there
        procs.append(subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", worker],
                                      env={**(os.environ if worker_env is None else worker_env),
                                           "PYTHONPATH": str(ROOT)},
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    try:
        from distributed import Client

        deadline = time.time() + 60
        while True:
            try:
                with Client(f"{scheme}://127.0.0.1:{port}", timeout=5, security=_client_security(tls)) as client:
                    client.wait_for_workers(workers, timeout=60)
                    seen = client.run(lambda path: os.listdir(path), str(hidden))
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.5)
        (hidden / "marker").write_text("the client's")
        assert seen and all(listing == [] for listing in seen.values())  # each worker sees an empty tmpfs there
        yield f"{scheme}://127.0.0.1:{port}"
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=5)  # a TLS worker asked to stop took 20 s, retrying its scheduler meanwhile
            except subprocess.TimeoutExpired:
                proc.kill()


def _client_security(tls: dict | None):
    if not tls:
        return None
    from distributed.security import Security

    return Security(tls_ca_file=tls["ca-file"], tls_client_cert=tls["cert"], tls_client_key=tls["key"],
                    require_encryption=True)


@pytest.fixture(scope="module")
def cluster(s3_url, tmp_path_factory):
    """(scheduler address, the client's cache folder the workers cannot see)."""
    hidden = tmp_path_factory.mktemp("client-only")
    with _started_cluster(hidden) as address:
        yield address, hidden


@pytest.mark.parametrize("version", VERSIONS_HERE)
def test_workers_on_other_machines_write_the_entry_into_the_bucket(cluster, s3_url, hf_cache, tmp_path, monkeypatch,
                                                                   version):
    scheduler, hidden = cluster
    monkeypatch.setattr(roots, "DEFAULT_ROOT", hidden / "cache")  # the client's own folder: no worker sees it
    bucket_url = f"{s3_url}-cluster"
    embodiment = EMBODIMENT[version]
    opts = dict(layout="generic", embodiments=f"{embodiment},new_embodiment" if version == "n16" else embodiment,
                hf_cache=hf_cache, synthetic="tiny", progress=False)
    before = open_store(bucket_url).sizes("objects")
    done = convert(ConvertOptions(version, scheduler=scheduler, cache_root=bucket_url, **opts))
    assert not done["cache_hit"] and done["cache_path"].startswith(f"{bucket_url}/entries/")
    assert not (hidden / "cache" / "entries").exists()  # nothing built on the client's disk
    local = convert(ConvertOptions(version, scheduler="threads", cache_root=tmp_path / "local", **opts))
    assert local["fingerprint"] == done["fingerprint"]
    bucket, folder = open_store(bucket_url), LocalStore(tmp_path / "local")
    name = Path(local["cache_path"]).name
    found = entry_md5s(bucket, name)
    assert len(found) >= done["targets"] > 700  # a chunk for every target at least
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
def test_workers_read_a_checkpoint_in_the_bucket_and_write_the_entry_there(cluster, s3_url, snapshots, tmp_path,
                                                                           monkeypatch, version):
    """The source in the bucket too (`--snapshot s3://…`): the client plans from ranged reads of the headers, each
    worker reads its own tasks' byte ranges, and the entry is byte for byte the local convert's of the same files
    from a folder."""
    scheduler, hidden = cluster
    monkeypatch.setattr(roots, "DEFAULT_ROOT", hidden / "cache")
    plain = tmp_path / "plain"
    shutil.copytree(snapshots[version], plain)  # the files themselves (an HF snapshot's are links into blobs/)
    source, bucket_url = f"{s3_url}-cluster-sources/{version}-tiny", f"{s3_url}-cluster-from-bucket"
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
    assert len(found) >= done["targets"] > 700 and found == entry_md5s(folder, name)


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


def test_the_readmes_cluster_lines_run_as_written(tls_cluster, s3_url, hf_cache, tmp_path):
    """README "On a cluster whose workers share only the bucket": each `python -m pipeline` line, with this test's
    TLS scheduler, certificates, bucket and checkpoint in place of the README's; the `dask` lines are what the
    fixture runs, and the `export` line's variables are set to the fixture's certificates."""
    import re

    scheduler, hidden, tls = tls_cluster
    block = re.search(r"### On a cluster whose workers share only the bucket\n.*?```sh\n(.*?)```",
                      (ROOT / "README.md").read_text(), re.S).group(1)
    lines = [line for line in block.splitlines() if line.startswith("python -m pipeline")]
    assert [line.split()[3] for line in lines] == ["convert", "convert", "load"]
    assert any(line.startswith("dask worker tls://scheduler-host:8786 --tls-ca-file") for line in block.splitlines())
    exported = dict(item.split("=", 1) for line in block.splitlines() if line.startswith("export ")
                    for item in line.split()[1:])
    files = {"ca.pem": tls["ca-file"], "node.pem": tls["cert"], "node.key": tls["key"]}
    assert set(exported) == {"DASK_DISTRIBUTED__COMM__TLS__CA_FILE", "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT",
                             "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY"}
    snapshot = next((hf_cache / "models--gr00t-tt-synthetic--GR00T-N1.6-3B-tiny" / "snapshots").iterdir())
    shared = tmp_path / "shared" / "GR00T-N1.6-3B"  # a folder every worker reads at the same path
    shutil.copytree(snapshot, shared)
    # a fine-tune of it, as a trainer synced it to the bucket: converted (not the first line's entry again)
    upload(fine_tune_form(snapshot, "n16", "mixed", tmp_path / "my-finetune"), f"{s3_url}-readme-sources/my-finetune")
    env = {**os.environ, "GR00T_CACHE": str(hidden / "readme-cache"), "HF_HUB_OFFLINE": "1",
           **{k: files[v] for k, v in exported.items()}}
    for line in lines:
        cmd = (line.replace("python -m pipeline", f"{sys.executable} -m pipeline", 1)
               .replace("tls://scheduler-host:8786", scheduler).replace("s3://team-weights/gr00t", f"{s3_url}-readme")
               .replace("s3://team-weights/checkpoints", f"{s3_url}-readme-sources")
               .replace("/shared/GR00T-N1.6-3B", str(shared)))
        proc = subprocess.run(cmd, shell=True, cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
        assert proc.returncode == 0, (line, proc.stderr[-2000:])
    assert "loaded" in proc.stdout or "tensors" in proc.stdout, proc.stdout[-1000:]
    assert len(open_store(f"{s3_url}-readme").children("entries")) == 2  # the release's entry and the fine-tune's


# Through a network that fails (issue 63): the workers reach the bucket through tests/faulty_network.py's proxy.
@pytest.fixture(scope="module")
def faulty_cluster(s3_url, tmp_path_factory):
    """(scheduler address, the client's folder, the proxy every worker's requests go through)."""
    from tests.faulty_network import FaultyProxy

    proxy = FaultyProxy(int(os.environ["AWS_ENDPOINT_URL"].rsplit(":", 1)[1]), seed=64)
    hidden = tmp_path_factory.mktemp("client-only-faulty")
    try:
        with _started_cluster(hidden, {**os.environ, "AWS_ENDPOINT_URL": proxy.url}) as address:
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
    opts = dict(layout="generic", embodiments="gr1", hf_cache=hf_cache, synthetic="tiny", progress=False)
    proxy.set(**BAD)
    done = convert(ConvertOptions("n16", scheduler=scheduler, cache_root=url, **opts))
    proxy.set()
    assert not done["cache_hit"] and sum(done["store_retries"].values()) > 0, done.get("store_retries")
    local = convert(ConvertOptions("n16", scheduler="threads", cache_root=tmp_path / "local", **opts))
    name = Path(local["cache_path"]).name
    assert done["fingerprint"] == local["fingerprint"]
    found = entry_md5s(open_store(url), name)
    assert len(found) > 700 and found == entry_md5s(LocalStore(tmp_path / "local"), name)


@pytest.fixture(scope="module")
def uncredentialed_cluster(s3_url, tmp_path_factory):
    """Workers started without the store's credentials (exported in the client's shell only)."""
    hidden = tmp_path_factory.mktemp("client-only-uncredentialed")
    bare = {k: v for k, v in os.environ.items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    bare.update(AWS_CONFIG_FILE=str(hidden / "none"), AWS_SHARED_CREDENTIALS_FILE=str(hidden / "none"),
                AWS_EC2_METADATA_DISABLED="true")
    with _started_cluster(hidden, bare) as address:
        yield address, hidden


def test_a_worker_without_credentials_is_named_in_one_sentence(uncredentialed_cluster, s3_url, hf_cache):
    """The client has credentials, the workers none: one sentence naming a worker, what it lacks and the remedy,
    before any task runs; exit 2, nothing in the bucket."""
    scheduler, hidden = uncredentialed_cluster
    url = f"{s3_url}-cluster-uncredentialed"
    proc = run_cli("convert", "--version", "n16", "--synthetic", "tiny", "--hf-cache", str(hf_cache), "--embodiments",
                   "gr1", "--layout", "generic", "--scheduler", scheduler, "--cache", url,
                   env={**os.environ, "GR00T_CACHE": str(hidden / "cache")})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith(f"error: the Dask worker tcp://127.0.0.1:") and f"cannot use {url} (2 of" in proc.stderr
    assert "no credentials for the object store" in proc.stderr and "in its own environment" in proc.stderr
    assert open_store(url).sizes("") == {}


def _certificates(folder: Path) -> dict:
    """A self-signed CA and one certificate it signed for 127.0.0.1, as dask's `--tls-*` options take them."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    def name(text):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("test CA")).issuer_name(name("test CA"))
          .public_key(ca_key.public_key()).serial_number(1).not_valid_before(now)
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True).sign(ca_key, hashes.SHA256()))
    cert = (x509.CertificateBuilder().subject_name(name("127.0.0.1")).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(2).not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False).sign(ca_key, hashes.SHA256()))
    paths = {"ca-file": folder / "ca.pem", "cert": folder / "cert.pem", "key": folder / "key.pem"}
    paths["ca-file"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
    return {k: str(v) for k, v in paths.items()}


@pytest.fixture(scope="module")
def tls_cluster(s3_url, tmp_path_factory):
    """A cluster that speaks only TLS, its certificates signed by a CA of the test's own."""
    hidden = tmp_path_factory.mktemp("client-only-tls")
    tls = _certificates(tmp_path_factory.mktemp("certificates"))
    with _started_cluster(hidden, tls=tls, workers=1) as address:
        yield address, hidden, tls


def test_a_cluster_that_speaks_only_tls_converts_with_dasks_own_configuration(tls_cluster, s3_url, hf_cache,
                                                                             tmp_path):
    """`--scheduler tls://…` with the certificates where dask's configuration puts them (here its environment
    variables, as `dask scheduler --tls-*` takes them): the entry goes into the bucket. Without them: one
    sentence, exit 2, nothing sent."""
    scheduler, hidden, tls = tls_cluster
    url = f"{s3_url}-cluster-tls"
    args = ("convert", "--version", "n16", "--synthetic", "tiny", "--hf-cache", str(hf_cache), "--embodiments", "gr1",
            "--layout", "generic", "--scheduler", scheduler, "--cache", url, "--json")
    env = {**os.environ, "GR00T_CACHE": str(hidden / "cache")}
    bare = run_cli(*args, env=env)
    assert bare.returncode == 2 and "Traceback" not in bare.stderr, bare.stderr[-3000:]
    assert len(bare.stderr.strip().splitlines()) == 1 and "DASK_DISTRIBUTED__COMM__TLS__CA_FILE" in bare.stderr
    assert open_store(url).sizes("") == {}
    env.update(DASK_DISTRIBUTED__COMM__TLS__CA_FILE=tls["ca-file"], DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT=tls["cert"],
               DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY=tls["key"], DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION="True")
    done = run_cli(*args, env=env)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert not summary["cache_hit"] and summary["cache_path"].startswith(f"{url}/entries/")
    local = convert(ConvertOptions("n16", layout="generic", embodiments="gr1", hf_cache=hf_cache, synthetic="tiny",
                                   cache_root=tmp_path / "local", progress=False))
    name = Path(local["cache_path"]).name
    assert entry_md5s(open_store(url), name) == entry_md5s(LocalStore(tmp_path / "local"), name)
