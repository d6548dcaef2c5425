"""Shared fixtures: tiny synthetic checkpoints of every version (made once per session), a fresh cache root, a
folder on the disk; and where the run's temporaries go."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from pipeline.inputs.snapshot import resolve_snapshot
from pipeline.inputs.synth import synthesize
from pipeline.model.versions import VERSIONS, load_config
from tasks.device.ttnn_edge import configure_ttnn_env, device_present
from devkit import simulator

pytest_plugins = ("tests.required",)  # GR00T_TEST_REQUIRE: a skip for want of a required capability fails

# Where a simulated device can be had (built from ../shared/vendor, or TT_METAL_SIMULATOR), the whole session
# runs against it: ttnn fixes its runtime at import, so one process cannot switch from the mock cluster, or from
# one architecture to another, later. GR00T_TEST_DEVICE picks it: `wh` (a Wormhole N150, the default) or `bh` (a
# Blackhole P150, the port's board; tests/test_blackhole.py runs the device tests again in a child session on it).
TEST_DEVICE = os.environ.setdefault("GR00T_TEST_DEVICE", "wh")
SIMULATED = simulator.use(os.environ, TEST_DEVICE)
configure_ttnn_env(os.environ, device_present())
os.environ["HF_HUB_OFFLINE"] = "1"  # the tests never reach the hub; the offline path says what to run
# Retries wait 0.01 s doubling, not 0.1 s: the fault tests make thousands of them, and wait for none of them to
# learn anything (tasks/io/network.py; the tries, the doubling and the cap are the same)
os.environ.setdefault("GR00T_BACKOFF_SECONDS", "0.01")

# For the tests of the O_DIRECT writer, which tmpfs refuses: /var/tmp is on a disk by convention, where /tmp may not be.
DISK_TMP = Path("/var/tmp") if os.access("/var/tmp", os.W_OK) else Path(tempfile.gettempdir())
RAM_TMP = Path("/dev/shm/gr00t-tt-tests")
RAM_TMP_MIN_FREE = 12 << 30  # a whole run's temporaries peaked at 6.3 GB (-n 2); twice that, or stay on disk


def killed_runs(base: Path) -> list[Path]:
    """The numbered folders of test runs that were killed (`pytest-of-*/pytest-N` under `base`): pytest removes a
    run's `.lock`, which names its process, when the run ends, and keeps a killed run's for three days, in memory
    here, where it pushes later runs onto the disk."""
    import psutil

    killed = []
    for lock in sorted(base.glob("pytest-of-*/pytest-*/.lock")):
        try:
            pid = int(lock.read_text())
        except (OSError, ValueError):
            continue
        if not psutil.pid_exists(pid):
            killed.append(lock.parent)
    return killed


def _temporaries_in_ram(environ) -> str:
    """Put the run's temporaries (tmp_path, and TMPDIR for the commands tests start) on /dev/shm (memory) when it
    is there with room to spare and TMPDIR is not set. A run creates tens of thousands of small files and folders
    (every tiny entry is ~2,000), and on this VM's ext4 each create costs 0.1-0.4 ms of kernel time: `make test`
    took 13:19 with 8:31 of sys time on /tmp, 8:33 with 2:55 on /dev/shm. Returns the reason, for the header."""
    if environ.get("TMPDIR"):
        return f"temporaries in TMPDIR={environ['TMPDIR']}"
    try:
        free = shutil.disk_usage(RAM_TMP.parent).free
    except OSError:
        return f"temporaries in {tempfile.gettempdir()} ({RAM_TMP.parent} is not there)"
    if free < RAM_TMP_MIN_FREE and RAM_TMP.is_dir():  # room a killed run holds is this suite's to take back
        for run in killed_runs(RAM_TMP):
            shutil.rmtree(run, ignore_errors=True)
        free = shutil.disk_usage(RAM_TMP.parent).free
    if free < RAM_TMP_MIN_FREE:
        return (f"temporaries in {tempfile.gettempdir()} ({RAM_TMP.parent} has {free / 2**30:.1f} GiB free, under "
                f"{RAM_TMP_MIN_FREE >> 30})")
    RAM_TMP.mkdir(exist_ok=True)
    environ["TMPDIR"] = tempfile.tempdir = str(RAM_TMP)
    return f"temporaries in {RAM_TMP} (tmpfs; the O_DIRECT writer's tests write to {DISK_TMP})"


TEMPORARIES = _temporaries_in_ram(os.environ)
ROOT = Path(__file__).resolve().parent.parent


def run_cli(*args: str, cwd: Path = ROOT, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """`python -m pipeline ARGS` as a user runs it, offline: in `cwd`, with `env` (default: this session's
    environment, which conftest set up: the simulated device or the mock cluster, temporaries, HF_HUB_OFFLINE)."""
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=cwd, capture_output=True, text=True,
                          env={**(os.environ if env is None else env), "HF_HUB_OFFLINE": "1"}, timeout=timeout)


BUCKET = "team-weights"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def s3_url():
    """A real S3 API: moto's server on 127.0.0.1 (tests/s3_server.py), started once per session (an object store: no
    rename)."""
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "tests.s3_server", "-H", "127.0.0.1", "-p", str(port)],
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    saved = {k: os.environ.get(k) for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                            "AWS_DEFAULT_REGION")}
    os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test",
                      AWS_DEFAULT_REGION="us-east-1")
    try:
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        import boto3  # only here: the one test dependency that needs it, ~0.5 s to import

        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=BUCKET)
        yield f"s3://{BUCKET}/gr00t"
    finally:
        server.terminate()
        server.wait(timeout=10)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="session")
def simulated_device():
    """One simulated device (GR00T_TEST_DEVICE: a Wormhole N150, or a Blackhole P150), opened once per test run;
    skips (with the reason) only where none can be had."""
    if not SIMULATED:
        # tests/required.py `needs("simulator", …)`'s tag, written out: this module loads that plugin
        pytest.skip(f"[simulator] {simulator.unavailable_reason(TEST_DEVICE) or 'the simulator could not be built'}")
    from tasks.device import ttnn_edge

    dev = ttnn_edge.open_device(0)
    yield dev
    ttnn_edge.close_device(dev)


@pytest.fixture(scope="session")
def hf_cache(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hf")
    for version in VERSIONS:
        synthesize(version, root, "tiny")
        synthesize(version, root, "micro")  # for tests to which tiny's thousand targets add only time
    return root


@pytest.fixture(scope="session")
def snapshots(hf_cache) -> dict[str, Path]:
    return {v: resolve_snapshot(load_config(v), hf_cache=hf_cache, synthetic="tiny") for v in VERSIONS}


@pytest.fixture(scope="session")
def micro_snapshots(hf_cache) -> dict[str, Path]:
    """tiny's dims with one or two layers per stack (configs/<version>.toml [dims.micro]): every kind of target and
    every slot, no straddling unit, about a tenth of tiny's files."""
    return {v: resolve_snapshot(load_config(v), hf_cache=hf_cache, synthetic="micro") for v in VERSIONS}


@pytest.fixture
def copy_snapshot(snapshots, tmp_path):
    """A plain (non-HF-cache) copy of a version's snapshot, safe to corrupt."""
    def make(version: str) -> Path:
        dst = tmp_path / f"snap-{version}"
        shutil.copytree(snapshots[version], dst, symlinks=False)
        return dst
    return make


@pytest.fixture
def cache_root(tmp_path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def two_entries(hf_cache, tmp_path):
    """Two micro n17 entries in one cache: slot 10, then slot 0 (the ref moves to it), which shares every non-bank
    chunk with the first by hard link (reuse) -> (root, old, current). Only the commands under test touch them."""
    from pipeline.jobs.convert import ConvertOptions, convert

    old = convert(ConvertOptions("n17", embodiments="10", hf_cache=hf_cache, synthetic="micro", cache_root=tmp_path,
                                 progress=False))
    current = convert(ConvertOptions("n17", embodiments="0", hf_cache=hf_cache, synthetic="micro", cache_root=tmp_path,
                                     progress=False))
    assert current["reused_chunks"] > 0
    return tmp_path, Path(old["cache_path"]).name, Path(current["cache_path"]).name


@pytest.fixture
def disk_path():
    """A temporary folder on the disk, never tmpfs: for tests of the O_DIRECT path, which tmpfs refuses."""
    path = Path(tempfile.mkdtemp(prefix="gr00t-tt-disk-", dir=DISK_TMP))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def pytest_collection_modifyitems(config, items) -> None:
    from tests.file_order import longest_first

    longest_first(items)  # whole files to the xdist workers, the longest first (tests/file_order.py)


def pytest_report_header(config) -> str:
    return TEMPORARIES


def _summary_tables() -> dict[str, list]:
    from tests.test_reliability import TABLE
    from tests.test_trust import TABLE as TRUST

    return {"reliability": TABLE, "trust": TRUST}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Rows a test added to a summary table travel on its report: under pytest-xdist the summary is printed by the
    controller, which runs no test."""
    if call.when == "call":
        for name, table in _summary_tables().items():
            item.user_properties.extend((name, tuple(row)) for row in table)
            table.clear()
    yield


def pytest_terminal_summary(terminalreporter):
    """The reliability suite's table (each bad input or fault, and the one error the user sees for it) and the
    trust suite's (command, sentence, exit code)."""
    rows: dict[str, list] = {"reliability": [], "trust": []}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", None) == "call":
                for name, row in getattr(report, "user_properties", ()):
                    if name in rows:
                        rows[name].append(row)
    if rows["reliability"]:
        terminalreporter.section("reliability: case -> error")
        for case, error in rows["reliability"]:
            terminalreporter.write_line(f"{case:40} {error[:150]}")
    if rows["trust"]:
        terminalreporter.section("trust: command -> sentence (exit code)")
        for case, error, code in rows["trust"]:
            terminalreporter.write_line(f"{case:42} {error[:140]} ({code})")
