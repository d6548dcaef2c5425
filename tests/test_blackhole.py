"""Blackhole P150, the N1.6 port's own board (its README: "Tested on Tenstorrent Blackhole p150a").

1. The device tests run again on a simulated Blackhole (devkit/simulator `bh`), in a child pytest session:
   ttnn fixes its simulator when it is imported, so one process holds one architecture. Every upload and readback
   byte for byte against the entry's `.tensorbin`, `load(..., into=device)`, `convert --device`, `--device auto`
   naming the architecture, and the port's own model built on the device both ways (tests/test_port_handoff.py).
2. Entries do not depend on the architecture: tests/test_blackhole_entries.py (a file of its own, so that the two
   run side by side).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from devkit import simulator

from tests.required import needs
from tests.conftest import ROOT
DEVICE_TESTS = ["tests/test_simulated_device.py",
                "tests/test_port_handoff.py::test_the_whole_model_two_ways_on_the_simulated_device",
                "tests/test_port_handoff.py::test_a_mixed_precision_fine_tune_two_ways[simulated device]"]
# (its [host] case is the parent session's: the host knows no architecture)


def test_the_device_tests_pass_on_a_simulated_blackhole(tmp_path):
    reason = simulator.unavailable_reason("bh")
    if reason or os.environ.get("GR00T_TEST_SIMULATOR") == "0":
        pytest.skip(needs("simulator", reason or "GR00T_TEST_SIMULATOR=0: the mock cluster only"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TT_METAL_", "PYTEST_XDIST"))}
    env["GR00T_TEST_DEVICE"] = "bh"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "--basetemp", str(tmp_path / "session"), *DEVICE_TESTS], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    tail = proc.stdout.strip().splitlines()[-3:]
    assert proc.returncode == 0, "\n".join(proc.stdout.splitlines()[-40:]) + proc.stderr[-2000:]
    summary = next(line for line in reversed(proc.stdout.splitlines()) if re.search(r"\d+ passed", line))
    assert "skipped" not in summary and "deselected" not in summary, tail
    assert int(re.search(r"(\d+) passed", summary).group(1)) >= 7 + 1 + 1, summary
