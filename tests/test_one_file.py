"""Cache format 7's tiled chunk (tasks/device/one_file.py): one file that ttnn loads as the target's `.tensorbin` and
zarr-python reads as its Zarr chunk. Held to ttnn itself (its own `dump_tensor` of the tensor, and what it loads
back) and to zarr-python through the lines cache/README.md gives a reader (tests/zarr_values.py)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
import ttnn
import zarr

from tasks.device import one_file
from tasks.numerics.precision import widen_bf16
from tests.zarr_values import values

RNG = np.random.default_rng(71)
SHAPES = [(64, 96), (1, 96), (33, 64), (2, 40, 70)]  # whole tiles; a row (biases); padding; a leading axis


def _bf16(shape) -> np.ndarray:
    return (RNG.standard_normal(shape).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def _dumped(bits: np.ndarray, dtype: str) -> bytes:
    """ttnn's own `.tensorbin` of the host tensor it builds from these bf16 values."""
    host = ttnn.Tensor(tensor=widen_bf16(bits), data_type=getattr(ttnn, dtype), layout=ttnn.TILE_LAYOUT)
    with tempfile.TemporaryDirectory() as tmp:
        ttnn.dump_tensor(str(Path(tmp) / "t.tensorbin"), host)
        return (Path(tmp) / "t.tensorbin").read_bytes()


def _as_zarr_array(folder: Path, file: np.ndarray, shape: tuple[int, ...], bank: int = 0, slot: int = 0) -> Path:
    """The file as the chunk of a one-array Zarr store (a bank: the chunk of `slot`), with the document an entry
    writes for it (tasks/entries/manifest.py `array_documents`)."""
    from tasks.entries.zarr_v3 import array_metadata

    stored = one_file.zarr_shape(shape)
    attrs = {"dtype": "bfloat16", "logical_shape": list(shape), "tiled": True, "embodiment_bank": bool(bank)}
    full, chunk = ([bank, *stored], [1, *stored]) if bank else (stored, stored)
    folder.mkdir(parents=True)
    (folder / "zarr.json").write_text(json.dumps(array_metadata(full, chunk, attrs, one_file.zarr_codecs(chunk))))
    coords = [slot] * bool(bank) + [0] * len(stored)
    file.tofile(folder / ("c." + ".".join(map(str, coords))))
    return folder


@pytest.mark.parametrize("dtype", ["bfloat16", "bfloat8_b"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_one_file_is_ttnns_tensorbin_and_zarrs_chunk(shape, dtype, tmp_path):
    bits = _bf16(shape)
    file, _ = one_file.tiled_file(bits, dtype)
    dumped = _dumped(bits, dtype)
    assert file[:len(dumped)].tobytes() == dumped  # ttnn's own file, first
    array = zarr.open_array(str(_as_zarr_array(tmp_path / "w", file, shape)), mode="r")
    assert np.array_equal(values(array), bits)  # zarr-python: the lossless bf16, bfloat8_b or not
    assert np.array_equal(one_file.logical(file, shape), bits)  # ours (the untilize kernel)
    chunk = next((tmp_path / "w").glob("c.*"))
    loaded = one_file.device_tensor(str(chunk))  # where it lies: no `.tensorbin` name, bytes after the payload
    assert (loaded.dtype, tuple(loaded.shape)) == (getattr(ttnn, dtype), shape)
    with tempfile.TemporaryDirectory() as tmp:
        ttnn.dump_tensor(str(Path(tmp) / "back.tensorbin"), loaded)
        assert (Path(tmp) / "back.tensorbin").read_bytes() == dumped


def test_a_bank_slot_is_its_own_file_and_zarr_reads_the_slot(tmp_path):
    shape = (40, 70)
    bits = _bf16(shape)
    file, _ = one_file.tiled_file(bits, "bfloat16")
    array = zarr.open_array(str(_as_zarr_array(tmp_path / "bank", file, shape, bank=32, slot=20)), mode="r")
    stored = values(array)
    assert stored.shape == (32, *shape) and np.array_equal(stored[20], bits) and not stored[19].any()


def test_where_ttnn_does_not_read_a_file_in_place_it_gets_a_scratch_copy(tmp_path, monkeypatch):
    bits = _bf16((33, 64))
    for dtype in ("bfloat16", "bfloat8_b"):
        file, _ = one_file.tiled_file(bits, dtype)
        chunk = tmp_path / f"c.{dtype}"
        file.tofile(chunk)
        monkeypatch.setattr(one_file, "ttnn_reads_in_place", lambda: False)
        monkeypatch.setattr(one_file, "_load_in_place", lambda *a: pytest.fail("loaded in place"))
        loaded = one_file.device_tensor(str(chunk))
        reference = ttnn.Tensor(tensor=widen_bf16(bits), data_type=getattr(ttnn, dtype), layout=ttnn.TILE_LAYOUT)
        assert torch.equal(ttnn.to_torch(loaded), ttnn.to_torch(reference))
        monkeypatch.undo()


def test_this_ttnn_reads_a_tiled_chunk_in_place():
    """What the suite's ttnn does (so that the in-place path above is the one exercised); a ttnn that did not would
    turn this red, and the readers would still work through the scratch copy."""
    assert one_file.ttnn_reads_in_place() is True


@pytest.mark.parametrize("damage", ["an index past the end", "a file shorter than an index"])
def test_an_index_that_does_not_fit_its_file_is_refused(damage):
    file, _ = one_file.tiled_file(_bf16((32, 32)), "bfloat16")
    if damage == "an index past the end":
        file[-16:] = np.frombuffer(one_file.INDEX.pack(384, 1 << 40), np.uint8)
    else:
        file = file[:12]
    with pytest.raises(ValueError, match="tiled chunk"):
        one_file.logical(file, (32, 32))
