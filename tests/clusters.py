"""A Dask cluster on one machine standing in for many (tests/test_cluster*.py): a `dask scheduler` and `dask
worker` processes, each worker in a mount namespace of its own (`unshare -m`, root) with an empty tmpfs over the
client's folder, as a worker on another machine sees it; and the certificates of a cluster that speaks only TLS."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.required import needs
from tests.conftest import ROOT, _free_port

# `make test` runs N1.6's; GR00T_CLUSTER_VERSIONS=all runs every version (issue 49's "for every version")
VERSIONS_HERE = ["n15", "n16", "n17"] if os.environ.get("GR00T_CLUSTER_VERSIONS") == "all" else ["n16"]
EMBODIMENT = {"n15": "gr1", "n16": "gr1", "n17": "new_embodiment"}

NEEDS_ROOT = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason=needs(
    "cluster", "workers in mount namespaces of their own need root and unshare (CI has both)"))


@contextlib.contextmanager
def started_cluster(hidden: Path, worker_env: dict | None = None, tls: dict | None = None, workers: int = 2):
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
                with Client(f"{scheme}://127.0.0.1:{port}", timeout=5, security=client_security(tls)) as client:
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
        deadline = time.monotonic() + 5  # a TLS worker asked to stop took 20 s, retrying its scheduler meanwhile
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def client_security(tls: dict | None):
    if not tls:
        return None
    from distributed.security import Security

    return Security(tls_ca_file=tls["ca-file"], tls_client_cert=tls["cert"], tls_client_key=tls["key"],
                    require_encryption=True)



def certificates(folder: Path) -> dict:
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
