"""Fine-tunes as users have them (pipeline/synth.py `fine_tune_form`), for every version: each form's one-slot
reload equals, byte for byte, the conversion of what it stands for, which the test writes itself with
safetensors.torch and rounds with torch (an independent reference): the release-shaped copy for reshard, trainer,
single and LeRobot (whose `embed_tokens` is its `lm_head`); for mixed and half, torch's `.to(torch.bfloat16)` of
every tensor, and the F32 host tables bit for bit as stored. Then every refusal a fine-tune can meet: one
sentence, exit 2, nothing published."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from pipeline.convert import ConvertOptions, convert
from pipeline.load import load
from pipeline.synth import FORMS, LEROBOT_PREFIX, TRAINED_TAG, fine_tune_form
from pipeline.versions import load_config
from tasks.checkpoint import INDEX_NAME
from tasks.entry import open_entry
from tasks.store import LocalStore

ROOT = Path(__file__).resolve().parent.parent
VERSIONS = ("n15", "n16", "n17")


def _save_sharded(tensors: dict[str, torch.Tensor], shard_of: dict[str, str], out: Path) -> Path:
    out.mkdir(parents=True)
    for shard in sorted(set(shard_of.values())):
        save_file({k: t.contiguous() for k, t in tensors.items() if shard_of[k] == shard}, str(out / shard),
                  metadata={"format": "pt", "gr00t_tt_synthetic": "synthetic reference of a fine-tune form"})
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())},
             "weight_map": dict(sorted(shard_of.items()))}
    (out / INDEX_NAME).write_text(json.dumps(index))
    return out


def _read_all(folder: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    tensors, shard_of = {}, {}
    for path in sorted(folder.glob("*.safetensors")):
        for k, t in load_file(str(path)).items():
            tensors[k], shard_of[k] = t, path.name
    return tensors, shard_of


def _bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _stands_for(form: str, version: str, base: Path, snapshot: Path, out: Path) -> Path:
    """What the form is a copy of, written with safetensors.torch (bf16 sharded, with its index)."""
    if form in ("reshard", "trainer", "single"):
        return base
    cfg = load_config(version)
    if form == "lerobot":
        tensors, _ = _read_all(base)
        _, shard_of = _read_all(base)
        tensors[f"{cfg.containers['llm']}embed_tokens.weight"] = tensors[f"{cfg.containers['lm_head']}weight"].clone()
        return _save_sharded(tensors, shard_of, out)
    tensors, shard_of = _read_all(snapshot)
    return _save_sharded({k: t.to(torch.bfloat16) for k, t in tensors.items()}, shard_of, out)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("finetune-cache")


def _entry(opts: ConvertOptions) -> str:
    return Path(convert(opts)["cache_path"]).name


_converted: dict[Path, str] = {}  # a reference already converted (the release copy: one per version)


def _reference_entry(reference: Path, version: str, slot: int, cache_dir: Path) -> str:
    if reference not in _converted:  # converted from its own bytes, linking nothing from the form's entry
        _converted[reference] = _entry(ConvertOptions(version, embodiments=str(slot), snapshot=reference,
                                                      cache_root=cache_dir, progress=False, reuse=False))
    return _converted[reference]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("version", VERSIONS)
def test_every_form_reloads_as_the_conversion_of_what_it_stands_for(snapshots, tmp_path, cache_dir, version, form):
    cfg = load_config(version)
    slot = cfg.embodiment_ids[TRAINED_TAG]
    snapshot = fine_tune_form(snapshots[version], version, form, tmp_path / form)
    given = "trained" if form == "trainer" else TRAINED_TAG  # the trainer folder says which embodiment it was for
    reference = _stands_for(form, version, snapshots[version], snapshot, tmp_path / "reference")
    theirs = _reference_entry(reference, version, slot, cache_dir)
    # A form that re-reads the bytes in new ways (a prefix, a tie, wide dtypes) is converted from them; one that
    # only moves them (shards, folders) may link what it holds: its content ids come from hashing its own files.
    mine = _entry(ConvertOptions(None, embodiments=given, snapshot=snapshot, cache_root=cache_dir, progress=False,
                                 reuse=form in ("reshard", "trainer", "single")))
    got = load(version, cache_dir, slot, entry=mine, synthetic=True)
    want = load(version, cache_dir, slot, entry=theirs, synthetic=True)
    assert got.tensors.keys() == want.tensors.keys()
    arrays = open_entry(LocalStore(cache_dir), mine).manifest.arrays
    wide = _read_all(snapshot)[0] if form == "mixed" else {}
    kept_wide = 0
    for name, tensor in want.tensors.items():
        sources = arrays[name].attributes["sources"]
        if arrays[name].host_only and sources[0] in wide and wide[sources[0]].dtype == torch.float32:
            assert got.tensors[name].dtype == torch.float32  # the F32 bits as stored, never narrowed to bf16
            assert torch.equal(got.tensors[name].reshape(-1), wide[sources[0]].reshape(-1)), name
            kept_wide += 1
            continue
        assert got.tensors[name].dtype == tensor.dtype and _bytes(got.tensors[name]) == _bytes(tensor), name
    assert kept_wide == sum(k.endswith(("q_norm.weight", "k_norm.weight")) for k in wide)
    source = got.source
    assert source.get("synthetic")
    if form == "lerobot":
        assert source["key_prefix"] == LEROBOT_PREFIX and source["tied"] == {
            f"{cfg.containers['llm']}embed_tokens.weight": f"{cfg.containers['lm_head']}weight"}
    if form == "trainer":
        assert source["trained_embodiments"] == [TRAINED_TAG] and got.slot == slot


def _refused(args: list[str], cache: Path) -> str:
    proc = subprocess.run([sys.executable, "-m", "pipeline", "convert", *args, "--cache", str(cache)], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (cache / "entries").exists() or not any((cache / "entries").iterdir())
    return proc.stderr.strip()


def test_an_ambiguous_prefix_and_a_tie_with_no_lm_head_are_refused_in_one_sentence(snapshots, tmp_path):
    cfg = load_config("n16")
    tensors, _ = _read_all(snapshots["n16"])
    mixed_prefixes = {(f"_groot_model.{k}" if i % 2 else f"model.{k}"): t for i, (k, t) in enumerate(tensors.items())}
    (tmp_path / "two").mkdir()
    save_file(mixed_prefixes, str(tmp_path / "two" / "model.safetensors"))
    msg = _refused(["--snapshot", str(tmp_path / "two")], tmp_path / "c1")
    assert "the keys are not all GR00T keys under one prefix (found '_groot_model.', 'model.')" in msg
    stray = tmp_path / "stray"  # a release-shaped folder, and beside it a file that is not the model's
    stray.mkdir()
    for shard in snapshots["n16"].glob("*.safetensors"):
        shutil.copyfile(shard, stray / shard.name)
    save_file({"ema.decay": torch.zeros(4)}, str(stray / "ema.safetensors"))
    msg = _refused(["--snapshot", str(stray)], tmp_path / "c0")
    assert msg.startswith(f"error: {stray / 'ema.safetensors'}, key 'ema.decay': the keys are not all GR00T keys"), msg
    assert "move a stray file out of the folder" in msg
    dropped = {k: t for k, t in tensors.items() if "embed_tokens" not in k and "lm_head" not in k}
    (tmp_path / "untied").mkdir()
    save_file(dropped, str(tmp_path / "untied" / "model.safetensors"))
    msg = _refused(["--snapshot", str(tmp_path / "untied"), "--version", "n16"], tmp_path / "c2")
    assert f"key '{cfg.containers['llm']}embed_tokens.weight': neither the token embedding nor " in msg
    (tmp_path / "untied" / "config.json").write_text(json.dumps({"backbone_cfg": {"tie_word_embeddings": False}}))
    dropped[f"{cfg.containers['lm_head']}weight"] = tensors[f"{cfg.containers['lm_head']}weight"]
    save_file(dropped, str(tmp_path / "untied" / "model.safetensors"))
    msg = _refused(["--snapshot", str(tmp_path / "untied")], tmp_path / "c3")
    assert "does not tie it to" in msg and "tie_word_embeddings is false" in msg


def test_trained_without_metadata_and_an_empty_folder_are_refused_in_one_sentence(snapshots, tmp_path):
    msg = _refused(["--snapshot", str(snapshots["n17"]), "--embodiments", "trained"], tmp_path / "c1")
    assert "--embodiments trained:" in msg and "experiment_cfg/metadata.json does not exist" in msg
    (tmp_path / "empty").mkdir()
    msg = _refused(["--snapshot", str(tmp_path / "empty")], tmp_path / "c2")
    assert "holds no model.safetensors.index.json and no *.safetensors file" in msg


def test_a_model_repo_offline_names_the_download_command(tmp_path, monkeypatch):
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hf")}
    proc = subprocess.run([sys.executable, "-m", "pipeline", "convert", "--model", "someone/groot-n16-so100",
                           "--cache", str(tmp_path / "c")], cwd=ROOT, capture_output=True, text=True,
                          env={**__import__("os").environ, **env})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "someone/groot-n16-so100 at revision main is not in the Hugging Face cache" in proc.stderr
    assert "Fetch it with `hf download someone/groot-n16-so100 --revision main" in proc.stderr


def test_a_model_repo_in_the_hf_cache_converts_with_its_version_found(snapshots, tmp_path, monkeypatch):
    """A fine-tune's own hub repo, already downloaded: found through huggingface_hub's cache layout."""
    import shutil

    hf = tmp_path / "hf"
    repo = hf / "models--someone--groot-n15-so100"
    rev = "a" * 40
    shutil.copytree(snapshots["n15"], repo / "snapshots" / rev)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(rev)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    summary = convert(ConvertOptions(None, model="someone/groot-n15-so100", hf_cache=hf, embodiments="0",
                                     cache_root=tmp_path / "c", progress=False))
    assert summary["version"] == "n15" and summary["version_found"] and summary["source"]["model"] == "someone/groot-n15-so100"
    assert summary["source"]["revision"] == rev


def test_the_readmes_fine_tune_lines_run_as_written(tmp_path):
    """README "Convert your fine-tune": every line, in order, on a fresh cache, as a new user runs them."""
    import os
    import re

    block = re.search(r"## Convert your fine-tune\n.*?```sh\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    lines = [line for line in block.splitlines() if line.strip()]
    assert len(lines) >= 8
    env = {**os.environ, "GR00T_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    outputs = []
    for line in lines:
        cmd = line.replace("python -m pipeline", f"{sys.executable} -m pipeline", 1).replace("build/", f"{tmp_path}/build/")
        proc = subprocess.run(cmd, shell=True, cwd=ROOT, capture_output=True, text=True, env=env)
        assert proc.returncode == 0, (line, proc.stderr[-1500:])
        outputs.append(proc.stdout)
    assert "trained for   new_embodiment (experiment_cfg/metadata.json)" in outputs[1]
    assert "key prefix    '_groot_model.' stripped from every key" in outputs[5] and "n17 (found from its keys)" in outputs[5]
    assert "gr00t-tt-synthetic/GR00T-N1.5-3B-tiny" in outputs[7] and "n15 (found from its keys)" in outputs[7]
    assert "(trained for new_embodiment)" in outputs[8]  # cache ls
