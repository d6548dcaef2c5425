"""The cluster of tests/test_cluster.py speaking only TLS (its certificates signed by a CA of the test's own): dask's
own configuration carries the certificates, and the README's cluster lines run as written."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.inputs.synth import fine_tune_form
from pipeline.jobs.convert import ConvertOptions, convert
from tasks.entries.cache_root import open_store
from tasks.entries.store import LocalStore
from tests.buckets import entry_md5s, upload
from tests.clusters import NEEDS_ROOT, certificates, started_cluster
from tests.conftest import ROOT, run_cli

pytestmark = NEEDS_ROOT


@pytest.fixture(scope="module")
def tls_cluster(s3_url, tmp_path_factory):
    """A cluster that speaks only TLS, its certificates signed by a CA of the test's own."""
    hidden = tmp_path_factory.mktemp("client-only-tls")
    tls = certificates(tmp_path_factory.mktemp("certificates"))
    with started_cluster(hidden, tls=tls, workers=1) as address:
        yield address, hidden, tls


def test_a_cluster_that_speaks_only_tls_converts_with_dasks_own_configuration(tls_cluster, s3_url, hf_cache,
                                                                             tmp_path):
    """`--scheduler tls://…` with the certificates where dask's configuration puts them (here its environment
    variables, as `dask scheduler --tls-*` takes them): the entry goes into the bucket. Without them: one
    sentence, exit 2, nothing sent."""
    scheduler, hidden, tls = tls_cluster
    url = f"{s3_url}-cluster-tls"
    args = ("convert", "--version", "n16", "--synthetic", "micro", "--hf-cache", str(hf_cache), "--embodiments", "gr1",
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
    local = convert(ConvertOptions("n16", layout="generic", embodiments="gr1", hf_cache=hf_cache, synthetic="micro",
                                   cache_root=tmp_path / "local", progress=False))
    name = Path(local["cache_path"]).name
    assert entry_md5s(open_store(url), name) == entry_md5s(LocalStore(tmp_path / "local"), name)


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
    # the micro stand-in (the README names no scale: its checkpoint is the user's, at the same path on every machine)
    snapshot = next((hf_cache / "models--gr00t-tt-synthetic--GR00T-N1.6-3B-micro" / "snapshots").iterdir())
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
