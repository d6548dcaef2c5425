"""The port runs from the cache: tt-metal's own `Gr00tN16ModelTTNN`, built two ways from one synthetic snapshot —
by the port's own weight loader and constructors (the reference), and from a cache entry (pipeline/port_n16/) —
must be the same object graph: every ttnn tensor (dtype, layout, shape, padded shape, ttnn's serialized bytes) and
every other attribute. The port's code is the pinned copy in ../shared/consumers, run unedited.

The `attn` scale is used: the real attention shapes, so the port's cross-attention test (to_k not square) sees
what it sees on the release; 2 embodiment slots, 1-2 layers per stack."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import struct
import sys
from pathlib import Path

import pytest

from pipeline import port_n16
from pipeline.jobs.convert import ConvertOptions, convert
from pipeline.inputs.synth import synthesize
from tasks.entries.manifest import checksum
from tasks.entries.names import chunk_file, manifest_key
from tasks.errors import CacheError, ConfigError, PipelineError
from tests.required import needs

SHARED = Path(__file__).resolve().parents[2] / "shared" / "consumers"
PORT = SHARED / "tt-metal"
FUSED = SHARED / "variants" / "ttnn_dit_optimized.fused.py"
PORT_DIT = "models/experimental/gr00t_n1_6/tt/ttnn_dit_optimized.py"

pytestmark = pytest.mark.skipif(not (PORT / "models").is_dir(),
                                reason=needs("port", f"the port's pinned code ({PORT}) is not here"))


def independent_config():
    """The port's config for the attn-scale snapshot, written here from configs/n16.toml [dims.attn] (not by
    port_n16.port_config): the published N1.6 but for one vision layer, one Qwen3 layer with a 512-wide MLP,
    two DiT blocks and two embodiment slots."""
    from models.experimental.gr00t_n1_6.common.configs import Gr00tN16Config

    config = Gr00tN16Config.default()
    config.backbone.vision.num_hidden_layers = 1
    config.backbone.language.select_layer = 1
    config.backbone.language.intermediate_size = 512
    config.dit.num_layers = 2
    config.embodiment.max_num_embodiments = 2
    return config


@pytest.fixture(scope="module")
def attn(tmp_path_factory):
    """An attn-scale N1.6 snapshot and a cache holding it in both layout revisions, every slot."""
    root = tmp_path_factory.mktemp("port")
    snapshot = synthesize("n16", root / "hf", "attn")
    for layout in ("tt-n16", "tt-n16-fused"):
        convert(ConvertOptions("n16", embodiments="all", hf_cache=root / "hf", synthetic="attn",
                               cache_root=root / "cache", layout=layout, progress=False))
    port_n16.PortCode.find(PORT).attr("common.configs:Gr00tN16Config")  # the port's package on sys.path
    return snapshot, root / "cache"


@pytest.fixture(scope="module")
def fused_port(tmp_path_factory):
    """A tt-metal tree at the fused-DiT revision: the pinned port with the stored variant of its DiT attention."""
    tree = tmp_path_factory.mktemp("fused") / "tt-metal"
    shutil.copytree(PORT, tree)
    shutil.copyfile(FUSED, tree / PORT_DIT)
    return tree


def both_ways(code_root: Path, snapshot: Path, cache_dir: Path, device=None, **kwargs):
    code = port_n16.PortCode.find(code_root)
    ours = port_n16.build_model(cache_dir, code_root, device, check=False, **kwargs)
    theirs = port_n16.build_with_port(code, snapshot, independent_config(), device)
    return ours, theirs


def test_the_whole_model_two_ways_on_the_host(attn):
    import ttnn

    snapshot, cache_dir = attn
    shutil.rmtree(cache_dir / "port-models", ignore_errors=True)
    first, theirs = both_ways(PORT, snapshot, cache_dir)
    ours = port_n16.build_model(cache_dir, PORT, check=False)  # a later start: the model the first one kept
    assert (first.stats["model"], ours.stats["model"]) == ("traced and kept", "kept")
    assert port_n16.differences(first.model, theirs) == []
    model_class = port_n16.PortCode.find(PORT).attr("tt.ttnn_groot_n16_model:Gr00tN16ModelTTNN")
    assert type(ours.model) is model_class and ours.layout == "tt-n16" and ours.slots == (0, 1)
    counts: dict = {}
    assert port_n16.differences(ours.model, theirs, counts=counts) == []
    assert ours.stats["device_files"] == 100  # every weight the port uploads...
    assert counts["ttnn"] == 100 + 1  # ...compared by ttnn's bytes, and the causal mask the port computes
    assert counts["torch"] == 1 + 2 + 2  # embed_tokens, one layer's q_norm and k_norm; the RoPE cos and sin
    # what the port computes, not loads, is there and equal: the cross-attention test, the padded dims, the mask
    blocks = ours.model.dit.blocks
    assert [b.attn.is_cross_attention for b in blocks] == [True, False]
    assert isinstance(ours.model.qwen3._causal_mask_tt, ttnn.Tensor)
    assert type(ours.model.action_encoder.timestep_encoder.time_proj).__name__ == "Timesteps"


def test_the_whole_model_two_ways_on_the_simulated_device(attn, simulated_device):
    snapshot, cache_dir = attn
    shutil.rmtree(cache_dir / "port-models", ignore_errors=True)
    first, theirs = both_ways(PORT, snapshot, cache_dir, simulated_device)
    ours = port_n16.build_model(cache_dir, PORT, simulated_device, check=False)
    assert (first.stats["model"], ours.stats["model"]) == ("traced and kept", "kept")
    for built in (first, ours):
        counts: dict = {}
        assert port_n16.differences(built.model, theirs, counts=counts) == []
        assert counts["ttnn"] == counts["on_device"] == 101  # weights and the mask, read back from the device


def _kept_files(cache_dir: Path, revision: str) -> list[Path]:
    return sorted((cache_dir / "port-models").glob(f"*/{revision}-*.json"))


def test_a_changed_port_is_traced_again_and_kept_beside(attn, tmp_path):
    """The kept model is the port revision's: a port whose code changed after a start was kept is traced again."""
    snapshot, cache_dir = attn
    tree = tmp_path / "tt-metal"
    shutil.copytree(PORT, tree)
    before = port_n16.build_model(cache_dir, tree, check=False)
    old = port_n16.PortCode.find(tree).revision
    with open(tree / PORT_DIT, "a") as f:
        f.write("\n# a local edit\n")
    new = port_n16.PortCode.find(tree).revision
    after = port_n16.build_model(cache_dir, tree, check=False)
    assert old != new and before.stats["model"] in ("kept", "traced and kept")
    assert after.stats["model"] == "traced and kept" and len(_kept_files(cache_dir, new)) == 1
    theirs = port_n16.build_with_port(port_n16.PortCode.find(tree), snapshot, independent_config())
    assert port_n16.differences(after.model, theirs) == []


@pytest.mark.parametrize("damage", ["a byte of its tensors", "a byte of its graph", "a class to import, re-hashed"])
def test_a_damaged_kept_model_is_traced_again(attn, tmp_path, damage):
    """A kept model that does not check is never used: it is traced again (and kept again), and the model still
    equals the port's own. A kept file naming a class outside the port's package, even with its hash made to
    match, is refused the same way: nothing it names is imported."""
    import xxhash

    snapshot, cache_dir = attn
    copy = tmp_path / "cache"
    shutil.copytree(cache_dir, copy)
    shutil.rmtree(copy / "port-models", ignore_errors=True)
    port_n16.build_model(copy, PORT, check=False)
    (kept,) = _kept_files(copy, port_n16.PortCode.find(PORT).revision)
    if damage == "a byte of its tensors":
        data = bytearray(kept.with_suffix(".bin").read_bytes())
        data[len(data) // 2] ^= 0x01
        kept.with_suffix(".bin").write_bytes(bytes(data))
    elif damage == "a byte of its graph":
        data = bytearray(kept.read_bytes())
        data[-10] ^= 0x01
        kept.write_bytes(bytes(data))
    else:
        body = kept.read_bytes().partition(b"\n")[2]
        body = body.replace(b'"models.experimental.gr00t_n1_6.tt.ttnn_dit:DiTFFNTTNN"', b'"subprocess:Popen"')
        kept.write_bytes(xxhash.xxh3_64_hexdigest(body).encode() + b"\n" + body)
    ours = port_n16.build_model(copy, PORT, check=False)
    assert ours.stats["model"] == "traced and kept"
    theirs = port_n16.build_with_port(port_n16.PortCode.find(PORT), snapshot, independent_config())
    assert port_n16.differences(ours.model, theirs) == []
    assert port_n16.build_model(copy, PORT, check=False).stats["model"] == "kept"


def test_a_fine_tune_is_built_by_its_trainers_tag_map_never_as_anothers_slot(attn, tmp_path):
    """A tag names the slot its trainer's map gives it (the map the convert recorded in the entry), as `load` reads
    it: here the trainer swapped oxe_google and oxe_widowx. Read with the built-in table instead, oxe_google is slot
    0, which the fine-tune does not hold and the release beside it does: the port would be built from the release."""
    from pipeline.inputs.synth import fine_tune_form
    from pipeline.jobs.load import load

    snapshot, cache_dir = attn
    copy = tmp_path / "cache"
    shutil.copytree(cache_dir, copy)
    folder = fine_tune_form(snapshot, "n16", "checkpoint", tmp_path / "fine-tune")
    ids = json.loads((folder / "embodiment_id.json").read_text())
    (folder / "embodiment_id.json").write_text(json.dumps({**ids, "oxe_google": 1, "oxe_widowx": 0}))
    tuned = convert(ConvertOptions(None, embodiments="oxe_google", snapshot=folder, cache_root=copy, progress=False))
    assert tuned["slots"] == [1]
    built = port_n16.build_model(copy, PORT, embodiments="oxe_google", check=False, synthetic=True)
    loaded = load("n16", copy, "oxe_google", synthetic=True)
    assert built.entry == loaded.entry == Path(tuned["cache_path"]).name and built.slots == (1,) == (loaded.slot,)


def test_the_port_from_a_bucket_fetches_each_device_file_once_on_this_machine(attn, s3_url, tmp_path, monkeypatch):
    """A robot's start-up from its team's bucket: the first start fetches the entry's device files and host tables
    and keeps them, as a load does; the next start fetches none of them, and builds the same model."""
    from tasks.entries.object_stores import S3Store

    snapshot, _ = attn
    monkeypatch.setenv("GR00T_CACHE", str(tmp_path / "local"))
    bucket = f"{s3_url}-port"
    convert(ConvertOptions("n16", embodiments="all", snapshot=snapshot, cache_root=bucket, progress=False))
    fetched, get, read_into = [], S3Store.get, S3Store.read_into
    monkeypatch.setattr(S3Store, "get", lambda self, k: (fetched.append(k), get(self, k))[1])
    monkeypatch.setattr(S3Store, "read_into", lambda self, k, out: (fetched.append(k), read_into(self, k, out))[1])
    first = port_n16.build_model(bucket, PORT, check=False, synthetic=True)
    assert len([k for k in fetched if k.startswith("objects/")]) >= first.stats["device_files"] > 0
    fetched.clear()
    second = port_n16.build_model(bucket, PORT, check=False, synthetic=True)
    assert [k for k in fetched if k.startswith("objects/")] == []
    assert port_n16.differences(first.model, second.model) == []


def test_one_changed_byte_in_one_target_is_found(attn, tmp_path):
    """A wrong but self-consistent entry (the byte changed, its record updated): the entry verifies, the
    comparison with the port's own build must not."""
    snapshot, cache_dir = attn
    copy = tmp_path / "cache"
    shutil.copytree(cache_dir, copy)
    name = json.loads((copy / "refs" / "n16-tt-n16-port.synthetic.json").read_text())["entry"]
    manifest_path = copy / manifest_key(name)
    manifest = json.loads(manifest_path.read_text())
    target = "dit.transformer_blocks.0.attn1.to_k_padded.weight"
    packed = copy / "entries" / name / target / "c.0.0.0.0.0.0"  # its tiled chunk: the device file, first
    data = bytearray(packed.read_bytes())
    offset, nbytes = struct.unpack("<QQ", data[-16:])  # the bf16 tiles: after the device's, or the device's own
    header_end = 8 + struct.unpack("<Q", data[:8])[0]
    data[(offset if offset > header_end else offset + nbytes) - 7] ^= 0x01  # the device payload's last tile
    packed.write_bytes(bytes(data))
    record = manifest["arrays"][target]["chunks"]["all"]
    record["xxh3"], record["device"]["xxh3"] = checksum(bytes(data)), checksum(bytes(data[:record["device"]["nbytes"]]))
    manifest_path.write_text(json.dumps(manifest))
    ours, theirs = both_ways(PORT, snapshot, copy)
    found = port_n16.differences(ours.model, theirs)
    assert found == ["model.dit.blocks[0].attn.to_k_weight: the bytes differ"]


def test_a_damaged_device_file_is_refused_by_name(attn, tmp_path):
    """A byte changed behind the manifest's back (the record left as it was): the hand-off refuses the entry,
    naming the file, rather than building a model from it."""
    _, cache_dir = attn
    copy = tmp_path / "cache"
    shutil.copytree(cache_dir, copy)
    name = json.loads((copy / "refs" / "n16-tt-n16-port.synthetic.json").read_text())["entry"]
    packed = copy / "entries" / name / "vision.encoder.layers.0.mlp.fc1.weight" / "c.0.0.0.0.0.0"
    data = bytearray(packed.read_bytes())
    data[400] ^= 0x10  # in the payload ttnn reads (its header is 384 bytes)
    packed.write_bytes(bytes(data))
    with pytest.raises(CacheError, match=f"{re.escape(str(packed))}: device file [(]what ttnn loads[)] does not match its manifest"):
        port_n16.build_model(copy, PORT, check=False, synthetic=True)


def test_a_damaged_host_table_is_refused_by_name(attn, tmp_path):
    """The host tables are read while the port is traced, on other threads: a changed byte in one is still the
    hand-off's error, naming the table, and no model is built."""
    _, cache_dir = attn
    copy = tmp_path / "cache"
    shutil.copytree(cache_dir, copy)
    name = json.loads((copy / "refs" / "n16-tt-n16-port.synthetic.json").read_text())["entry"]
    table = "language.model.embed_tokens.weight"
    chunk = chunk_file(copy / "entries" / name, table, 2, None)
    data = bytearray(chunk.read_bytes())
    data[len(data) // 3] ^= 0x01
    chunk.write_bytes(bytes(data))
    with pytest.raises(CacheError, match=f"{table}: chunk all does not match its manifest checksum"):
        port_n16.build_model(copy, PORT, check=False, synthetic=True)


def test_the_fused_revision_is_detected_and_built_the_same(attn, fused_port):
    snapshot, cache_dir = attn
    ours, theirs = both_ways(fused_port, snapshot, cache_dir)
    assert ours.layout == "tt-n16-fused"
    assert port_n16.differences(ours.model, theirs) == []
    attn0, attn1 = ours.model.dit.blocks[0].attn, ours.model.dit.blocks[1].attn
    assert list(attn0.to_kv_weight.shape) == [2048, 4096] and list(attn1.to_qkv_weight.shape) == [1536, 6144]


def test_a_port_revision_the_entry_does_not_serve_is_one_sentence(attn, fused_port, tmp_path):
    snapshot, cache_dir = attn
    only_unfused = tmp_path / "cache"
    shutil.copytree(cache_dir, only_unfused)
    (only_unfused / "refs" / "n16-tt-n16-fused-port.synthetic.json").unlink()
    for entry in (only_unfused / "entries").iterdir():
        if "-tt-n16-fused-" in entry.name:
            shutil.rmtree(entry)
    with pytest.raises(CacheError, match="no converted n16 .tt-n16-fused, port."):
        port_n16.build_model(only_unfused, fused_port, check=False)
    # a revision no layout serves: its DiT heads padded to 96, not 64
    unknown = tmp_path / "unknown" / "tt-metal"
    shutil.copytree(PORT, unknown)
    dit = unknown / PORT_DIT
    dit.write_text(dit.read_text().replace("PADDED_HEAD_DIM = 64", "PADDED_HEAD_DIM = 96"))
    code = port_n16.PortCode.find(unknown)
    with pytest.raises(PipelineError) as err:
        port_n16.build_model(cache_dir, unknown, check=False)
    message = str(err.value)
    assert f"(port revision {code.revision}) builds a [1536, 3072] bfloat16 TILE tensor from " \
           "action_head.model.transformer_blocks.0.attn1.to_q.weight," in message
    assert "no supported layout revision (tt-n16, tt-n16-fused) has it; this port revision is not supported" in message
    assert "\n" not in message


def test_only_the_slots_asked_for_and_a_clear_error_for_the_others(attn):
    snapshot, cache_dir = attn
    ours, theirs = both_ways(PORT, snapshot, cache_dir, embodiments="1")
    assert ours.slots == (1,)
    encoder = ours.model.action_encoder
    assert sorted(encoder.w1) == [1] and sorted(ours.model.state_encoder.layer1_weights) == [1]
    with pytest.raises(KeyError, match="embodiment slot 0 was not loaded into this model"):
        encoder.w1[0]
    found = port_n16.differences(ours.model, theirs)
    assert found and all("keys [1] against [0, 1]" in d for d in found)  # the dicts of slots, and only they
    mine, port = encoder.w2[1][0], theirs.action_encoder.w2[1][0]
    assert port_n16.differences(mine, port) == []


def test_the_config_at_the_published_dims_is_the_ports_default():
    from pipeline.model.state_dict import tensor_specs

    code = port_n16.PortCode.find(PORT)
    shapes = {s.key: list(s.shape) for s in tensor_specs("n16", "full")}
    default = code.attr("common.configs:Gr00tN16Config").default()
    assert port_n16.differences(port_n16.port_config(code, shapes), default) == []
    assert vars(port_n16.port_config(code, shapes).backbone.language) == vars(default.backbone.language)


def test_a_config_field_is_data_a_dim_or_a_product_and_an_unknown_dim_is_named():
    from pipeline.port_n16.trace import _field_value

    dims = {"patch": 14, "vision_positions": 256, "dit_heads": 32, "dit_head_dim": 48}
    assert _field_value("backbone.vision.image_size", ["patch", {"isqrt": "vision_positions"}], dims) == 224
    assert _field_value("dit.num_attention_heads", "dit_heads", dims) == 32
    assert _field_value("embodiment.action_hidden_dim", ["dit_heads", "dit_head_dim"], dims) == 1536
    with pytest.raises(ConfigError, match=r"\[port.fields\] 'hidden_size': '__import__' is not a dim of N1.6"):
        _field_value("hidden_size", "__import__", dims)


def test_port_check_keeps_its_verdict(attn):
    """(Kept in the attn cache, so that the README's lines below find it there, as a user's second run would.)"""
    _, cache_dir = attn
    code = port_n16.PortCode.find(PORT)
    verdict = port_n16.check_port(code, build_root=cache_dir)
    assert verdict["ok"] and verdict["revision"] == code.revision and verdict["device_files"] == 100
    kept = list((cache_dir / "port-checks").glob(f"{code.revision}-tt-n16-*.json"))
    assert len(kept) == 1 and json.loads(kept[0].read_text()) == verdict
    kept[0].write_text(json.dumps({**verdict, "seconds": -1}))  # the kept verdict is what a second call returns
    assert port_n16.check_port(code, build_root=cache_dir)["seconds"] == -1
    # A start that finds the verdict imports none of what making one takes (dask and its kin: 0.3 s of a 0.65 s start).
    probe = ("import sys; from pathlib import Path; from pipeline import port_n16; "
             "port_n16.check_port(port_n16.PortCode.find(sys.argv[1]), build_root=Path(sys.argv[2])); "
             "print(sorted(m for m in ('dask', 'pipeline.jobs.convert', 'pipeline.inputs.synth') if m in sys.modules))")
    run = subprocess.run([sys.executable, "-c", probe, str(PORT), str(cache_dir)], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1], check=True)
    assert run.stdout.strip() == "[]"


def test_no_port_tree_is_one_sentence(tmp_path, monkeypatch):
    monkeypatch.delenv("TT_METAL_HOME", raising=False)
    with pytest.raises(PipelineError, match="no tt-metal tree given: pass tt_metal="):
        port_n16.PortCode.find(None)
    with pytest.raises(PipelineError, match=f"{tmp_path}: no GR00T N1.6 port there"):
        port_n16.PortCode.find(tmp_path)
    monkeypatch.setenv("TT_METAL_HOME", str(PORT))
    assert port_n16.PortCode.find(None).root == PORT.resolve()
    assert os.environ["TT_METAL_HOME"] == str(PORT)


@pytest.mark.parametrize("stale, hint", [
    ("import models.experimental.groot_n16.tt.ttnn_common", "it is a port of another layout or age"),
    ("import not_installed_anywhere_here", "install not_installed_anywhere_here in this Python"),
], ids=["old-package", "missing-package"])
def test_a_port_file_that_does_not_import_is_named_with_the_fitting_hint(tmp_path, monkeypatch, stale, hint):
    """An old tree still importing the port's former package, or a package this Python lacks: the sentence names
    the port's file whose import failed (not the model module that imported it) and says what to do."""
    tree = tmp_path / "tt-metal"
    shutil.copytree(PORT / "models", tree / "models", ignore=shutil.ignore_patterns("__pycache__"))
    broken = tree / "models/experimental/gr00t_n1_6/tt/ttnn_embodiment.py"
    broken.write_text(stale + "\n" + broken.read_text())
    monkeypatch.setattr(sys, "path", list(sys.path))
    try:
        with pytest.raises(PipelineError) as raised:
            port_n16.PortCode.find(tree).attr("tt.ttnn_groot_n16_model:Gr00tN16ModelTTNN")
    finally:  # the next test imports the pinned tree afresh
        for name in [n for n in sys.modules if n == "models" or n.startswith("models.")]:
            del sys.modules[name]
    message = str(raised.value)
    assert message.startswith(f"{tree.resolve()}: the port's models/experimental/gr00t_n1_6/tt/ttnn_embodiment.py "
                              "does not import (No module named"), message
    assert hint in message and len(message.splitlines()) == 1


def test_the_readme_port_lines_run_as_written(attn, tmp_path):
    """The README's "Run the N1.6 port from the cache" lines, run as written in a process of their own (on the
    simulated device where there is one, else with `device = None`), then held to the port's own build."""
    import re
    import subprocess
    import sys

    from devkit import simulator

    root = Path(__file__).resolve().parent.parent
    block = re.search(r"```python port\n(.*?)```", (root / "README.md").read_text(), re.S).group(1)
    snapshot, cache_dir = attn
    if simulator.unavailable_reason() is not None:
        block = block.replace("ttnn.open_device(device_id=0)", "None")
    check = f'''
import json
from pipeline.port_n16 import PortCode, build_with_port, differences
from tests.test_port_handoff import independent_config
theirs = build_with_port(PortCode.find({str(PORT)!r}), __import__("pathlib").Path({str(snapshot)!r}),
                         independent_config(), device)
print(json.dumps({{"class": type(model).__name__, "differences": differences(model, theirs),
                  "slots": list(built.slots), "layers": config.dit.num_layers}}))
'''
    env = {**os.environ, "GR00T_CACHE": str(cache_dir), "TT_METAL_HOME": str(PORT),
           "PYTHONPATH": f"{root}{os.pathsep}{PORT}"}
    proc = subprocess.run([sys.executable, "-c", block + check], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(next(line for line in reversed(proc.stdout.splitlines()) if line.startswith("{")))
    assert result == {"class": "Gr00tN16ModelTTNN", "differences": [], "slots": [0, 1], "layers": 2}


@pytest.fixture(scope="module")
def mixed(attn, tmp_path_factory):
    """An Isaac-GR00T-style mixed-precision fine-tune of the attn snapshot (action head and q_norm/k_norm F32,
    with detail below bf16's precision), and a cache holding its tt-n16 entry."""
    from pipeline.inputs.synth import fine_tune_form

    root = tmp_path_factory.mktemp("mixed")
    snapshot = fine_tune_form(attn[0], "n16", "mixed", root / "snapshot")
    convert(ConvertOptions(None, embodiments="all", snapshot=snapshot, cache_root=root / "cache", progress=False))
    return snapshot, root / "cache"


@pytest.mark.parametrize("where", ["host", "simulated device"])
def test_a_mixed_precision_fine_tune_two_ways(mixed, where, request):
    """The port's loader reads the F32/BF16 files itself and rounds with torch; ours comes from the entry. Equal
    attribute by attribute and bit for bit, the F32 host tables included."""
    import torch

    device = request.getfixturevalue("simulated_device") if where != "host" else None
    snapshot, cache_dir = mixed
    ours, theirs = both_ways(PORT, snapshot, cache_dir, device)
    counts: dict = {}
    assert port_n16.differences(ours.model, theirs, counts=counts) == []
    assert counts["ttnn"] == 101 and counts["torch"] == 5
    wide = [t for t in _torch_tensors(ours.model) if t.dtype == torch.float32 and t.numel() == 128]  # q/k_norm
    assert len(wide) == 2 and all((t.view(torch.int32) & 0xFFFF).any() for t in wide)  # F32 bits below bf16's kept


def _torch_tensors(node, seen=None):
    """Every torch tensor reachable from the port's model (its host tables)."""
    import torch

    seen = set() if seen is None else seen
    if id(node) in seen:
        return []
    seen.add(id(node))
    if isinstance(node, torch.Tensor):
        return [node]
    if isinstance(node, dict):
        return [t for v in node.values() for t in _torch_tensors(v, seen)]
    if isinstance(node, (list, tuple)):
        return [t for v in node for t in _torch_tensors(v, seen)]
    if hasattr(node, "__dict__") and type(node).__module__.startswith("models."):
        return [t for v in vars(node).values() for t in _torch_tensors(v, seen)]
    return []


def test_the_ports_model_of_a_fine_tune_comes_with_its_trainers_processor(attn, tmp_path):
    """An Isaac-GR00T `checkpoint-N/` of the attn snapshot, trained (by its own embodiment_id.json) as slot 1:
    `build_model` hands out the port's model and the trainer's processor for that slot, from the cache alone. (By
    slot id: build_model reads a tag with the built-in table, not the map the convert recorded, as load does.)"""
    import json

    import numpy as np

    from pipeline.inputs.synth import TRAINED_TAG, fine_tune_form
    from tests.isaac_oracle import Oracle
    from tests.test_processor import _observations

    folder = fine_tune_form(attn[0], "n16", "checkpoint", tmp_path / "run")
    (folder / "embodiment_id.json").write_text(json.dumps({TRAINED_TAG: 1}))  # the attn scale's banks have 2 slots
    docs = {n: json.loads((folder / n).read_text()) for n in ("processor_config.json", "statistics.json")}
    for layout in ("tt-n16", "tt-n16-fused"):  # whichever revision of the port this session has imported
        convert(ConvertOptions(None, embodiments="trained", snapshot=folder, cache_root=tmp_path / "cache",
                               layout=layout, progress=False))
    shutil.rmtree(tmp_path / "run")
    built = port_n16.build_model(tmp_path / "cache", PORT, check=False, synthetic=True, embodiments="1")
    processor = built.processor
    assert (processor.embodiment, processor.embodiment_id, built.slots) == (TRAINED_TAG, 1, (1,))
    observed = {g: v[0] for g, v in _observations(np.random.default_rng(2), batch=1).items()}
    np.testing.assert_allclose(processor.state(observed), Oracle(docs, TRAINED_TAG).state(observed), atol=1e-6)
