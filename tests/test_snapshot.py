"""pipeline/inputs/snapshot.py's rules on their own: which source a command names (one, and the right flags with it), where
a release or a synthetic stand-in is in the Hugging Face cache (held to the cache's own `refs/main` and folder
names), what an offline miss says, and where the cache is."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.inputs.folder import snapshot_revision
from pipeline.inputs.snapshot import (default_hf_cache, repo_folder, resolve_snapshot,
                               synthetic_repo_id)
from pipeline.model.versions import VERSIONS, load_config
from tasks.errors import CheckpointError, ConfigError


@pytest.mark.parametrize("kwargs, said", [
    ({"snapshot": Path("/a"), "model": "o/n"}, "--snapshot /a and --model o/n name two sources"),
    ({"snapshot": Path("/a"), "model": "o/n", "synthetic": "tiny"}, "name three sources"),
    ({"synthetic": "tiny", "revision": "abc"}, "--revision abc does not apply to --synthetic tiny"),
    ({"snapshot": Path("/a"), "revision": "abc"}, "--revision abc does not apply to --snapshot /a"),
    ({"model": "just-a-name"}, "--model 'just-a-name' is not a Hugging Face repo id: pass OWNER/NAME"),
    ({"model": "a/b/c"}, "is not a Hugging Face repo id"),
])
def test_one_source_and_only_the_flags_that_apply_to_it(kwargs, said):
    with pytest.raises(ConfigError, match=said.replace("(", r"\(").replace(")", r"\)")):
        resolve_snapshot(load_config("n16"), **kwargs)


def test_without_a_version_or_a_source_every_version_is_named():
    with pytest.raises(ConfigError) as err:
        resolve_snapshot(None)
    assert all(v in str(err.value) for v in VERSIONS) and "--snapshot DIR" in str(err.value)


def test_a_synthetic_stand_in_is_the_snapshot_the_caches_own_ref_points_to(hf_cache):
    for version in VERSIONS:
        cfg = load_config(version)
        repo = repo_folder(synthetic_repo_id(cfg, "tiny"), hf_cache)
        assert repo.name == f"models--gr00t-tt-synthetic--{cfg.repo_id.split('/')[-1]}-tiny"
        main = (repo / "refs" / "main").read_text().strip()  # what huggingface_hub wrote: the commit of `main`
        found = resolve_snapshot(cfg, hf_cache=hf_cache, synthetic="tiny")
        assert found == repo / "snapshots" / main and snapshot_revision(found) == main
    assert snapshot_revision(Path("/some/plain/folder")) is None


def test_an_offline_miss_names_the_download_to_run_and_what_is_there(hf_cache, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = load_config("n17")
    with pytest.raises(CheckpointError) as err:
        resolve_snapshot(cfg, hf_cache=tmp_path / "empty")
    said = str(err.value)
    assert f"hf download {cfg.repo_id} --revision {cfg.revision} --cache-dir {tmp_path / 'empty'}" in said
    assert "no revision of it is present" in said and "HF_HUB_OFFLINE is set" in said
    with pytest.raises(CheckpointError, match="no synthetic small n17 here; make one with `python -m pipeline synth "
                                              "--version n17 --scale small"):
        resolve_snapshot(cfg, hf_cache=hf_cache, synthetic="small")


def test_a_folder_is_returned_as_it_is_and_a_bucket_prefix_as_a_path_into_it(tmp_path):
    assert resolve_snapshot(None, snapshot=tmp_path / "anything") == tmp_path / "anything"  # read later, once
    remote = resolve_snapshot(None, snapshot="s3://team-weights/runs/ckpt")
    assert remote.protocol == "s3" and str(remote) == "s3://team-weights/runs/ckpt" and remote.name == "ckpt"


def test_the_hf_cache_is_found_as_huggingface_hub_finds_it(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert default_hf_cache() == tmp_path / "hub-cache"
    monkeypatch.delenv("HF_HUB_CACHE")
    assert default_hf_cache() == tmp_path / "home" / "hub"
