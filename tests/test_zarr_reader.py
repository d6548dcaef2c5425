"""zarr-python, a reader that knows nothing of this project, gets every target of an entry from the few lines
cache/README.md shows (its "Tiled chunks" block, run as written): the values `load(into="torch")` gives, bf16 bits or
a host table's float32, for a tiled entry (format 7) of every kind of target."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from pipeline.jobs.convert import ConvertOptions, convert
from pipeline.jobs.load import load
from tests.zarr_values import read_entry


def test_the_readmes_zarr_lines_read_every_target_as_load_does(hf_cache, cache_root):
    summary = convert(ConvertOptions("n16", hf_cache=hf_cache, synthetic="micro", cache_root=cache_root,
                                     embodiments="gr1", progress=False))
    tensors = read_entry(Path(summary["cache_path"]))
    loaded = load("n16", cache_root, embodiment="gr1", synthetic=True).tensors
    assert set(tensors) == set(loaded) and len(tensors) > 90  # micro: every kind of target, a tenth of tiny's
    kinds = set()
    for name, stored in tensors.items():
        ours = loaded[name]
        bits = ours.numpy() if ours.dtype == torch.float32 else ours.view(torch.int16).numpy().view(np.uint16)
        if stored.ndim == bits.ndim + 1:  # a bank: the slot the entry holds (gr1 is slot 20)
            stored = stored[20]
        assert stored.dtype == bits.dtype and np.array_equal(stored, bits), name
        kinds.add((stored.dtype.name, stored.ndim))
    assert {("uint16", 2), ("float32", 1), ("float32", 2)} <= kinds
