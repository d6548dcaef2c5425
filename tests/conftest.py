"""Shared fixtures: tiny synthetic checkpoints of every version (made once per session) and a fresh cache root."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from pipeline.snapshot import resolve_snapshot
from pipeline.synth import synthesize
from pipeline.versions import VERSIONS, load_config
from tasks.device import configure_ttnn_env, hardware_present

configure_ttnn_env(os.environ, hardware_present())
os.environ["HF_HUB_OFFLINE"] = "1"  # the tests never reach the hub; the offline path says what to run


@pytest.fixture(scope="session")
def hf_cache(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hf")
    for version in VERSIONS:
        synthesize(version, root, "tiny")
    return root


@pytest.fixture(scope="session")
def snapshots(hf_cache) -> dict[str, Path]:
    return {v: resolve_snapshot(load_config(v), hf_cache=hf_cache, synthetic="tiny") for v in VERSIONS}


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


def pytest_terminal_summary(terminalreporter):
    """The reliability suite's table: each bad input or fault, and the one error the user sees for it."""
    from tests.test_reliability import TABLE

    if TABLE:
        terminalreporter.section("reliability: case -> error")
        for case, error in TABLE:
            terminalreporter.write_line(f"{case:40} {error[:150]}")
