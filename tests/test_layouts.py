"""Layouts: defaults per version, names a port user recognises, honest rule citations, grouped reloads, and the
README's Python examples run as written."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipeline.jobs.convert import ConvertOptions, convert
from pipeline.model.state_dict import tensor_specs
from pipeline.jobs.load import load
from pipeline.model.recipe import build_plan, recipes, resolve
from tasks.errors import ConfigError

from tests.conftest import ROOT


def test_every_version_defaults_to_a_tenstorrent_layout_and_generic_stays_available():
    assert resolve("n16") == ("tt-n16", "port")
    assert resolve("n15") == resolve("n17") == ("tt-port", "port")
    assert resolve("n15", "generic") == resolve("n17", "generic") == ("generic", "bf16")
    with pytest.raises(ConfigError, match="unknown layout 'tt-n16' for n17: expected one of tt-port, generic"):
        resolve("n17", "tt-n16")  # what the N1.6 port builds is N1.6's alone


def test_unknown_layout_and_a_profile_the_layout_lacks_are_one_sentence_errors():
    with pytest.raises(ConfigError) as err:
        resolve("n16", "tt-n99")
    assert str(err.value) == ("unknown layout 'tt-n99' for n16: expected one of tt-n16, tt-n16-fused, generic "
                              "(configs/n16.toml [layouts])")
    with pytest.raises(ConfigError) as err:
        resolve("n16", "generic", "port")
    assert str(err.value).startswith("unknown profile 'port' for layout generic: expected one of bf16, bfp8")


@pytest.mark.parametrize("version", ["n15", "n16", "n17"])
def test_every_default_target_cites_the_port_file_it_mirrors(version):
    plan = build_plan(version, {s.key: s.shape for s in tensor_specs(version)})
    assert plan.layout == ("tt-n16" if version == "n16" else "tt-port")
    port_files = ("tt/ttnn_siglip2.py", "tt/ttnn_qwen3.py", "tt/ttnn_dit.py", "tt/ttnn_dit_optimized.py",
                  "tt/ttnn_embodiment.py", "tt/ttnn_groot_n16_model.py", "tt/ttnn_common.py")
    for t in plan.targets:
        assert any(f in t.mirrors for f in port_files), t.name
        if version == "n16":  # nothing in N1.6 needs an extension: every rule is the port's own
            assert not t.mirrors.startswith("extended"), t.name
    if version != "n16":
        assert any(t.mirrors.startswith("extended from") for t in plan.targets)
    # the family rules: no fused LLM projections, DiT/vl_self_attention heads padded to 64, host tensors float32
    names = {t.name: t for t in plan.targets}
    assert not any("qkv" in n for n in names if n.startswith("language."))
    padded = [t for t in plan.targets if t.transform == "pad_heads_transpose"]
    assert padded and all(t.params[2] == 64 and t.device_dtype == "bfloat16" for t in padded)
    host = [t for t in plan.targets if t.host]
    assert {n.rsplit(".", 2)[-2] for n in (t.name for t in host)} == {"embed_tokens", "q_norm", "k_norm"}
    assert all(t.device_dtype == "float32" and not t.device_file for t in host)


def test_generic_recipes_claim_no_tt_metal_convention():
    text = (ROOT / "configs" / "recipes.toml").read_text()
    generic = text[:text.index("# tt-n16: tt-metal")]
    assert "tt-metal" not in generic.replace("tt-metal's GR00T N1.6 port", "")
    assert all("mirrors" not in r for rs in ("siglip", "qwen3", "dit") for r in recipes()["rules"][rs])


def test_n15_and_n17_convert_tenstorrent_ready_by_default_and_generic_on_request(hf_cache, tmp_path):
    for version in ("n15", "n17"):
        s = convert(ConvertOptions(version, embodiments="new_embodiment", hf_cache=hf_cache, synthetic="tiny",
                                   cache_root=tmp_path, progress=False))
        assert (s["layout"], s["profile"]) == ("tt-port", "port") and Path(s["cache_path"]).name.startswith(f"{version}-tt-port-port-")
        w = load(version, tmp_path, "new_embodiment")
        assert "vl_self_attention" in w.components()
        g = convert(ConvertOptions(version, layout="generic", embodiments="new_embodiment", hf_cache=hf_cache,
                                   synthetic="tiny", cache_root=tmp_path, progress=False))
        assert Path(g["cache_path"]).name.startswith(f"{version}-generic-bf16-")
        assert load(version, tmp_path, "new_embodiment", layout="generic").layout == "generic"


def test_reload_groups_tensors_as_the_port_weight_loader_does(hf_cache, tmp_path):
    convert(ConvertOptions("n16", embodiments="all", hf_cache=hf_cache, synthetic="tiny", cache_root=tmp_path, progress=False))
    one = load("n16", tmp_path, "gr1")
    groups = one.components()
    assert sorted(groups) == ["action_decoder", "action_encoder", "connector", "dit", "language", "position_embedding",
                              "state_encoder", "vision", "vlln"]
    assert groups["language"]["model.embed_tokens.weight"].dtype == torch.float32  # host-only, as the port keeps it
    assert groups["language"]["model.layers.0.self_attn.q_proj.weight"].dtype == torch.bfloat16
    every = load("n16", tmp_path).components()["action_encoder"]["W2.W"]
    assert sorted(every) == list(range(32)) and torch.equal(every[20], groups["action_encoder"]["W2.W"])


def test_readme_examples_run_in_order_as_written(tmp_path):
    """The "Try it" lines, then every Python block, on one fresh cache, as a new user runs them."""
    block = re.search(r"## Try it\n.*?```sh\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    lines = [line for line in block.splitlines() if line.strip()]
    assert len(lines) >= 8
    env = {**__import__("os").environ, "GR00T_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    for line in lines:
        cmd = line.replace("python -m pipeline", f"{sys.executable} -m pipeline", 1)
        cmd = cmd.replace("build/", f"{tmp_path}/build/")  # the one output file: not into the checkout
        proc = subprocess.run(cmd, shell=True, cwd=ROOT, capture_output=True, text=True, env=env)
        assert proc.returncode == 0, (line, proc.stderr[-1500:])
    assert (tmp_path / "cache" / "hf").is_dir()  # synth wrote under the cache root, not the user's HF cache
    assert json.loads((tmp_path / "build" / "graph-n16.json").read_text())["tasks"]
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert len(blocks) >= 1  # (the port hand-off's block, fenced `python port`, runs in tests/test_port_handoff.py)
    strict = ("import warnings\n"  # the README shows the stable API only: a deprecated name fails here
              "warnings.filterwarnings('error', message='.*is deprecated and goes in', category=DeprecationWarning)\n")
    for block in blocks:
        proc = subprocess.run([sys.executable, "-c", strict + block], cwd=ROOT, capture_output=True, text=True,
                              env=env)
        assert proc.returncode == 0, proc.stderr[-2000:]
