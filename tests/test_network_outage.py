"""A network that never lets a request through (tests/faulty_network.py's proxy at 100%): each command ends in one
sentence and nothing is published. A file of its own beside tests/test_network_faults.py, whose proxy it uses, so
that the two run side by side."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tasks.entries.cache_root import open_store
from tests.buckets import manifest_doc
from tests.conftest import run_cli
from tests.test_network_faults import _through, bad_network, json_of  # noqa: F401 (bad_network: a fixture)

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("fault,said", [("cut_response", "the connection was cut"),
                                        ("slowdown", "the store answered 503 SlowDown (throttled)"),
                                        ("stall", "no byte moved within the stall limit of 1 s")])
def test_a_network_that_never_lets_a_request_through_is_one_sentence_and_nothing_is_published(
        bad_network, s3_url, hf_cache, tmp_path, fault, said):
    """Every request cut, throttled or stalled: the convert, a load of an entry that is there and `cache verify`
    each end in one sentence naming the object and what happened, exit 2; never 'corrupt', never --force; and
    the convert published nothing. (Throttled and stalled, the load alone: each command waits out its retries,
    a throttled one four times as long.)"""
    url = f"{s3_url}-never-{fault}"
    env = _through(bad_network, GR00T_CACHE=str(tmp_path / "client"))
    common = ("--version", "n16", "--synthetic", "micro", "--hf-cache", str(hf_cache), "--layout", "generic")
    direct = {**env, "AWS_ENDPOINT_URL": bad_network.moto}  # the entry that is there is made without the proxy
    made = run_cli("convert", *common, "--embodiments", "gr1", "--cache", url, env=direct)
    assert made.returncode == 0, made.stderr[-2000:]
    entry = json_of(run_cli("cache", "ls", "--cache", url, "--json", env=direct))["entries"][0]["entry"]
    bad_network.set(**{fault: 1.0})
    commands = {"load": ("load", "--version", "n16", "--layout", "generic", "--embodiment", "gr1", "--cache", url)}
    source = f"{s3_url}-never-sources/n16"  # a checkpoint in the bucket (a probe at 100% cuts found a traceback)
    if fault == "cut_response":
        commands["convert"] = ("convert", *common, "--embodiments", "new_embodiment", "--cache", url)
        commands["verify"] = ("cache", "verify", entry, "--cache", url)
    if fault != "slowdown":  # s3fs lists the folder, with its own tries, and botocore's (44 s, and 60 s a stall) off
        commands["inspect"] = ("inspect", "--snapshot", source)
    with ThreadPoolExecutor(len(commands)) as pool:  # side by side: each mostly waits out its retries
        runs = dict(zip(commands, pool.map(lambda args: run_cli(*args, env=env), commands.values())))
    inspected = runs.pop("inspect", None)
    for command, proc in runs.items():
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, (command, proc.stderr[-2000:])
        assert lines[-1].startswith(f"error: {url}/") and said in lines[-1], (command, lines[-1])
        assert "corrupt" not in lines[-1] and "--force" not in lines[-1] and "network fault" in lines[-1]
        assert len([line for line in lines if line.startswith("error:")]) == 1
    if inspected is not None:
        lines = inspected.stderr.strip().splitlines()
        assert inspected.returncode == 2 and "Traceback" not in inspected.stderr, inspected.stderr[-2000:]
        assert len(lines) == 1 and lines[0].startswith(f"error: {source}") and "network fault" in lines[0], lines
    bad_network.set()
    bucket = open_store(url)
    assert len(bucket.children("entries")) == 1  # the new_embodiment entry was not published
    assert manifest_doc(bucket, entry) is not None
