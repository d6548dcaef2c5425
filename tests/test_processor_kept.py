"""A converted fine-tune acts from the cache alone: its trainer's processor files are kept in the entry, by content,
listed in the manifest with their checksums, checked by every read and by `cache verify`, and part of the entry's
identity. With the source folder deleted, `load(...).processor` equals Isaac-GR00T's own (tests/isaac_oracle.py) on
a local folder and in a bucket read by a fresh cache; a fine-tune whose statistics alone changed writes no tensor
bytes; and what cannot act is one sentence."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from pipeline import convert, load
from pipeline.inputs.synth import TRAINED_TAG, fine_tune_form
from pipeline.model.processor import ISAAC_FILES, ProcessorError
from tasks.entries.cache_root import open_store
from tests.conftest import run_cli
from tests.isaac_oracle import Oracle
from tests.test_processor import _observations


@pytest.fixture
def snapshots(micro_snapshots) -> dict[str, Path]:
    """The micro stand-ins: the processor files are the subject here, and a fine-tune's F32 weights, in the fewest
    files that carry them, are converted faster (in a bucket: fewer requests)."""
    return micro_snapshots


def _checkpoint(snapshots, version: str, out: Path) -> tuple[Path, dict]:
    """An Isaac-GR00T `checkpoint-1000/` of the version, and the documents of its processor files."""
    folder = fine_tune_form(snapshots[version], version, "checkpoint", out)
    return folder, {name: json.loads((folder / name).read_text()) for name in ISAAC_FILES}


def _acts_as_the_trainer(processor, docs: dict) -> None:
    oracle = Oracle(docs, TAG_OF(docs))
    observed = _observations(np.random.default_rng(11), batch=3, steps=1)
    ours = processor.state(observed)
    for b in range(3):
        np.testing.assert_allclose(ours[b], oracle.state({g: v[b] for g, v in observed.items()}), atol=1e-6, rtol=0)
    output = np.random.default_rng(12).uniform(-1, 1, (3, 40, processor.max_action_dim))
    got, want = processor.actions(output, state=observed), oracle.actions(output, observed)
    for group, values in want.items():
        np.testing.assert_allclose(got[group], values, rtol=1e-5, atol=1e-9)


def TAG_OF(docs: dict) -> str:  # noqa: N802 (what the trainer's statistics are keyed by)
    (tag,) = docs["statistics.json"]
    return tag


@pytest.mark.parametrize("version", ["n16", "n17"])
def test_from_the_cache_alone_the_processor_is_the_trainers(snapshots, tmp_path, version):
    folder, docs = _checkpoint(snapshots, version, tmp_path / "run")
    done = convert(version, snapshot=folder, embodiments="trained", cache_root=tmp_path / "cache", progress=False)
    assert done["processor"].startswith("Isaac-GR00T's, kept in the entry from") and TRAINED_TAG in done["processor"]
    shutil.rmtree(tmp_path / "run")  # the source is gone: only the cache is left
    loaded = load(version, tmp_path / "cache", TRAINED_TAG, synthetic=True)
    processor = loaded.processor
    assert processor.embodiment == TRAINED_TAG and processor.embodiment_id == loaded.slot == 10
    _acts_as_the_trainer(processor, docs)
    entry = Path(done["cache_path"])
    kept = {p.name: p.read_bytes() for p in (entry / "processor").iterdir()}
    assert {n: json.loads(b) for n, b in kept.items()} == docs  # the trainer's bytes, whole
    by_slot = load(version, tmp_path / "cache", 10, synthetic=True).processor  # asked by slot: the trainer's tag
    assert by_slot.embodiment == TRAINED_TAG
    listed = run_cli("load", "--version", version, "--embodiment", TRAINED_TAG, "--cache", str(tmp_path / "cache"),
                     "--json")
    assert listed.returncode == 0, listed.stderr[-2000:]
    said = json.loads(listed.stdout)["processor"]
    assert said["embodiment"] == TRAINED_TAG and said["state"]["arm"] == 7 and said["action_horizon"] == 16


def test_a_tampered_processor_file_is_found_and_refused(snapshots, tmp_path):
    folder, _ = _checkpoint(snapshots, "n16", tmp_path / "run")
    done = convert("n16", snapshot=folder, embodiments="trained", cache_root=tmp_path / "cache", progress=False)
    stats = Path(done["cache_path"]) / "processor" / "statistics.json"
    stats.write_bytes(stats.read_bytes().replace(b"0.", b"1.", 1))
    verify = run_cli("cache", "verify", "--cache", str(tmp_path / "cache"))
    assert verify.returncode != 0 and "processor" in verify.stdout + verify.stderr
    with pytest.raises(Exception, match="processor file statistics.json is not what the manifest records"):
        load("n16", tmp_path / "cache", TRAINED_TAG, synthetic=True)


def test_a_fine_tune_whose_statistics_alone_changed_shares_every_tensor_and_writes_none(snapshots, tmp_path):
    folder, docs = _checkpoint(snapshots, "n16", tmp_path / "run")
    first = convert("n16", snapshot=folder, embodiments="trained", cache_root=tmp_path / "cache", progress=False)
    docs["statistics.json"][TRAINED_TAG]["state"]["arm"]["max"][0] += 0.5  # the trainer saw more data
    (folder / "statistics.json").write_text(json.dumps(docs["statistics.json"]))
    second = convert("n16", snapshot=folder, embodiments="trained", cache_root=tmp_path / "cache", progress=False)
    assert second["fingerprint"] != first["fingerprint"] and not second["cache_hit"]
    assert second["bytes_written"] == 0 and second["reused_chunks"] > 0  # every tensor shared, none written
    a, b = Path(first["cache_path"]), Path(second["cache_path"])
    data = [p for p in a.rglob("*") if p.is_file() and p.parent.name != "processor" and p.name != "MANIFEST.json"
            and p.name != "zarr.json"]
    assert data and all(os.path.samefile(p, b / p.relative_to(a)) for p in data)  # the same files, linked
    _acts_as_the_trainer(load("n16", tmp_path / "cache", TRAINED_TAG, entry=b.name, synthetic=True).processor, docs)


def test_a_fine_tune_in_a_bucket_acts_from_a_fresh_cache(snapshots, s3_url, tmp_path, monkeypatch):
    folder, docs = _checkpoint(snapshots, "n17", tmp_path / "run")
    url = f"{s3_url}-processor"
    monkeypatch.setenv("GR00T_CACHE", str(tmp_path / "client"))
    convert("n17", snapshot=folder, embodiments="trained", cache_root=url, progress=False, layout="generic")
    shutil.rmtree(tmp_path / "run")
    shutil.rmtree(tmp_path / "client", ignore_errors=True)
    monkeypatch.setenv("GR00T_CACHE", str(tmp_path / "fresh"))  # another machine: nothing kept here
    loaded = load("n17", url, TRAINED_TAG, layout="generic", synthetic=True)
    _acts_as_the_trainer(loaded.processor, docs)
    store = open_store(url)
    kept = {k for k in store.list("objects") if store.get(k) in
            {json.dumps(d, indent=2).encode() + b"\n" for d in docs.values()}}
    assert len(kept) == 3  # each file once, as the object of its sha256
    gc = run_cli("cache", "gc", "--grace-hours", "0", "--cache", url)
    assert gc.returncode == 0, gc.stderr
    _acts_as_the_trainer(load("n17", url, TRAINED_TAG, layout="generic", synthetic=True).processor, docs)


def test_an_entry_without_a_processor_says_so_with_the_command_that_keeps_one(hf_cache, tmp_path):
    convert("n16", hf_cache=hf_cache, synthetic="micro", embodiments="gr1", cache_root=tmp_path, progress=False)
    loaded = load("n16", tmp_path, "gr1", synthetic=True)
    with pytest.raises(ProcessorError, match="keeps no processor .*; convert it again: python -m pipeline convert "
                                             "--snapshot .* --embodiments trained") as e:
        loaded.processor
    assert "\n" not in str(e.value)


def test_a_tag_the_statistics_do_not_have_is_one_sentence(snapshots, tmp_path):
    folder, _ = _checkpoint(snapshots, "n16", tmp_path / "run")
    convert("n16", snapshot=folder, embodiments="gr1", cache_root=tmp_path / "cache", progress=False)
    loaded = load("n16", tmp_path / "cache", "gr1", synthetic=True)
    with pytest.raises(ProcessorError, match="do not cover embodiment gr1 .*new_embodiment"):
        loaded.processor


def test_the_readmes_processor_lines_run_as_written(snapshots, tmp_path):
    """README "Run a fine-tune from the cache", in a process of its own on a cache holding an Isaac-GR00T N1.6
    fine-tune (its folder deleted). Kernels do not run on the simulated device, so the port's model is the one name
    the test gives: a stand-in whose `run_flow_matching` returns a seeded output of the port's shape; every other
    line runs as written, and the actions it gives are the trainer's own on that output."""
    import re
    import subprocess
    import sys

    from tests.conftest import ROOT

    folder, docs = _checkpoint(snapshots, "n16", tmp_path / "run")
    convert("n16", snapshot=folder, embodiments="trained", cache_root=tmp_path / "cache", progress=False)
    shutil.rmtree(tmp_path / "run")
    block = re.search(r"```python processor\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    output = np.random.default_rng(5).uniform(-1, 1, (1, 16, 29)).astype(np.float32)
    np.save(tmp_path / "output.npy", output)
    stand_in = f'''
import numpy, torch
class _PortModel:  # kernels do not run here: the port's output, of its shape [1, action_horizon, max_action_dim]
    def run_flow_matching(self, features, state, embodiment_id):
        assert tuple(state.shape) == (1, 29) and state.dtype == torch.float32 and embodiment_id == 10
        return torch.from_numpy(numpy.load({str(tmp_path / "output.npy")!r}))
model, features = _PortModel(), None
'''
    report = "\nimport json; print(json.dumps({g: a.tolist() for g, a in actions.items()}))\n"
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", stand_in + block + report], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "GR00T_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    rng = np.random.default_rng(0)  # the README's stand-in readings, made again
    observed = {g: rng.normal(size=(1, 1, len(v["min"])))
                for g, v in docs["statistics.json"][TRAINED_TAG]["state"].items()}
    want = Oracle(docs, TRAINED_TAG).actions(output, observed)
    assert got.keys() == want.keys()
    for group, values in want.items():
        np.testing.assert_allclose(np.asarray(got[group]), values, rtol=1e-5, atol=1e-9)
