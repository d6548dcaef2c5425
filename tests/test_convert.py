"""Conversion end to end: cache values against independent safetensors+torch reads, schedulers, hits, failures."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from dask.task_spec import Task
from safetensors import safe_open

from pipeline.cache import entries_dir
from pipeline.commands.render import graph_for
from pipeline.jobs.convert import ConvertOptions, convert
from pipeline.model.state_dict import tensor_specs
from pipeline.model.recipe import build_plan
from pipeline.model.versions import load_config
from tasks.errors import RecipeError
from tests.conftest import run_cli
from tests.zarr_values import values



def _source(snapshot: Path, key: str) -> torch.Tensor:
    index = json.loads((snapshot / "model.safetensors.index.json").read_text())
    with safe_open(str(snapshot / index["weight_map"][key]), "pt") as f:
        return f.get_tensor(key)


def _cached(entry: Path, name: str) -> torch.Tensor:
    """Read through zarr-python: an independent reader of the cache format."""
    arr = zarr.open_group(str(entry), mode="r")[name]
    assert arr.attrs["dtype"] == "bfloat16"
    return torch.from_numpy(np.ascontiguousarray(values(arr))).view(torch.bfloat16)


@pytest.fixture(scope="module")
def n17_entry(hf_cache, tmp_path_factory):
    """The generic layout (checked here by hand; the default layouts are checked against the port oracle in
    tests/test_port_layout.py)."""
    summary = convert(ConvertOptions("n17", layout="generic", hf_cache=hf_cache, synthetic="tiny",
                                     cache_root=tmp_path_factory.mktemp("c17"), progress=False))
    return summary, Path(summary["cache_path"])


def test_cache_values_equal_hand_transformed_safetensors_reads(n17_entry, snapshots):
    summary, entry = n17_entry
    snap, A, L, V = snapshots["n17"], "action_head.", "backbone.model.model.language_model.", "backbone.model.model.visual."
    blk = A + "model.transformer_blocks."
    expect = {  # target -> the source-side computation, written out here with torch
        "llm.layers.5.self_attn.qkv.weight": torch.cat([_source(snap, f"{L}layers.5.self_attn.{p}_proj.weight") for p in "qkv"]).T,
        "llm.layers.5.mlp.down_proj.weight": _source(snap, f"{L}layers.5.mlp.down_proj.weight").T,
        "llm.embed_tokens.weight": _source(snap, f"{L}embed_tokens.weight"),
        "llm.norm.weight": _source(snap, f"{L}norm.weight")[None, :],
        "vision.patch_embed.proj.weight": _source(snap, f"{V}patch_embed.proj.weight").flatten(1).T,
        "vision.blocks.3.attn.qkv.weight": _source(snap, f"{V}blocks.3.attn.qkv.weight").T,
        "action_head.model.transformer_blocks.19.attn1.to_qkv.weight":
            torch.cat([_source(snap, f"{blk}19.attn1.to_{p}.weight") for p in "qkv"]).T,
        "action_head.model.transformer_blocks.19.attn1.to_qkv.bias":
            torch.cat([_source(snap, f"{blk}19.attn1.to_{p}.bias") for p in "qkv"])[None, :],
        "action_head.model.transformer_blocks.18.attn1.to_kv.weight":
            torch.cat([_source(snap, f"{blk}18.attn1.to_{p}.weight") for p in "kv"]).T,
        "action_head.model.transformer_blocks.18.attn1.to_q.weight": _source(snap, f"{blk}18.attn1.to_q.weight").T,
        "action_head.model.transformer_blocks.19.ff.net.2.weight": _source(snap, f"{blk}19.ff.net.2.weight").T,
        "action_head.action_encoder.W2.W": _source(snap, f"{A}action_encoder.W2.W"),  # banks: never transposed
        "action_head.action_encoder.W2.b": _source(snap, f"{A}action_encoder.W2.b")[:, None, :],
        "action_head.position_embedding.weight": _source(snap, f"{A}position_embedding.weight"),
    }
    for name, ref in expect.items():
        got = _cached(entry, name)
        assert got.shape == ref.shape and torch.equal(got.view(torch.int16), ref.contiguous().view(torch.int16)), name


LAYOUTS = [(v, layout) for v in ("n15", "n16", "n17") for layout in load_config(v).layouts]


@pytest.mark.parametrize("version,layout_name", LAYOUTS, ids=[f"{v}-{n}" for v, n in LAYOUTS])
def test_every_source_key_is_consumed_once_or_skipped_with_a_reason(version, layout_name):
    keys = {s.key: s.shape for s in tensor_specs(version)}
    plan = build_plan(version, keys, layout=layout_name)
    used = [k for t in plan.targets for k in t.sources]
    assert len(used) == len(set(used))
    assert set(used) | set(plan.skipped) == set(keys) and not set(used) & set(plan.skipped)
    lm_head = load_config(version).containers["lm_head"] + "weight"
    assert plan.skipped[lm_head] == "LM head: GR00T reads LLM hidden states and never applies it (it is tied to embed_tokens anyway)"
    assert all(reason.strip() for reason in plan.skipped.values())
    assert set(plan.skipped) == {lm_head} | {k for k in keys if ".head." in k}  # and the unused SigLIP head


def test_the_entry_holds_one_array_per_target(n17_entry):
    summary, entry = n17_entry
    plan = build_plan("n17", {s.key: s.shape for s in tensor_specs("n17")}, layout="generic")
    assert summary["targets"] == len(plan.targets) == len(list(zarr.open_group(str(entry), mode="r").array_keys()))


def test_a_key_no_rule_consumes_fails_naming_it():
    shapes = {s.key: s.shape for s in tensor_specs("n16", "tiny")} | {"backbone.model.extra_module.x": (3,)}
    with pytest.raises(RecipeError) as err:
        build_plan("n16", shapes)
    assert str(err.value).startswith("n16: no tt-n16 recipe rule consumes 'backbone.model.extra_module.x' (shape [3])")


def test_second_convert_is_a_cache_hit(hf_cache, tmp_path):
    opts = ConvertOptions("n15", embodiments="gr1", hf_cache=hf_cache, synthetic="tiny", cache_root=tmp_path, progress=False)
    first, second = convert(opts), convert(opts)
    assert not first["cache_hit"] and second["cache_hit"] and second["tasks"] == 0
    assert first["fingerprint"] == second["fingerprint"] and first["cache_path"] == second["cache_path"]
    assert first["slots"] == [24]


def _entry_bytes(summary: dict) -> dict[str, bytes]:
    entry = Path(summary["cache_path"])
    return {str(p.relative_to(entry)): p.read_bytes() for p in sorted(entry.rglob("c.*")) if p.is_file()} | \
           {name: json.dumps(arr, sort_keys=True).encode() for name, arr in
            json.loads((entry / "MANIFEST.json").read_text())["arrays"].items()}


def test_all_four_schedulers_produce_identical_entries(hf_cache, tmp_path):
    from distributed import LocalCluster

    runs = {}
    for scheduler in ("sync", "threads", "processes"):
        runs[scheduler] = convert(ConvertOptions("n16", embodiments="gr1,new_embodiment", scheduler=scheduler,
                                                 hf_cache=hf_cache, synthetic="micro", cache_root=tmp_path / scheduler, progress=False))
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        runs["tcp"] = convert(ConvertOptions("n16", embodiments="gr1,new_embodiment", scheduler=cluster.scheduler_address,
                                             hf_cache=hf_cache, synthetic="micro", cache_root=tmp_path / "tcp", progress=False))
    reference = _entry_bytes(runs["sync"])
    assert len(reference) > 90
    # every task of the graph as built is counted under its stage, whether its chain ran as one task or not
    graph = graph_for(ConvertOptions("n16", embodiments="gr1,new_embodiment", hf_cache=hf_cache, synthetic="micro",
                                     cache_root=tmp_path / "graph"))[0]
    stage_tasks = Counter(key[0] for key, node in graph.items() if isinstance(node, Task))
    for scheduler, summary in runs.items():
        assert summary["fingerprint"] == runs["sync"]["fingerprint"]
        assert _entry_bytes(summary) == reference, scheduler
        assert summary["stage_tasks"] == stage_tasks, scheduler
        assert sum(summary["stage_seconds"].values()) > 0, scheduler


def test_flipped_data_byte_fails_verify_and_publishes_nothing(hf_cache, tmp_path):
    import shutil

    hf = tmp_path / "hf"
    shutil.copytree(hf_cache, hf, symlinks=True)
    snap = next((hf / "models--gr00t-tt-synthetic--GR00T-N1.6-3B-tiny" / "snapshots").iterdir())
    blob = (snap / "model-00002-of-00002.safetensors").resolve()
    data = bytearray(blob.read_bytes())
    data[-100] ^= 0x01
    blob.write_bytes(bytes(data))
    proc = run_cli("convert", "--version", "n16", "--hf-cache", str(hf), "--synthetic", "tiny", "--cache", str(tmp_path / "cache"), "--json")
    assert proc.returncode == 2
    assert f"{snap / 'model-00002-of-00002.safetensors'}: content sha256 is" in proc.stderr and "the file changed or is corrupt" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert list(entries_dir(tmp_path / "cache").iterdir()) == []


def test_unknown_version_and_embodiment_are_one_line_errors(hf_cache, tmp_path):
    proc = run_cli("convert", "--version", "n99", "--hf-cache", str(hf_cache), "--synthetic", "tiny", "--cache", str(tmp_path))
    assert proc.returncode == 2 and proc.stderr.startswith("error: unknown version 'n99': expected one of n15, n16, n17")
    proc = run_cli("convert", "--version", "n16", "--embodiments", "robot9", "--hf-cache", str(hf_cache), "--synthetic", "tiny", "--cache", str(tmp_path))
    assert proc.returncode == 2 and "error: unknown embodiment tag 'robot9' for n16" in proc.stderr
    proc = run_cli("convert", "--version", "n16", "--embodiments", "40", "--hf-cache", str(hf_cache), "--synthetic", "tiny", "--cache", str(tmp_path))
    assert proc.returncode == 2 and "embodiment slot 40 is out of range for this n16 checkpoint: its banks have slots 0..31" in proc.stderr


def test_a_plain_folder_takes_no_sha256_unless_asked_and_records_what_hashlib_gives(hf_cache, tmp_path, monkeypatch):
    """Issue 48: a trainer's folder has no published sha256 to compare with; it is named and checked by its content
    identity alone. `--sha256` records each shard's sha256 for provenance (hashlib's, as `sha256sum` gives it)."""
    import hashlib
    import shutil
    import types

    from tasks.source import shards
    from tasks.entries.entry import open_entry
    from tasks.entries.store import LocalStore

    snap = next((hf_cache / "models--gr00t-tt-synthetic--GR00T-N1.6-3B-tiny" / "snapshots").iterdir())
    plain = tmp_path / "plain"
    shutil.copytree(snap, plain)  # the blobs' bytes, no HF cache around them
    files = sorted(plain.glob("*.safetensors"))
    want = {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in files}
    taken = []

    def counting_sha256(*args):
        taken.append(1)
        return hashlib.sha256(*args)

    monkeypatch.setattr(shards, "hashlib", types.SimpleNamespace(sha256=counting_sha256))
    opts = dict(snapshot=plain, embodiments="new_embodiment", progress=False)
    summary = convert(ConvertOptions(None, cache_root=tmp_path / "c1", **opts))
    assert not summary["cache_hit"] and taken == []
    assert summary["shards_checked_against"] == {f.name: "content identity" for f in files}
    manifest = open_entry(LocalStore(tmp_path / "c1"), Path(summary["cache_path"]).name).manifest
    assert manifest.shards_sha256 == {} and manifest.shards_checked_against == {f.name: "content identity" for f in files}
    assert all(v.startswith("xxh3-128:") for v in manifest.to_json()["shards"].values())  # what says so, on disk
    hit = convert(ConvertOptions(None, cache_root=tmp_path / "c1", sha256=True, **opts))  # asked on a hit: taken now
    assert hit["cache_hit"] and hit["shards_sha256"] == want and "convert with --force --sha256" in hit["notes"][-1]
    recorded = convert(ConvertOptions(None, cache_root=tmp_path / "c2", sha256=True, **opts))
    assert recorded["fingerprint"] == summary["fingerprint"] and len(taken) == len(files)
    manifest = open_entry(LocalStore(tmp_path / "c2"), Path(recorded["cache_path"]).name).manifest
    assert manifest.shards_sha256 == want == recorded["shards_sha256"]
    rows = json.loads(run_cli("cache", "ls", "--cache", str(tmp_path / "c2"), "--json").stdout)["entries"]
    assert rows[0]["shards_checked_against"] == {f.name: "content identity" for f in files}
    assert rows[0]["shards_sha256"] == want


def test_what_can_be_refused_is_refused_before_anything_is_read_or_claimed(tmp_path):
    """An open device with a scheduler that cannot hold it is refused first: before the checkpoint is opened (here
    it does not even exist) and before the cache folder is made."""
    from tasks.errors import ConfigError

    opts = ConvertOptions("n16", snapshot=tmp_path / "no-such-checkpoint", cache_root=tmp_path / "cache",
                          scheduler="processes", device=object(), progress=False)
    with pytest.raises(ConfigError, match=r"^--device needs the threads or sync scheduler"):
        convert(opts)
    assert not (tmp_path / "cache").exists()
