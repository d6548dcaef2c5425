"""The stable API (issue 64): `from pipeline import convert, load, build_model`, the option and result types, the
errors and `__version__`; and what 0.1.0's scripts wrote, working for one more minor version with a warning that
names the new import."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import warnings

import pytest
import torch

from tests.conftest import ROOT

STABLE = {"convert", "ConvertOptions", "ConvertSummary", "load", "Loaded", "build_model", "PipelineError",
          "ConfigError", "CheckpointError", "RecipeError", "CacheError", "NetworkError", "ProcessorError", "__version__"}


def test_the_package_exports_the_stable_names_and_its_version():
    import importlib.metadata

    import pipeline

    assert set(pipeline.__all__) == STABLE and all(getattr(pipeline, name) is not None for name in STABLE)
    assert all(issubclass(getattr(pipeline, e), pipeline.PipelineError) for e in STABLE if e.endswith("Error"))
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert pipeline.__version__ == importlib.metadata.version("gr00t-tt-weights") == declared != "0.1.0"
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert f"## [{declared}]" in changelog and "## [0.1.0]" in changelog


def test_an_installed_package_converts_and_loads_through_the_stable_import_alone(tmp_path, hf_cache, snapshots):
    """The wheel installed into a folder of its own, used from another directory by a script whose only import of
    the project is `from pipeline import convert, load`: the tensors it loads are the checkpoint's own, read here
    with safetensors."""
    from safetensors import safe_open

    src = tmp_path / "src"
    for part in ("pipeline", "tasks", "configs"):
        shutil.copytree(ROOT / part, src / part, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    for part in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / part, src / part)
    site = tmp_path / "site"
    built = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                            "--target", str(site), str(src)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-2000:]
    script = tmp_path / "elsewhere" / "use.py"
    script.parent.mkdir()
    script.write_text(f"""
import hashlib, json
import pipeline
from pipeline import convert, load
done = convert("n17", synthetic="tiny", hf_cache={str(hf_cache)!r}, cache_root={str(tmp_path / "cache")!r},
               embodiments="new_embodiment", layout="generic", progress=False)
got = load("n17", {str(tmp_path / "cache")!r}, "new_embodiment", layout="generic", synthetic=True)
vectors = {{k: t.float().flatten()[:64].tolist() for k, t in got.tensors.items() if t.numel() == t.shape[-1]}}
print(json.dumps({{"file": pipeline.__file__, "version": pipeline.__version__, "cache_hit": done["cache_hit"],
                  "tensors": vectors}}))
""")
    env = {**os.environ, "PYTHONPATH": str(site)}
    ran = subprocess.run([sys.executable, str(script)], cwd=script.parent, capture_output=True, text=True, env=env,
                         timeout=600)
    assert ran.returncode == 0, ran.stderr[-3000:]
    out = json.loads(ran.stdout.strip().splitlines()[-1])
    assert out["file"].startswith(str(site)) and not out["cache_hit"]
    assert out["version"] == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    # a generic entry's vectors (norms, biases; [n] or [1, n]) hold the checkpoint's values (matrices: transposed)
    snapshot = snapshots["n17"]
    found = {}
    for shard in snapshot.glob("*.safetensors"):
        with safe_open(shard, "pt") as f:
            for key in f.keys():
                name = next((n for n in out["tensors"] if key.endswith(n)), None)
                if name is not None and len(f.get_slice(key).get_shape()) == 1:
                    found[name] = f.get_tensor(key).float().flatten()[:64].tolist()
    assert len(found) > 50
    assert all(out["tensors"][name] == values for name, values in found.items())


def test_the_import_paths_and_keywords_of_0_1_0_still_work_with_a_warning(two_entries):
    """`from pipeline.load import load` and `from pipeline.convert import convert, ConvertOptions` (moved in
    15fe64c), and `load(..., ttnn_host=True)` / `device=` (replaced by `into=` in 26fe542): each works and warns,
    naming the new import. Importing an old path leaves `pipeline.load` the function."""
    import pipeline

    root, old, current = two_entries
    with pytest.warns(DeprecationWarning, match=r"pipeline\.load\.load is deprecated .*use from pipeline import load"):
        from pipeline.load import load as old_load
    with pytest.warns(DeprecationWarning, match="use from pipeline import ConvertOptions"):
        from pipeline.convert import ConvertOptions  # noqa: F401
    assert old_load is pipeline.load and callable(pipeline.load) and pipeline.load.__name__ == "load"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new names warn of nothing
        from pipeline import load

        new = load("n17", root, "new_embodiment", into="ttnn", synthetic=True)
    with pytest.warns(DeprecationWarning, match=r'use load\(into="ttnn"\)'):
        was = old_load("n17", root, "new_embodiment", ttnn_host=True, synthetic=True)
    import ttnn

    assert was.tensors.keys() == new.tensors.keys()
    for name, t in new.tensors.items():
        a = t if isinstance(t, torch.Tensor) else ttnn.to_torch(t)
        b = was.tensors[name] if isinstance(was.tensors[name], torch.Tensor) else ttnn.to_torch(was.tensors[name])
        assert torch.equal(a.float(), b.float()), name
    with pytest.raises(TypeError, match="unexpected keyword argument 'devce'"):
        load("n17", root, "new_embodiment", devce=None)


def test_convert_takes_keywords_as_well_as_options(hf_cache, tmp_path):
    from pipeline import ConvertOptions, convert

    by_keywords = convert("n15", synthetic="tiny", hf_cache=hf_cache, cache_root=tmp_path, embodiments="gr1",
                          layout="generic", progress=False)
    by_options = convert(ConvertOptions("n15", synthetic="tiny", hf_cache=hf_cache, cache_root=tmp_path,
                                        embodiments="gr1", layout="generic", progress=False))
    assert by_options["cache_hit"] and by_options["fingerprint"] == by_keywords["fingerprint"]
    with pytest.raises(TypeError, match="takes no keywords as well"):
        convert(ConvertOptions("n15"), synthetic="tiny")


def test_the_old_spellings_of_0_1_0_warn_at_the_users_line(tmp_path):
    """A script written against 0.1.0, run as a user runs it: each old import gives what `from pipeline import`
    does, and Python's default filters show one DeprecationWarning for each, said of the script's own line and
    naming the new import."""
    lines = ["import pipeline",
             "from pipeline.load import load; print('load', load is pipeline.load)",
             "from pipeline.convert import convert; print('convert', convert is pipeline.convert)",
             "from pipeline.convert import ConvertOptions; print('ConvertOptions', ConvertOptions is pipeline.ConvertOptions)",
             "import pipeline.load; print('still the function', callable(pipeline.load))"]
    script = tmp_path / "written_for_0_1_0.py"
    script.write_text("\n".join(lines) + "\n")
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["load", "True", "convert", "True", "ConvertOptions", "True", "still", "the",
                                   "function", "True"]
    said = [line for line in proc.stderr.splitlines() if "DeprecationWarning" in line]
    assert [line.split(": DeprecationWarning: ")[0] for line in said] == [f"{script}:{n}" for n in (2, 3, 4)], said
    assert all("goes in 0.3.0: use from pipeline import " in line for line in said), said
    # and from `python -c`, whose __main__ has no source file to quote
    one_liner = subprocess.run([sys.executable, "-c", "from pipeline.load import load"],
                               cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert one_liner.returncode == 0, one_liner.stderr[-2000:]
    assert one_liner.stderr.count("<string>:1: DeprecationWarning: ") == 1, one_liner.stderr


OLD_MODULES_0_2_0 = {  # 0.2.0's module -> where it lives now, written out here (not read from tasks/old_paths.py)
    "tasks.bulk_write": "tasks.io.bulk_write", "tasks.file_blocks": "tasks.io.file_blocks",
    "tasks.network": "tasks.io.network", "tasks.kernels": "tasks.numerics.kernels",
    "tasks.precision": "tasks.numerics.precision", "tasks.transforms": "tasks.numerics.transforms",
    "tasks.safetensors_file": "tasks.source.safetensors_file", "tasks.checkpoint": "tasks.source.checkpoint",
    "tasks.tensorbin": "tasks.device.tensorbin", "tasks.convert": "tasks.device.host_tensors",
    "pipeline.jobs.build": "pipeline.jobs.build_entry",
}
OLD_NAMES_0_2_0 = [  # (0.2.0's module, a name it had, where the name lives now, and as what)
    ("tasks.source", "read_weight", "tasks.source.shards", "read_weight"),
    ("tasks.source", "HostTable", "tasks.plan", "HostTable"),
    ("tasks.device", "upload_staged", "tasks.device.ttnn_edge", "upload_staged"),
    ("tasks.entries.store", "S3Store", "tasks.entries.object_stores", "S3Store"),
    ("tasks.entries.store", "open_store", "tasks.entries.cache_root", "open_store"),
    ("tasks.entries.names", "GRACE_HOURS", "tasks.entries.objects", "GRACE_HOURS"),
    ("pipeline.inputs.folder", "HUB_FILES", "pipeline.inputs.trainer_files", "HUB_FILES"),
    ("pipeline.inputs.folder", "Read", "pipeline.inputs.trainer_files", "Fact"),
]


def test_the_import_paths_of_0_2_0_still_work_and_warn_at_the_users_line(tmp_path):
    """A script written against 0.2.0 (`import tasks.convert`, `from tasks.source import read_weight`, ...), run as
    a user runs it: each old path gives what the new one does, and Python's default filters show one
    DeprecationWarning for each, said of the script's own line and naming the new import."""
    lines = [f"import {old} as m{i}; print({old!r}, m{i}.__name__)" for i, old in enumerate(OLD_MODULES_0_2_0)]
    lines += [f"from {old} import {name} as n{i}; from {home} import {new} as h{i}; print({old!r}, n{i} is h{i})"
              for i, (old, name, home, new) in enumerate(OLD_NAMES_0_2_0)]
    script = tmp_path / "written_for_0_2_0.py"
    script.write_text("\n".join(lines) + "\n")
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = [line.split() for line in proc.stdout.splitlines()]
    assert out[:len(OLD_MODULES_0_2_0)] == [[old, new] for old, new in OLD_MODULES_0_2_0.items()]
    assert out[len(OLD_MODULES_0_2_0):] == [[old, "True"] for old, *_ in OLD_NAMES_0_2_0]
    said = [line for line in proc.stderr.splitlines() if "DeprecationWarning" in line]
    assert len(said) == len(lines), proc.stderr
    for n, line in enumerate(said, start=1):
        assert line.startswith(f"{script}:{n}: DeprecationWarning: ") and "goes in 0.3.0: use " in line, line
    # and from `python -c`, whose __main__ has no source file to quote (warn_explicit once raised ImportError there)
    one_liner = subprocess.run([sys.executable, "-c", "from tasks import kernels, device; print(device.TILE)"],
                               cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert one_liner.returncode == 0 and one_liner.stdout.strip() == "32", one_liner.stderr[-2000:]
    assert one_liner.stderr.count("<string>:1: DeprecationWarning: ") == 2, one_liner.stderr
