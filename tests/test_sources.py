"""Where weights come from: synthetic stand-ins can never pass for NVIDIA's release, the user's HF cache is never
swapped for the project's folder, and the revision read is the one recorded."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.jobs.convert import ConvertOptions, convert
from pipeline.inputs.snapshot import resolve_snapshot
from pipeline.model.versions import load_config
from tasks.source.checkpoint import Checkpoint
from tasks.errors import CheckpointError
from tasks.source.safetensors_file import read_header
from tests.conftest import ROOT, run_cli



def test_a_synthetic_snapshot_has_its_own_repo_and_revision_and_says_so_in_every_file(snapshots):
    snap, cfg = snapshots["n16"], load_config("n16")
    assert snap.parent.parent.name == "models--gr00t-tt-synthetic--GR00T-N1.6-3B-tiny"
    assert snap.name != cfg.revision and len(snap.name) == 40
    index = json.loads((snap / "model.safetensors.index.json").read_text())
    assert "not NVIDIA weights" in index["metadata"]["gr00t_tt_synthetic"]
    for shard in sorted(set(index["weight_map"].values())):
        assert "not NVIDIA weights" in read_header(snap / shard).metadata["gr00t_tt_synthetic"]
    with Checkpoint(snap) as ck:
        assert ck.synthetic.startswith("synthetic n16 (tiny scale, seed 0)")


def test_the_release_is_never_resolved_to_a_synthetic_stand_in(hf_cache):
    with pytest.raises(CheckpointError) as err:
        resolve_snapshot(load_config("n16"), hf_cache=hf_cache)  # this cache holds only synthetic repos
    msg = str(err.value)
    assert "nvidia/GR00T-N1.6-3B at revision d0814e7ecb19202e7c8468b46098b0b7ef3a6d61 is not in the Hugging Face cache" in msg
    assert "no revision of it is present) and HF_HUB_OFFLINE is set. Fetch it with `hf download nvidia/GR00T-N1.6-3B" in msg
    assert "synth" not in msg.split("(for a synthetic stand-in instead")[0]  # never: write synthetic data there
    assert "--hf-cache" not in msg


@pytest.mark.parametrize("endpoint", ["http://hub.invalid", "http://127.0.0.1:1"], ids=["unresolvable", "refused"])
def test_a_first_run_without_a_route_to_the_hub_is_answered_at_once(tmp_path, endpoint):
    """`make convert VERSION=n17` on a machine with no network and no checkpoint: huggingface_hub would retry for
    ~30 s; the convert says within 5 s (a refusal's time, with a wide margin, not a benchmark) that the hub could
    not be reached, with both ways forward, `hf download` and the synthetic stand-in."""
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env.update(HF_ENDPOINT=endpoint, HF_HUB_CACHE=str(tmp_path / "hf"), GR00T_CACHE=str(tmp_path / "cache"))
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pipeline", "convert", "--version", "n17"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    took = time.monotonic() - started
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    msg = proc.stderr
    assert "is not in the Hugging Face cache (no revision of it is present) and the hub could not be reached (" in msg
    assert "Fetch it with `hf download nvidia/GR00T-N1.7-3B --revision " in msg
    assert "(for a synthetic stand-in instead: --synthetic tiny after `python -m pipeline synth --version n17`)" in msg
    assert took < 5, f"{took:.1f} s"
    assert not (tmp_path / "cache" / "entries").exists() or not any((tmp_path / "cache" / "entries").iterdir())


def test_behind_a_proxy_the_proxy_is_what_is_asked(monkeypatch):
    """huggingface_hub goes through HTTPS_PROXY when it is set, so the quick check asks the proxy, not the hub."""
    from pipeline.inputs.snapshot import hub_unreachable

    for name in ("https_proxy", "HTTPS_PROXY", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:1")
    assert hub_unreachable("https://hub.invalid") == "127.0.0.1:1 did not answer (Connection refused)"
    monkeypatch.setenv("NO_PROXY", "hub.invalid")
    assert hub_unreachable("https://hub.invalid") == "its name hub.invalid does not resolve"


def _real_looking(hf_cache: Path, tmp_path: Path, revision: str) -> Path:
    """A copy of a synthetic snapshot filed as nvidia's repo at another revision (what a user's cache may hold)."""
    src = resolve_snapshot(load_config("n17"), hf_cache=hf_cache, synthetic="tiny")
    repo = tmp_path / "hf" / "models--nvidia--GR00T-N1.7-3B"
    shutil.copytree(src.parent.parent, repo, symlinks=True)
    (repo / "snapshots" / src.name).rename(repo / "snapshots" / revision)
    return tmp_path / "hf"


def test_revision_is_chosen_recorded_and_listed_on_a_miss(hf_cache, tmp_path):
    other = "1" * 40
    user_hf = _real_looking(hf_cache, tmp_path, other)
    with pytest.raises(CheckpointError) as err:  # the pinned revision is absent: say which ones are present
        convert(ConvertOptions("n17", hf_cache=user_hf, cache_root=tmp_path / "c", progress=False))
    assert f"revisions present: {other}" in str(err.value)
    s = convert(ConvertOptions("n17", revision=other, hf_cache=user_hf, cache_root=tmp_path / "c", progress=False))
    manifest = json.loads((Path(s["cache_path"]) / "MANIFEST.json").read_text())
    assert manifest["revision"] == s["source"]["revision"] == other  # the revision read, not the pinned one
    assert manifest["source"]["synthetic"] == s["source"]["synthetic"]  # the marks travel with the files
    assert s["source"]["synthetic"].startswith("synthetic n17")


def test_convert_and_load_print_and_record_a_synthetic_source(hf_cache, tmp_path):
    proc = run_cli("convert", "--version", "n17", "--synthetic", "tiny", "--hf-cache", str(hf_cache), "--cache", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "SYNTHETIC     synthetic n17 (tiny scale, seed 0), not NVIDIA weights" in proc.stdout
    proc = run_cli("load", "--version", "n17", "--embodiment", "new_embodiment", "--cache", str(tmp_path), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["source"]["synthetic"].startswith("synthetic n17 (tiny scale")
    proc = run_cli("load", "--version", "n17", "--embodiment", "new_embodiment", "--cache", str(tmp_path))
    assert proc.stdout.startswith("SYNTHETIC weights: synthetic n17")


def test_without_a_flag_convert_never_falls_back_to_the_demo_folder(tmp_path):
    proc = run_cli("convert", "--version", "n17", "--hf-cache", str(tmp_path / "empty-hf"), "--cache", str(tmp_path))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "nvidia/GR00T-N1.7-3B at revision 2fc962b973bccdd5d8ce4f67cc63b264d6886495 is not in the Hugging Face cache" in proc.stderr
