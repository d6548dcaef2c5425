"""Entries of cache format 6 (a chunk in rows, and a `.tensorbin` beside it for every device target) are still read,
and a fine-tune converts against a format 6 release: the values are those of format 7 entries of the same sources,
torch and ttnn alike. A format 6 entry is made here by this converter with the tiled file switched off, which is the
format 6 code path (every write of a chunk in rows and of a device file is the one format 6 made), recorded as 6."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import ttnn

import tasks.entries.manifest
from pipeline.inputs.synth import fine_tune_form
from pipeline.jobs.convert import ConvertOptions, convert
from pipeline.jobs.load import load
from tasks.device import one_file


def _bytes(tensor) -> bytes:
    return ttnn.to_torch(tensor).view(torch.int16).numpy().tobytes() if isinstance(tensor, ttnn.Tensor) else \
        tensor.contiguous().view(torch.uint8).numpy().tobytes()


def _same(a: dict, b: dict) -> None:
    assert set(a) == set(b)
    for name in a:
        assert type(a[name]) is type(b[name]), name
        if isinstance(a[name], ttnn.Tensor):
            assert (a[name].dtype, tuple(a[name].padded_shape)) == (b[name].dtype, tuple(b[name].padded_shape)), name
        assert _bytes(a[name]) == _bytes(b[name]), name


@pytest.fixture
def format6(monkeypatch):
    """Converts made inside write format 6 entries."""
    def switch(on: bool) -> None:
        if on:
            monkeypatch.setattr(one_file, "is_tiled", lambda target: False)
            monkeypatch.setattr(tasks.entries.manifest, "is_tiled", lambda target: False)
            monkeypatch.setattr(tasks.entries.manifest, "CACHE_FORMAT", 6)
        else:
            monkeypatch.undo()
    return switch


def test_a_format6_release_is_read_and_a_fine_tune_converts_against_it(hf_cache, tmp_path, format6, micro_snapshots):
    old, new = tmp_path / "old", tmp_path / "new"
    format6(True)
    release = convert(ConvertOptions("n16", hf_cache=hf_cache, synthetic="micro", cache_root=old, embodiments="gr1",
                                     progress=False))
    format6(False)
    manifest = json.loads((Path(release["cache_path"]) / "MANIFEST.json").read_text())
    assert manifest["cache_format"] == 6 and not any(a["attributes"].get("tiled") for a in manifest["arrays"].values())
    assert (Path(release["cache_path"]) / "tensorbin").is_dir()
    convert(ConvertOptions("n16", hf_cache=hf_cache, synthetic="micro", cache_root=new, embodiments="gr1",
                           progress=False))
    for into in ("torch", "ttnn"):
        _same(load("n16", old, "gr1", into=into, synthetic=True).tensors,
              load("n16", new, "gr1", into=into, synthetic=True).tensors)
    tuned = fine_tune_form(micro_snapshots["n16"], "n16", "mixed", tmp_path / "tuned")
    for root in (old, new):  # beside the format 6 release, and beside the format 7 one
        done = convert(ConvertOptions(None, snapshot=tuned, cache_root=root, embodiments="gr1", progress=False))
        assert json.loads((Path(done["cache_path"]) / "MANIFEST.json").read_text())["cache_format"] == 7
    for into in ("torch", "ttnn"):
        _same(load("n16", old, "gr1", into=into, source=tuned).tensors,
              load("n16", new, "gr1", into=into, source=tuned).tensors)
