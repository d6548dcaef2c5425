"""Fine-tunes as users have them (pipeline/inputs/synth.py `fine_tune_form`), for every version: each form's one-slot
reload equals, byte for byte, the conversion of what it stands for, which the test writes itself with
safetensors.torch and rounds with torch (an independent reference): the release-shaped copy for reshard, trainer,
single and LeRobot (whose `embed_tokens` is its `lm_head`); for mixed and half, torch's `.to(torch.bfloat16)` of
every tensor, and the F32 host tables bit for bit as stored. Then every refusal a fine-tune can meet: one
sentence, exit 2, nothing published. The forms are made from the micro stand-ins (tiny's dims, one or two layers
per stack): what LeRobot wrote (tests/fixtures) is of the tiny N1.7, and is held to it."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import xxhash
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from pipeline.jobs.convert import ConvertOptions, convert
from pipeline.jobs.load import load
from pipeline.inputs.synth import FORMS, ISAAC_FORMS, LEROBOT_PREFIX, MAPPED_TAG, N15_ONLY_WITHOUT, TRAINED_TAG, fine_tune_form
from pipeline.model.versions import load_config
from tasks.source.checkpoint import INDEX_NAME
from tasks.entries.entry import open_entry
from tasks.entries.store import LocalStore

from tests.conftest import ROOT
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
    """What the form is a copy of, written with safetensors.torch in the release's shape (GR00T keys, every table
    present, sharded with its index): the synthetic release itself for the forms that only move its bf16 bytes;
    for mixed and half, torch's `.to(torch.bfloat16)` of every tensor; for the all-F32 forms, the same F32 tensors."""
    if form in ("reshard", "single", "deepspeed"):
        return base
    cfg = load_config(version)
    _, shard_of = _read_all(base)
    tensors, _ = _read_all(snapshot)
    if form == "lerobot":
        tensors = {k[len(LEROBOT_PREFIX):]: t for k, t in tensors.items()}
        tensors[f"{cfg.containers['llm']}embed_tokens.weight"] = tensors[f"{cfg.containers['lm_head']}weight"].clone()
    if form in ("mixed", "half"):
        tensors = {k: t.to(torch.bfloat16) for k, t in tensors.items()}
    return _save_sharded(tensors, shard_of, out)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("finetune-cache")


def _entry(opts: ConvertOptions) -> str:
    return Path(convert(opts)["cache_path"]).name


_converted: dict[tuple, str] = {}  # references already converted, by version, slot and the bytes of their files


def _reference_entry(reference: Path, version: str, slot: int, cache_dir: Path) -> str:
    """The reference's entry, converted from its own bytes (linking nothing from the form's entry), once for all
    forms whose references hold the same bytes: the Isaac-GR00T folders of one version store the same F32 tensors."""
    files = sorted(reference.iterdir())
    key = (version, slot, tuple((f.name, xxhash.xxh3_128_hexdigest(f.read_bytes())) for f in files))
    if key not in _converted:
        _converted[key] = _entry(ConvertOptions(version, embodiments=str(slot), snapshot=reference,
                                                cache_root=cache_dir, progress=False, reuse=False))
    return _converted[key]


CASES = [(v, f) for v in VERSIONS for f in FORMS if not (v == "n15" and f in N15_ONLY_WITHOUT)]
TRAINER_FORMS = ("lerobot", *ISAAC_FORMS)  # folders that record what they were trained for


@pytest.mark.parametrize(("version", "form"), CASES)
def test_every_form_reloads_as_the_conversion_of_what_it_stands_for(micro_snapshots, tmp_path, cache_dir, version, form):
    cfg = load_config(version)
    slot = 10 if form == "mapped" else cfg.embodiment_ids[TRAINED_TAG]  # Isaac-GR00T's map: robocasa_gr1_tabletop 10
    snapshot = fine_tune_form(micro_snapshots[version], version, form, tmp_path / form)
    weights, _ = _read_all(snapshot)
    if form in TRAINER_FORMS and form != "deepspeed":  # the stand-in is all F32, as the trainer saves it
        assert {t.dtype for t in weights.values()} == {torch.float32}
    given = "trained" if form in TRAINER_FORMS else TRAINED_TAG  # a trainer's folder says which embodiment it was for
    reference = _stands_for(form, version, micro_snapshots[version], snapshot, tmp_path / "reference")
    theirs = _reference_entry(reference, version, slot, cache_dir)
    # A form that re-reads the bytes in new ways (a prefix, a tie, wide dtypes) is converted from them; one that
    # only moves them (shards, folders) may link what it holds: its content ids come from hashing its own files.
    mine = _entry(ConvertOptions(None, embodiments=given, snapshot=snapshot, cache_root=cache_dir, progress=False,
                                 reuse=form in ("reshard", "single", "deepspeed")))
    got = load(version, cache_dir, slot, entry=mine, synthetic=True)
    want = load(version, cache_dir, slot, entry=theirs, synthetic=True)
    assert got.tensors.keys() == want.tensors.keys() and got.slot == slot
    manifest = open_entry(LocalStore(cache_dir), mine).manifest
    files = sorted(snapshot.glob("*.safetensors")) if snapshot.is_dir() else [snapshot]
    # a trainer's folder is named and checked by its tensors' content; no sha256 is taken unless asked (--sha256)
    assert manifest.shards_sha256 == {} and set(manifest.shards) == {f.name for f in files}
    assert all(v.startswith("xxh3-128:") for v in manifest.shards.values())
    arrays = manifest.arrays
    wide = weights if form == "mixed" else {}
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
        assert source["tied_by"] == "the __metadata__ of model.safetensors"
        assert source["trained_from"] == str(snapshot / "config.json")
        assert source["embodiment_map"] == (f"configs/{version}.toml" if version == "n16" else  # no LeRobot N1.6
                                            f"LeRobot {cfg.lerobot['release']}'s own table (configs/{version}.toml [lerobot])")
    if form in ISAAC_FORMS:
        tag = MAPPED_TAG if form == "mapped" else TRAINED_TAG
        assert source["trained_embodiments"] == [tag]
        record = "experiment_cfg/metadata.json" if version == "n15" else "experiment_cfg/conf.yaml"
        assert source["trained_from"] == str(snapshot / record)
        run = snapshot.parent if snapshot.name.startswith("checkpoint-") else snapshot
        where = {"checkpoint": snapshot, "deepspeed": snapshot, "mapped": snapshot}.get(form, run / "processor")
        assert source["embodiment_map"] == (f"configs/{version}.toml" if version == "n15" else
                                            str(where / "embodiment_id.json"))


def _refused(args: list[str], cache: Path) -> str:
    proc = subprocess.run([sys.executable, "-m", "pipeline", "convert", *args, "--cache", str(cache)], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (cache / "entries").exists() or not any((cache / "entries").iterdir())
    return proc.stderr.strip()


def test_an_ambiguous_prefix_and_a_tie_with_no_lm_head_are_refused_in_one_sentence(micro_snapshots, tmp_path):
    cfg = load_config("n16")
    tensors, _ = _read_all(micro_snapshots["n16"])
    mixed_prefixes = {(f"_groot_model.{k}" if i % 2 else f"model.{k}"): t for i, (k, t) in enumerate(tensors.items())}
    (tmp_path / "two").mkdir()
    save_file(mixed_prefixes, str(tmp_path / "two" / "model.safetensors"))
    msg = _refused(["--snapshot", str(tmp_path / "two")], tmp_path / "c1")
    assert "the keys are not all GR00T keys under one prefix (found '_groot_model.', 'model.')" in msg
    stray = tmp_path / "stray"  # a release-shaped folder, and beside it a file that is not the model's: left alone
    stray.mkdir()
    for shard in micro_snapshots["n16"].glob("*.safetensors"):
        shutil.copyfile(shard, stray / shard.name)
    shutil.copyfile(micro_snapshots["n16"] / INDEX_NAME, stray / INDEX_NAME)
    save_file({"ema.decay": torch.zeros(4)}, str(stray / "ema.safetensors"))
    proc = subprocess.run([sys.executable, "-m", "pipeline", "convert", "--snapshot", str(stray), "--embodiments", "0",
                           "--cache", str(tmp_path / "c0")], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "note          not read: ema.safetensors (not one of the model's weight files by name)" in proc.stdout
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


def test_trained_without_a_record_and_an_empty_folder_are_refused_in_one_sentence(micro_snapshots, tmp_path):
    msg = _refused(["--snapshot", str(micro_snapshots["n17"]), "--embodiments", "trained"], tmp_path / "c1")
    assert "--embodiments trained:" in msg and "records no trained embodiment (looked for " in msg
    assert "config.json" in msg and "experiment_cfg/conf.yaml" in msg and "experiment_cfg/metadata.json" in msg
    (tmp_path / "empty").mkdir()
    msg = _refused(["--snapshot", str(tmp_path / "empty")], tmp_path / "c2")
    assert "holds no model.safetensors.index.json, no model.safetensors and no model-NNNNN-of-NNNNN" in msg


def _trainer_folder(snapshots, tmp_path, version: str, form: str) -> Path:
    return fine_tune_form(snapshots[version], version, form, tmp_path / f"{version}-{form}")


def test_a_lora_adapter_a_statistics_only_folder_and_an_unknown_tag_are_refused_in_one_sentence(micro_snapshots, tmp_path):
    lora = tmp_path / "lora"  # Isaac-GR00T N1.5's utils/peft.py save: the adapter, no base weights
    lora.mkdir()
    save_file({"base_model.model.action_head.model.proj_out_2.lora_A.weight": torch.zeros(8, 32)},
              str(lora / "adapter_model.safetensors"))
    (lora / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "nvidia/GR00T-N1.5-3B",
                                                          "peft_type": "LORA", "r": 8}))
    msg = _refused(["--snapshot", str(lora)], tmp_path / "c1")
    assert "is a LoRA adapter, not a model" in msg and "base: nvidia/GR00T-N1.5-3B" in msg
    assert "merge_and_unload()" in msg and "save_pretrained" in msg
    stats = tmp_path / "pretrained_model"  # LeRobot's folder with its normalizer files but no model.safetensors
    stats.mkdir()
    save_file({"action.max": torch.zeros(4)}, str(stats / "policy_postprocessor_step_0_unnormalizer_processor.safetensors"))
    (stats / "config.json").write_text(json.dumps({"type": "groot", "embodiment_tag": "new_embodiment"}))
    msg = _refused(["--snapshot", str(stats)], tmp_path / "c2")
    assert "holds no model.safetensors.index.json, no model.safetensors" in msg
    assert "only policy_postprocessor_step_0_unnormalizer_processor.safetensors" in msg
    folder = _trainer_folder(micro_snapshots, tmp_path, "n17", "mapped")
    msg = _refused(["--snapshot", str(folder), "--embodiments", "so101_follower"], tmp_path / "c3")
    assert f"unknown embodiment tag 'so101_follower' for n17 ({folder / 'embodiment_id.json'} knows: " in msg
    assert "robocasa_gr1_tabletop" in msg and "new_embodiment" in msg


def test_the_checkpoints_map_wins_over_ours_and_the_convert_says_so(micro_snapshots, tmp_path):
    folder = _trainer_folder(micro_snapshots, tmp_path, "n16", "checkpoint")
    ids = json.loads((folder / "embodiment_id.json").read_text())
    (folder / "embodiment_id.json").write_text(json.dumps({**ids, "new_embodiment": 12}))
    proc = subprocess.run([sys.executable, "-m", "pipeline", "convert", "--snapshot", str(folder), "--embodiments",
                           "trained", "--cache", str(tmp_path / "c"), "--json"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["slots"] == [12] and summary["source"]["embodiment_map"] == str(folder / "embodiment_id.json")
    assert ("embodiment new_embodiment: slot 12 by " + str(folder / "embodiment_id.json") +
            ", not 10 as in configs/n16.toml: using the checkpoint's") in summary["notes"]


def test_isaac_config_yaml_is_read_without_importing_its_classes(micro_snapshots, tmp_path):
    """`config.yaml` is `yaml.dump` of the trainer's dataclasses (python tags, an enum): read as plain data."""
    folder = _trainer_folder(micro_snapshots, tmp_path, "n17", "best")
    (folder / "experiment_cfg" / "conf.yaml").unlink()
    text = (folder / "experiment_cfg" / "config.yaml").read_text()
    assert "!!python/object:gr00t.configs.base_config.Config" in text and "!!python/object/apply:" in text
    summary = convert(ConvertOptions(None, embodiments="trained", snapshot=folder, cache_root=tmp_path / "c",
                                     progress=False))
    assert summary["source"]["trained_embodiments"] == [TRAINED_TAG] and summary["slots"] == [10]
    assert summary["source"]["trained_from"] == str(folder / "experiment_cfg" / "config.yaml")
    assert "gr00t" not in sys.modules  # nothing the YAML names was imported
    (folder / "experiment_cfg" / "config.yaml").write_text("data: !!python/object/new:os.system [echo hi]\n  x: [")
    msg = _refused(["--snapshot", str(folder), "--embodiments", "trained"], tmp_path / "c2")
    assert f"error: {folder / 'experiment_cfg' / 'config.yaml'}: is not YAML the trainer could have written" in msg


def test_isaac_run_configs_that_disagree_on_the_tag_are_said_and_conf_yaml_stands(micro_snapshots, tmp_path):
    """Isaac-GR00T writes conf.yaml and config.yaml from one run config; config.yaml edited to a tag the
    checkpoint's map puts at another slot moves nothing, and the convert says the two differ."""
    folder = _trainer_folder(micro_snapshots, tmp_path, "n16", "checkpoint")
    slots = json.loads((folder / "embodiment_id.json").read_text())
    other = next(tag for tag, slot in slots.items() if slot != slots[TRAINED_TAG])
    config = folder / "experiment_cfg" / "config.yaml"
    assert config.read_text().count(f"embodiment_tag: {TRAINED_TAG}\n") == 1
    before = convert(ConvertOptions(None, embodiments="trained", snapshot=folder, cache_root=tmp_path / "c",
                                    progress=False))
    assert not any("differs" in n for n in before["notes"])
    config.write_text(config.read_text().replace(f"embodiment_tag: {TRAINED_TAG}\n", f"embodiment_tag: {other}\n"))
    after = convert(ConvertOptions(None, embodiments="trained", snapshot=folder, cache_root=tmp_path / "c",
                                   progress=False))
    assert after["slots"] == before["slots"] == [slots[TRAINED_TAG]]
    conf = folder / "experiment_cfg" / "conf.yaml"
    assert (f"embodiment_tag {other} in {config} differs from {TRAINED_TAG} in {conf}, which is read first: using "
            f"{TRAINED_TAG}") in after["notes"]


def test_a_trained_tag_record_that_cannot_be_read_stops_only_embodiments_trained(micro_snapshots, tmp_path):
    """Its refusal says "pass --embodiments with tags or slot ids instead", and a slot id was refused the same way:
    now it converts that slot, says the record cannot be read, and records no trained tag."""
    folder = _trainer_folder(micro_snapshots, tmp_path, "n16", "checkpoint")
    conf = folder / "experiment_cfg" / "conf.yaml"
    conf.write_text("data: {datasets: [")
    msg = _refused(["--snapshot", str(folder), "--embodiments", "trained"], tmp_path / "c1")
    assert msg.startswith(f"error: {conf}: is not YAML the trainer could have written") and \
        msg.endswith("; pass --embodiments with tags or slot ids instead")
    done = convert(ConvertOptions(None, embodiments="10", snapshot=folder, cache_root=tmp_path / "c2", progress=False))
    assert done["slots"] == [10] and done["source"]["trained_embodiments"] is None
    assert any(n.startswith(f"the trained embodiment is not recorded: {conf}: is not YAML") for n in done["notes"])
    for text, said in (("- 1\n- 2\n", "holds list"), ("", "holds nothing"), ("just words\n", "holds str")):
        conf.write_text(text)  # YAML, but not the run config's mapping: it said "names no embodiment_tag"
        msg = _refused(["--snapshot", str(folder), "--embodiments", "trained"], tmp_path / "c1")
        assert msg.startswith(f"error: {conf}: {said}, not the mapping the trainer writes; pass --embodiments"), msg


def test_a_relabelled_tensor_is_named_with_its_dtype(micro_snapshots, tmp_path):
    """One DiT weight relabelled F32 with its shape halved (the file still valid): the refusal names it."""
    tensors, shard_of = _read_all(micro_snapshots["n17"])
    key = "action_head.model.transformer_blocks.1.ff.net.2.weight"
    out_dim, in_dim = tensors[key].shape
    tensors[key] = tensors[key].reshape(-1).view(torch.float32).reshape(out_dim // 2, in_dim)
    folder = _save_sharded(tensors, shard_of, tmp_path / "relabelled")
    msg = _refused(["--snapshot", str(folder)], tmp_path / "c")
    assert f"key '{key}': F32 tensor of shape [{out_dim // 2}, {in_dim}], where GR00T n17 has [{out_dim}, {in_dim}]" in msg


def test_the_hub_fetch_takes_the_weights_and_the_small_files_only():
    """What `--model` downloads of a trainer's repo, filtered by huggingface_hub's own pattern matching."""
    from huggingface_hub.utils import filter_repo_objects

    from pipeline.inputs.trainer_files import HUB_FILES

    repo = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json",
            "config.json", "embodiment_id.json", "processor/embodiment_id.json", "experiment_cfg/conf.yaml",
            "experiment_cfg/config.yaml", "experiment_cfg/metadata.json",
            "statistics.json", "processor_config.json", "processor/statistics.json", "policy_postprocessor.json",
            "policy_preprocessor_step_3_normalizer_processor.safetensors",  # the processor files the entry keeps
            "optimizer.pt", "rng_state.pth", "global_step1000/mp_rank_00_model_states.pt", "zero_to_fp32.py", "latest",
            "experiment_cfg/initial_actions.npz", "experiment_cfg/dataset_statistics.json"]
    fetched = sorted(filter_repo_objects(repo, allow_patterns=HUB_FILES))
    assert fetched == sorted(repo[:14])


def test_a_model_repo_offline_names_the_download_command(tmp_path, monkeypatch):
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hf")}
    proc = subprocess.run([sys.executable, "-m", "pipeline", "convert", "--model", "someone/groot-n16-so100",
                           "--cache", str(tmp_path / "c")], cwd=ROOT, capture_output=True, text=True,
                          env={**__import__("os").environ, **env})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "someone/groot-n16-so100 at revision main is not in the Hugging Face cache" in proc.stderr
    assert "Fetch it with `hf download someone/groot-n16-so100 --revision main" in proc.stderr


def test_a_model_repo_in_the_hf_cache_converts_with_its_version_found(micro_snapshots, tmp_path, monkeypatch):
    """A fine-tune's own hub repo, already downloaded: found through huggingface_hub's cache layout."""
    import shutil

    hf = tmp_path / "hf"
    repo = hf / "models--someone--groot-n15-so100"
    rev = "a" * 40
    shutil.copytree(micro_snapshots["n15"], repo / "snapshots" / rev)
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
    tmp = str(tmp_path)
    assert f"trained for   new_embodiment ({tmp}/build/fine-tunes/isaac-n16/checkpoint-1000/experiment_cfg/conf.yaml)" in outputs[1]
    assert f"tags mapped by {tmp}/build/fine-tunes/isaac-n16/checkpoint-1000/embodiment_id.json: slots 10" in outputs[1]
    assert f"tags mapped by {tmp}/build/fine-tunes/isaac-n17/processor/embodiment_id.json: slots 10" in outputs[3]
    run = f"{tmp}/build/fine-tunes/isaac-n17-run"  # a best-metric save: its own experiment_cfg, the run's map
    assert f"trained for   new_embodiment ({run}/checkpoint-800-best-eval_loss_0.0123/experiment_cfg/conf.yaml)" in outputs[5]
    assert f"tags mapped by {run}/processor/embodiment_id.json: slots 10" in outputs[5]
    assert "trained for   new_embodiment" in outputs[7] and "note" not in outputs[7]  # DeepSpeed's files left alone
    assert "trained for   new_embodiment" in outputs[9] and "slots 31" in outputs[9]
    assert ("trained for new_embodiment (tests/fixtures/lerobot-n17/pretrained_model/policy_preprocessor.json): slots 10, "
            "by tests/fixtures/lerobot-n17/pretrained_model/policy_preprocessor.json") in outputs[10]  # inspect
    assert outputs[10].startswith("n17 (found from its keys): ")
    assert "trained for   new_embodiment (tests/fixtures/lerobot-n17/pretrained_model/policy_preprocessor.json)" in outputs[11]
    assert "tags mapped by tests/fixtures/lerobot-n17/pretrained_model/policy_preprocessor.json: slots 10" in outputs[11]
    assert "note          not read: policy_postprocessor_step_0_" in outputs[11] and "SYNTHETIC" in outputs[11]
    assert "gr00t-tt-synthetic/GR00T-N1.5-3B-tiny" in outputs[15] and "n15 (found from its keys)" in outputs[15]
    assert "(trained for new_embodiment, read from " in outputs[16]  # cache ls
    assert f"read from {tmp}/build/fine-tunes/isaac-n15/checkpoint-1000/experiment_cfg/metadata.json, slots by " \
           "configs/n15.toml)" in outputs[16]
    assert ("read from tests/fixtures/lerobot-n17/pretrained_model/policy_preprocessor.json, slots by "
            "tests/fixtures/lerobot-n17/pretrained_model/policy_preprocessor.json)") in outputs[16]


# -- what LeRobot itself wrote (tests/fixtures/lerobot-n17: generate.py, VERSIONS.json) -------------------------------
FIXTURE = ROOT / "tests" / "fixtures" / "lerobot-n17"


def _rebuilt(variant: str, out: Path) -> Path:
    """A variant kept as its JSON files and its safetensors header, its data laid out again from
    pretrained_model's tensors (the generator checked they are the same tensors) at the header's offsets."""
    full = load_file(str(FIXTURE / "pretrained_model" / "model.safetensors"))
    folder = out / variant
    shutil.copytree(FIXTURE / variant, folder)
    for path in folder.glob("*.safetensors.header"):
        raw = path.read_bytes()
        header = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
        entries = {k: e for k, e in header.items() if k != "__metadata__"}
        data = bytearray(max(e["data_offsets"][1] for e in entries.values()))
        for key, e in entries.items():
            assert list(full[key].shape) == e["shape"] and e["dtype"] == "F32", key
            data[e["data_offsets"][0]:e["data_offsets"][1]] = _bytes(full[key])
        path.with_name(path.name[:-len(".header")]).write_bytes(raw + bytes(data))
        path.unlink()
    return folder


@pytest.mark.parametrize("variant", ["pretrained_model", "save_pretrained", "hub_save"])
def test_what_lerobot_wrote_converts_as_the_same_weights_in_the_release_shape(snapshots, tmp_path, cache_dir, variant):
    cfg = load_config("n17")
    embed, head = f"{cfg.containers['llm']}embed_tokens.weight", f"{cfg.containers['lm_head']}weight"
    written = FIXTURE / "pretrained_model" / "model.safetensors"
    with safe_open(str(written), "pt") as f:  # what LeRobot's save recorded: the tie, F32 throughout
        assert f.metadata()[LEROBOT_PREFIX + embed] == LEROBOT_PREFIX + head
    tensors = load_file(str(written))
    assert {t.dtype for t in tensors.values()} == {torch.float32} and LEROBOT_PREFIX + embed not in tensors
    release = {k[len(LEROBOT_PREFIX):]: t for k, t in tensors.items()}
    release[embed] = release[head].clone()
    _, shard_of = _read_all(snapshots["n17"])  # the release's shards: the same keys, cut where the release cuts them
    assert release.keys() == shard_of.keys()
    theirs = _reference_entry(_save_sharded(release, shard_of, tmp_path / "reference"), "n17", 10, cache_dir)
    snapshot = FIXTURE / variant if variant == "pretrained_model" else _rebuilt(variant, tmp_path)
    if variant == "save_pretrained":
        snapshot = snapshot / "model.safetensors"  # the file itself
    summary = convert(ConvertOptions(None, embodiments="trained", snapshot=snapshot, cache_root=cache_dir,
                                     progress=False, reuse=False))
    assert summary["version"] == "n17" and summary["slots"] == [10] and summary["source"]["synthetic"]
    assert summary["source"]["trained_embodiments"] == ["new_embodiment"]
    if variant == "pretrained_model":
        assert sorted(summary["source"]["left_alone"]) == sorted(
            p.name for p in snapshot.glob("policy_*processor_step_*.safetensors")) and len(summary["notes"]) == 2
    got = load("n17", cache_dir, 10, entry=Path(summary["cache_path"]).name, synthetic=True)
    want = load("n17", cache_dir, 10, entry=theirs, synthetic=True)
    assert got.tensors.keys() == want.tensors.keys()
    for name, tensor in want.tensors.items():
        assert got.tensors[name].dtype == tensor.dtype and _bytes(got.tensors[name]) == _bytes(tensor), name


# Tags LeRobot's own run packed (generate.py: its saved preprocessor, stepped through on one sample), not the converter
PACKED = {tag: json.loads((FIXTURE / f"pretrained_model-{tag}" / "packed.json").read_text())
          for tag in json.loads((FIXTURE / "VERSIONS.json").read_text())["other_tags"]}


@pytest.mark.parametrize("tag", sorted(PACKED))
def test_a_lerobot_tag_gets_the_slot_lerobot_packed_it_with(tmp_path, cache_dir, tag):
    """`unitree_g1_sonic` (slot 11 in Isaac-GR00T's table, absent from LeRobot's) and a custom tag: LeRobot packs
    both as slot 0, and so does the convert, read from the trained tag or passed by hand, with a note naming the
    tag and the file. A slot id passed by hand is that slot."""
    packed = PACKED[tag]
    assert packed["embodiment_tag"] == tag and packed["pack_step"] == "GrootN17PackInputsStep"
    folder = _rebuilt(f"pretrained_model-{tag}", tmp_path)
    preprocessor = folder / "policy_preprocessor.json"
    note = (f"embodiment {tag}: not in the map of {preprocessor}, and LeRobot trains a tag outside its map as slot "
            f"{packed['embodiment_id']}: using slot {packed['embodiment_id']}")
    trained = convert(ConvertOptions(None, embodiments="trained", snapshot=folder, cache_root=cache_dir, progress=False))
    assert trained["slots"] == [packed["embodiment_id"]]
    assert trained["source"]["trained_embodiments"] == [tag] and trained["source"]["trained_from"] == str(preprocessor)
    assert trained["source"]["embodiment_map"] == str(preprocessor)
    ours = load_config("n17").embodiment_ids.get(tag)
    assert (note + (f", not {ours} as in configs/n17.toml" if ours is not None else "")) in trained["notes"]
    by_hand = convert(ConvertOptions(None, embodiments=tag, snapshot=folder, cache_root=cache_dir, progress=False))
    assert by_hand["slots"] == [packed["embodiment_id"]] and by_hand["fingerprint"] == trained["fingerprint"]
    assert any(n.startswith(note) for n in by_hand["notes"])
    assert trained["source"]["embodiment_table"]["unknown_slot"] == 0 and tag not in trained["source"]["embodiment_table"]["ids"]
    loaded = load("n17", cache_dir, tag, entry=Path(trained["cache_path"]).name, synthetic=True)  # a later process,
    assert loaded.slot == packed["embodiment_id"]                                                # by the same tag
    assert load("n17", cache_dir, tag, synthetic=True).slot == packed["embodiment_id"]  # found by the tag alone
    by_id = convert(ConvertOptions(None, embodiments="11", snapshot=folder, cache_root=cache_dir, progress=False))
    assert by_id["slots"] == [11] and not any(n.startswith(f"embodiment {tag}") for n in by_id["notes"])


def test_a_lerobot_export_without_processors_is_read_with_lerobots_own_table(tmp_path):
    """`save_pretrained` alone: the tag from `config.json`, the map LeRobot packs with when the base has none (its
    release's table), said in a note; with `embodiment_id.json` beside it, Isaac-GR00T's rule instead."""
    from pipeline.inputs.embodiments import Embodiments
    from pipeline.inputs.folder import read_folder

    folder = _rebuilt("pretrained_model-unitree_g1_sonic", tmp_path)
    for path in folder.glob("policy_*"):
        path.unlink()
    read = read_folder(folder)
    assert read.trained.value == ("unitree_g1_sonic",) and read.trained.source == str(folder / "config.json")
    assert read.slots(Embodiments.parse("trained")) == (0,) and read.slots(Embodiments.parse("libero_sim")) == (2,)
    assert "configs/n17.toml [lerobot]" in read.tag_map.source
    notes = read.notes(Embodiments.parse("trained"))
    assert any(n.startswith("LeRobot saved its tag -> slot map only in policy_preprocessor.json") for n in notes)
    (folder / "embodiment_id.json").write_text(json.dumps({"unitree_g1_sonic": 11}))
    assert read_folder(folder).slots(Embodiments.parse("trained")) == (11,)


def test_a_config_tag_that_differs_from_the_pack_steps_is_said_and_the_pack_step_stands(tmp_path, cache_dir):
    """LeRobot writes both from one value; one edited by hand (here config.json, to a tag its map puts at another
    slot) must not move the slot in silence: the pack step packed the batches, and the convert says they differ."""
    from pipeline.inputs.folder import read_folder

    folder = _rebuilt("pretrained_model", tmp_path)
    steps = json.loads((folder / "policy_preprocessor.json").read_text())["steps"]
    pack = next(s["config"] for s in steps if s["registry_name"] == "groot_n1_7_pack_inputs_v1")
    assert not any("differs" in n for n in read_folder(folder).notes())  # as LeRobot wrote it: nothing to say
    config = json.loads((folder / "config.json").read_text())
    trained = pack["embodiment_mapping"][pack["embodiment_tag"]]
    other = next(tag for tag, slot in pack["embodiment_mapping"].items() if slot != trained)
    (folder / "config.json").write_text(json.dumps({**config, "embodiment_tag": other}))
    done = convert(ConvertOptions(None, embodiments="trained", snapshot=folder, cache_root=cache_dir, progress=False))
    assert done["slots"] == [trained]
    assert (f"embodiment_tag {other} in {folder / 'config.json'} differs from {pack['embodiment_tag']} in the pack "
            f"step of {folder / 'policy_preprocessor.json'}, which packed the batches the policy trained on: using "
            f"{pack['embodiment_tag']}") in done["notes"]


def test_inspect_finds_the_version_and_says_what_a_lerobot_folder_was_trained_for(tmp_path):
    """As a user looks at a trainer's folder before converting it: no --version (found from the keys, as the convert
    finds it), the tag the pack step packed and its slot by the pack step's own map, and the notes the convert
    would print. Compared with what LeRobot wrote in the folder, read here as plain JSON."""
    from tests.conftest import run_cli

    folder = FIXTURE / "pretrained_model"
    steps = json.loads((folder / "policy_preprocessor.json").read_text())["steps"]
    pack = next(s["config"] for s in steps if s["registry_name"] == "groot_n1_7_pack_inputs_v1")
    done = run_cli("inspect", "--snapshot", str(folder), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["version"] == "n17" and report["version_found"]
    assert report["trained_embodiments"] == [pack["embodiment_tag"]]
    assert report["trained_slots"] == [pack["embodiment_mapping"][pack["embodiment_tag"]]]
    assert report["trained_from"] == report["embodiment_map"] == str(folder / "policy_preprocessor.json")
    text = run_cli("inspect", "--snapshot", str(folder)).stdout
    assert text.startswith("n17 (found from its keys): ")
    assert (f"  trained for {pack['embodiment_tag']} ({folder / 'policy_preprocessor.json'}): slots "
            f"{pack['embodiment_mapping'][pack['embodiment_tag']]}, by {folder / 'policy_preprocessor.json'}") in text
    assert "  note: not read: policy_preprocessor_step_2_groot_n1_7_pack_inputs_v1.safetensors" in text


def test_a_recorded_tie_to_a_table_of_another_shape_is_refused(tmp_path):
    """LeRobot records the dropped embed_tokens in `__metadata__` as tied to lm_head. A record naming a table of
    another shape was taken as it was: the entry was published with an embed_tokens of that table's shape."""
    folder = _rebuilt("pretrained_model-my_robot", tmp_path)
    path = folder / "model.safetensors"
    raw = path.read_bytes()
    size = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + size])
    embed, wrong = (f"{LEROBOT_PREFIX}backbone.model.model.language_model.embed_tokens.weight",
                    f"{LEROBOT_PREFIX}action_head.state_encoder.layer1.b")
    assert header["__metadata__"][embed] == f"{LEROBOT_PREFIX}backbone.model.lm_head.weight"  # as LeRobot wrote it
    assert header[wrong]["shape"] != header[f"{LEROBOT_PREFIX}backbone.model.lm_head.weight"]["shape"]
    header["__metadata__"][embed] = wrong
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + size:])
    msg = _refused(["--snapshot", str(folder), "--embodiments", "trained"], tmp_path / "c")
    assert msg.startswith(f"error: {path}, key 'backbone.model.model.language_model.embed_tokens.weight': is read from "
                          f"'{wrong[len(LEROBOT_PREFIX):]}', which the file's records tie it to"), msg
    assert "the tie names another table" in msg


def test_a_broken_lerobot_pack_step_is_one_sentence(tmp_path):
    folder = _rebuilt("pretrained_model-my_robot", tmp_path)
    doc = json.loads((folder / "policy_preprocessor.json").read_text())
    pack = next(s for s in doc["steps"] if s["registry_name"] == "groot_n1_7_pack_inputs_v1")
    pack["config"]["embodiment_mapping"] = {"my_robot": "three"}
    (folder / "policy_preprocessor.json").write_text(json.dumps(doc))
    msg = _refused(["--snapshot", str(folder), "--embodiments", "trained"], tmp_path / "c")
    assert msg.startswith(f"error: {folder / 'policy_preprocessor.json'}") and "embodiment_mapping" in msg
    # the remedy, as said (it said "or pass --embodiments with slot ids", which were refused the same way)
    assert msg.endswith("; fix it, or remove it to convert with the trainer's default map")
    assert _refused(["--snapshot", str(folder), "--embodiments", "0"], tmp_path / "c") == msg
    (folder / "policy_preprocessor.json").unlink()
    done = convert(ConvertOptions(None, embodiments="trained", snapshot=folder, cache_root=tmp_path / "c2",
                                  progress=False))
    assert done["slots"] == [0] and any(n.startswith("LeRobot saved its tag -> slot map only in") for n in done["notes"])


def test_isaac_forms_are_cut_as_the_hf_trainer_cuts_them():
    """Full size, all F32 (13.8 GB for N1.7): three shards of at most 5 GB, in key order; below 5 GB one file."""
    from pipeline.model.state_dict import tensor_specs
    from pipeline.inputs.synth import hf_shards

    sizes = {s.key: 2 * s.nbytes for s in tensor_specs("n17", "full")}  # F32: twice the bf16 bytes
    cut = hf_shards(sizes)
    names = sorted(set(cut.values()))
    assert names == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    assert all(sum(n for k, n in sizes.items() if cut[k] == name) <= 5_000_000_000 for name in names)
    assert list(cut.values()) == sorted(cut.values())  # consecutive keys, as the save walks the state dict
    assert set(hf_shards({k: n for k, n in list(sizes.items())[:10]}).values()) == {"model.safetensors"}


def test_every_tag_of_issue_47s_table_reads_as_lerobot_trains_it(tmp_path):
    """The table of issue 47, through one LeRobot 0.6.1 folder's saved map (tags LeRobot knows are never refused):
    libero_sim 2, new_embodiment 10, unitree_g1_sonic 0 (not 11), real_g1_relative_eef_relative_joints 25, a custom
    tag 0; the slots are the saved map's own values, read here from the file, not from the converter."""
    from pipeline.inputs.embodiments import Embodiments
    from pipeline.inputs.folder import read_folder

    folder = _rebuilt("pretrained_model-my_robot", tmp_path)
    pack = next(s for s in json.loads((folder / "policy_preprocessor.json").read_text())["steps"]
                if s["registry_name"] == "groot_n1_7_pack_inputs_v1")["config"]["embodiment_mapping"]
    read = read_folder(folder)
    want = {"libero_sim": pack["libero_sim"], "new_embodiment": pack["new_embodiment"], "unitree_g1_sonic": 0,
            "real_g1_relative_eef_relative_joints": pack["real_g1_relative_eef_relative_joints"], "my_robot": 0}
    assert want == {"libero_sim": 2, "new_embodiment": 10, "unitree_g1_sonic": 0,
                    "real_g1_relative_eef_relative_joints": 25, "my_robot": 0}
    for tag, slot in want.items():
        assert read.slots(Embodiments.parse(tag)) == (slot,), tag
        said = [n for n in read.notes(Embodiments.parse(tag)) if n.startswith(f"embodiment {tag}:")]
        assert bool(said) == (tag not in pack), (tag, said)  # a note exactly where LeRobot's map lacks the tag
