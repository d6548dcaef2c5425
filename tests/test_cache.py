"""The cache across processes: identity, concurrency, reuse, slot-only reloads, checks against a fresh conversion.
(Selection, leases and gc have contract suites of their own: test_selection.py, test_leases.py,
test_housekeeping.py; kill -9 and damaged entries are in test_reliability.py.)"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from pipeline import cache as cache_mod
from pipeline.model import recipe as recipe_mod
from pipeline.cache import entries_dir
from pipeline.jobs.convert import ConvertOptions, convert
from pipeline.jobs.load import load
from tasks.errors import CacheError

from tests.conftest import ROOT


def _opts(version, root, **kw):
    return ConvertOptions(version, cache_root=root, progress=False, **kw)


def _chunks(entry: Path) -> dict[str, bytes]:
    return {str(p.relative_to(entry)): p.read_bytes() for p in sorted(entry.rglob("c.*")) if p.is_file()}


def test_changing_one_source_byte_makes_a_new_entry_and_keeps_the_old(copy_snapshot, tmp_path):
    snap = copy_snapshot("n16")
    first = convert(_opts("n16", tmp_path, snapshot=snap, embodiments="gr1"))
    shard = snap / "model-00002-of-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0x01
    shard.write_bytes(bytes(data))
    second = convert(_opts("n16", tmp_path, snapshot=snap, embodiments="gr1"))
    assert not second["cache_hit"] and second["fingerprint"] != first["fingerprint"]
    assert cache_mod.entry_at(Path(first["cache_path"])).verify() == []


def test_recipe_or_profile_change_makes_a_new_entry(hf_cache, tmp_path, monkeypatch):
    base = convert(_opts("n15", tmp_path, hf_cache=hf_cache, synthetic="tiny", embodiments="gr1"))
    other_profile = convert(_opts("n15", tmp_path, hf_cache=hf_cache, synthetic="tiny", embodiments="gr1", profile="bfp8"))
    assert other_profile["fingerprint"] != base["fingerprint"]
    edited = tmp_path / "recipes.toml"
    edited.write_text(recipe_mod.RECIPES_PATH.read_text().replace(
        'match = "{vision}head.**"', 'match = "{vision}head.**"\n# edited'))
    monkeypatch.setattr(recipe_mod, "RECIPES_PATH", edited)
    recipe_mod.recipes.cache_clear()
    try:
        changed = convert(_opts("n15", tmp_path, hf_cache=hf_cache, synthetic="tiny", embodiments="gr1"))
    finally:
        recipe_mod.recipes.cache_clear()
    assert changed["fingerprint"] != base["fingerprint"] and not changed["cache_hit"]
    assert len([p for p in entries_dir(tmp_path).iterdir()]) == 3


def _convert_cmd(hf_cache: Path, root: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "pipeline", "convert", "--version", "n16", "--hf-cache", str(hf_cache), "--synthetic", "micro",
            "--cache", str(root), "--json", *extra]


def test_concurrent_converts_publish_one_entry_and_all_succeed(hf_cache, tmp_path):
    procs = [subprocess.Popen(_convert_cmd(hf_cache, tmp_path), cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    results = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [r[1][-500:] for r in results]
    summaries = [json.loads(out) for out, _ in results]
    assert len({s["cache_path"] for s in summaries}) == 1
    assert [p.name for p in entries_dir(tmp_path).iterdir()] == [Path(summaries[0]["cache_path"]).name]
    assert cache_mod.entry_at(Path(summaries[0]["cache_path"])).verify() == []


@pytest.fixture
def n17_cache(hf_cache, tmp_path) -> tuple[Path, Path]:
    summary = convert(_opts("n17", tmp_path / "cache", hf_cache=hf_cache, synthetic="micro"))  # 120 targets
    return tmp_path / "cache", Path(summary["cache_path"])


def test_one_embodiment_reads_only_its_slot_chunks(n17_cache, micro_snapshots):
    root, entry = n17_cache
    manifest = json.loads((entry / "MANIFEST.json").read_text())
    bank_bytes = sum(c["nbytes"] for a in manifest["arrays"].values() if a["attributes"]["embodiment_bank"]
                     for c in a["chunks"].values())
    other_bytes = sum(c["nbytes"] for a in manifest["arrays"].values() if not a["attributes"]["embodiment_bank"]
                      for c in a["chunks"].values())
    for bank in (p for p in entry.iterdir() if p.is_dir() and len(list(p.glob("c.*"))) == 32):
        for chunk in bank.glob("c.*"):
            if chunk.name.split(".")[1] != "10":
                chunk.unlink()  # proves the load never opens another slot's chunk
    loaded = load("n17", root, embodiment="new_embodiment")
    assert loaded.slot == 10
    assert loaded.stats["bytes_read"] - other_bytes == bank_bytes // 32
    with safe_open(str(micro_snapshots["n17"] / "model-00002-of-00002.safetensors"), "pt") as f:
        ref = f.get_tensor("action_head.action_encoder.W2.W")[10]
    assert torch.equal(loaded.tensors["action_encoder.W2.W"].view(torch.int16), ref.view(torch.int16))


def test_reload_does_not_import_safetensors_or_touch_the_source(n17_cache, hf_cache, tmp_path):
    root, _ = n17_cache
    moved = tmp_path / "moved-away"
    shutil.move(str(hf_cache), moved)  # the source checkpoint is gone
    try:
        code = ("import sys, json; from pipeline.jobs.load import load; w = load('n17', sys.argv[1], embodiment=10); "
                "print(json.dumps({'n': len(w.tensors), 'st': 'safetensors' in sys.modules}))")
        out = subprocess.run([sys.executable, "-c", code, str(root)], cwd=ROOT, capture_output=True, text=True, check=True)
        result = json.loads(out.stdout.strip().splitlines()[-1])
        assert result == {"n": 120, "st": False}
    finally:
        shutil.move(str(moved), hf_cache)


def test_check_against_cache_catches_a_doctored_entry(n17_cache, hf_cache):
    root, entry = n17_cache
    ok = convert(_opts("n17", root, hf_cache=hf_cache, synthetic="micro", check_against_cache=True))
    assert ok["checked_against_fresh_conversion"] and ok["arrays_compared"] == 120
    manifest = json.loads((entry / "MANIFEST.json").read_text())
    manifest["arrays"]["language.norm.weight"]["chunks"]["all"]["xxh3"] = "0" * 16
    (entry / "MANIFEST.json").write_text(json.dumps(manifest))
    with pytest.raises(CacheError, match="differs from a fresh conversion in 1 array"):
        convert(_opts("n17", root, hf_cache=hf_cache, synthetic="micro", check_against_cache=True))


def test_a_fine_tune_converts_only_what_changed_and_shares_the_rest(hf_cache, tmp_path):
    from pipeline.model.state_dict import tensor_specs
    from pipeline.inputs.synth import synthesize

    head = frozenset(s.key for s in tensor_specs("n16", "micro") if s.key.startswith("action_head."))
    tuned_hf = tmp_path / "tuned-hf"
    synthesize("n16", tuned_hf, "micro", mutate=head)
    root = tmp_path / "cache"
    base = convert(_opts("n16", root, hf_cache=hf_cache, synthetic="micro"))
    tuned = convert(_opts("n16", root, hf_cache=tuned_hf, synthetic="micro"))
    fresh = convert(_opts("n16", tmp_path / "fresh", hf_cache=tuned_hf, synthetic="micro", reuse=False))
    assert tuned["fingerprint"] == fresh["fingerprint"] != base["fingerprint"]
    assert _chunks(Path(tuned["cache_path"])) == _chunks(Path(fresh["cache_path"]))  # reuse changes no byte
    plan = recipe_mod.build_plan("n16", {s.key: s.shape for s in tensor_specs("n16", "micro")})
    changed = [t for t in plan.targets if any(k in head for k in t.sources)]
    unchanged = [t for t in plan.targets if t not in changed]
    assert tuned["reused_chunks"] == len(unchanged)
    assert tuned["stage_tasks"]["stage"] == sum(32 if t.embodiment else 1 for t in changed)
    per_key = {s.key: s.nbytes for s in tensor_specs("n16", "micro")}
    assert tuned["bytes_read"] == sum(per_key[k] for t in changed for k in t.sources)  # only the changed targets
    tuned_dir, base_dir = Path(tuned["cache_path"]), Path(base["cache_path"])
    shared_files = [p for p in tuned_dir.rglob("*") if p.is_file() and p.name != "zarr.json" and p.stat().st_nlink > 1]
    assert sum(p.stat().st_size for p in shared_files) == tuned["reused_bytes"] > 0  # chunks, device files: links
    # each array document with the release's bytes is the release's file; a changed one is a file of its own
    docs = {t.name: (tuned_dir / t.name / "zarr.json", base_dir / t.name / "zarr.json") for t in plan.targets}
    same = {n for n, (mine, theirs) in docs.items() if mine.read_bytes() == theirs.read_bytes()}
    shared = {n for n, (mine, theirs) in docs.items() if mine.stat().st_ino == theirs.stat().st_ino}
    assert shared == same and len(same) >= len(unchanged) > 0
    assert cache_mod.entry_at(Path(base["cache_path"])).verify() == []


def test_an_all_zero_target_is_still_written_and_a_missing_one_never_reads_as_zeros(tmp_path):
    from tasks.device.host_tensors import Converted
    from tasks.stage import stage_target
    from tasks.entries.store import LocalStore
    from tasks.entries.zarr_v3 import array_metadata, create_array

    zeros = np.zeros((64, 32), np.uint16)
    create_array(tmp_path / "t", array_metadata((64, 32), (64, 32), {}))  # convert creates every array first
    staged = stage_target(tmp_path, Converted(name="t", slot=None, array=zeros, device_dtype="bfloat16", layout="TILE",
                                              padded_shape=(64, 32), max_abs_err=0.0, pcc=1.0))
    chunk = tmp_path / "t" / "c.0.0"
    assert chunk.read_bytes() == bytes(64 * 32 * 2) and staged.record.nbytes == 4096  # zarr would have skipped it
    chunk.unlink()
    with pytest.raises(CacheError, match="chunk is missing from the cache entry"):
        LocalStore(tmp_path).read_into("t/c.0.0", np.empty((64, 32), np.uint16))


def test_reuse_never_drops_a_wanted_device_file(hf_cache, tmp_path):
    bf16 = convert(_opts("n17", tmp_path, hf_cache=hf_cache, synthetic="tiny", embodiments="10", profile="bf16"))
    bfp8 = convert(_opts("n17", tmp_path, hf_cache=hf_cache, synthetic="tiny", embodiments="10", profile="bfp8"))
    old = json.loads((Path(bf16["cache_path"]) / "MANIFEST.json").read_text())["arrays"]
    new = json.loads((Path(bfp8["cache_path"]) / "MANIFEST.json").read_text())["arrays"]
    # Norms, biases and tables hold the same values in both profiles, but the bf16 entry keeps no device file for
    # them and bfp8 wants one (as a tiled file, which holds them in tile order: other bytes, another content id):
    # they are converted again. Only what needs none (the host-only tensors) is linked.
    same = {n for n, a in new.items() if a["content_id"] == old[n]["content_id"]}

    def chunk(entry: str, name: str) -> Path:  # the one chunk (whole array, or slot 10 of a bank)
        a = new[name]
        bank = a["attributes"]["embodiment_bank"]
        coords = ["0"] * (len(a["chunk_shape"]) - bank)
        return Path(entry) / name / ".".join(["c", *(["10"] if bank else []), *coords])
    linked = {n for n in same if chunk(bfp8["cache_path"], n).stat().st_ino == chunk(bf16["cache_path"], n).stat().st_ino}
    host = {n for n, a in new.items() if a["attributes"]["host_only"]}
    assert linked == host == same and bfp8["reused_chunks"] == len(host) == 33
    device = [a for a in new.values() if not a["attributes"]["host_only"]]
    assert len(device) > 900 and all(a["attributes"].get("tiled") or all("tensorbin" in c for c in a["chunks"].values())
                                     for a in device)
    assert not any(a["attributes"].get("tiled") for a in old.values())  # bf16 keeps no device file: rows, as before


def test_a_killed_runs_partial_files_never_reach_the_published_entry(hf_cache, tmp_path):
    name = Path(convert(_opts("n15", tmp_path / "a", hf_cache=hf_cache, synthetic="tiny", embodiments="gr1"))["cache_path"]).name
    orphan = entries_dir(tmp_path / "b") / f"{name}.tmp-999999999-deadbeef"  # a dead process's directory
    (orphan / ".staged").mkdir(parents=True)
    partial = orphan / "language.model.norm.weight" / "c.0.0.0123456789abcdef.partial"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(b"half a chunk")
    done = convert(_opts("n15", tmp_path / "b", hf_cache=hf_cache, synthetic="tiny", embodiments="gr1"))
    entry = Path(done["cache_path"])
    assert entry.name == name and not orphan.exists()  # adopted
    assert list(entry.rglob("*.partial")) == []


def test_a_torn_chunk_under_its_final_name_is_written_again_on_resume(hf_cache, tmp_path):
    """Chunks are written in place inside the entry being built: a kill can leave one torn under its final name,
    with no progress record. The resumed run must redo it, never publish it."""
    name = Path(convert(_opts("n15", tmp_path / "a", hf_cache=hf_cache, synthetic="tiny", embodiments="gr1"))["cache_path"]).name
    orphan = entries_dir(tmp_path / "b") / f"{name}.tmp-999999999-deadbeef"
    first = entries_dir(tmp_path / "a") / name / "language.model.norm.weight"
    (chunk,) = [p.name for p in first.glob("c.*")]
    torn = orphan / "language.model.norm.weight" / chunk
    torn.parent.mkdir(parents=True)
    torn.write_bytes(b"half a chunk")
    done = convert(_opts("n15", tmp_path / "b", hf_cache=hf_cache, synthetic="tiny", embodiments="gr1"))
    published = Path(done["cache_path"]) / "language.model.norm.weight" / chunk
    assert published.read_bytes() == (first / chunk).read_bytes()
    assert done["resumed_chunks"] == 0


def test_a_port_plan_convert_never_imports_ttnn_once_its_headers_are_checked(hf_cache, tmp_path):
    """ttnn (with torch) costs ~1.8 s of one core and ~0.5 GB to import; the port plan's device files are all made
    by tasks/device/tensorbin.py, so after the once-per-install header check a convert runs without it."""
    from tasks.device import tensorbin

    tensorbin.check_formats()
    code = ("import sys; from pathlib import Path; from pipeline.jobs.convert import ConvertOptions, convert; "
            f"s = convert(ConvertOptions('n16', cache_root=Path({str(tmp_path)!r}), hf_cache=Path({str(hf_cache)!r}), "
            "synthetic='tiny', layout='tt-n16', profile='port', progress=False)); "
            "print(s['cache_hit'], 'ttnn' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parent.parent)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "False", "False"]


def test_without_syncfs_every_file_is_fsynced_before_the_publishing_rename(hf_cache, tmp_path, monkeypatch):
    from tasks.entries import publish

    synced = []
    real_fsync = publish._fsync
    monkeypatch.setattr(publish, "_syncfs", lambda path: False)  # an OS without syncfs(2)
    monkeypatch.setattr(publish, "_fsync", lambda path: (synced.append(Path(path)), real_fsync(path)))
    entry = Path(convert(_opts("n15", tmp_path, hf_cache=hf_cache, synthetic="tiny", embodiments="gr1"))["cache_path"])
    files = sorted(p.relative_to(entry) for p in entry.rglob("*") if p.is_file() and p.name != "MANIFEST.json")
    # synced inside the temporary folder the rename publishes: every file by its path there, before the manifest
    tmp = next(p for p in synced[0].parents if p.name.startswith(entry.name + ".tmp-"))
    assert len(files) > 800 and sorted(p.relative_to(tmp) for p in synced[:len(files)]) == files


@pytest.mark.parametrize("damage", ["flipped byte", "truncated"])
def test_a_damaged_device_file_is_refused_on_reload(hf_cache, tmp_path, damage):
    entry = Path(convert(_opts("n16", tmp_path, hf_cache=hf_cache, synthetic="tiny", layout="tt-n16", profile="port",
                               embodiments="gr1"))["cache_path"])
    victim = sorted(entry.glob("*/c.0.0.0.0.0.0"))[0]  # a device file: from format 7, a whole target's tiled chunk
    data = bytearray(victim.read_bytes())
    if damage == "flipped byte":
        data[400] ^= 0x01  # in the payload ttnn reads (its header is 384 bytes)
    else:
        data = data[:-1]
    victim.write_bytes(bytes(data))
    with pytest.raises(CacheError, match=f"{victim.parent.name}/{victim.name}: device file [(]what ttnn loads[)] does not match its manifest"):
        load("n16", tmp_path, embodiment="gr1", profile="port", layout="tt-n16", into="ttnn")


