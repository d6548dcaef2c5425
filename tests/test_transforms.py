"""The transforms contract (tasks/numerics/transforms.py), without a convert: every transform the recipes may name gives the
tensor an independent torch reference gives, of the shape `output_shape` promises before any data is touched, on
bf16 bit patterns, with and without the C kernels."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tasks.numerics import kernels, transforms

HEADS, HEAD_DIM, PADDED = 3, 5, 8  # small, and neither tile- nor power-of-two-aligned


def _bits(*shape: int, seed: int = 0) -> np.ndarray:
    """Random bf16 bit patterns (no NaN: only bytes are compared, but a reader should see numbers)."""
    rng = np.random.default_rng(seed + sum(shape))
    return (rng.standard_normal(shape).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def _t(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(x.astype(np.int32))


def _pad_rows(w: torch.Tensor) -> torch.Tensor:  # each head's output rows, then zeros
    return F.pad(w.reshape(HEADS, HEAD_DIM, -1), (0, 0, 0, PADDED - HEAD_DIM)).reshape(HEADS * PADDED, -1)


def _pad_cols(w: torch.Tensor) -> torch.Tensor:  # each head's input columns, then zeros
    return F.pad(w.reshape(w.shape[0], HEADS, HEAD_DIM), (0, PADDED - HEAD_DIM)).reshape(w.shape[0], -1)


INNER = HEADS * HEAD_DIM
BANKED = {"slot", "slot_row"}  # shapes are the bank's; the transform is handed one slot of it
CASES = {  # name -> (source shapes, params, the reference on torch int tensors)
    "identity": ([(7, 9)], (), lambda x: x),
    "row": ([(9,)], (), lambda x: x[None, :]),
    "transpose": ([(7, 9)], (), lambda x: x.T),
    "flatten_transpose": ([(6, 3, 2, 4, 4)], (), lambda x: x.reshape(6, -1).T),   # Conv3d [out, c, t, h, w]
    "fuse_transpose": ([(4, 9), (2, 9), (2, 9)], (), lambda *xs: torch.cat(xs).T),
    "fuse_row": ([(4,), (2,), (2,)], (), lambda *xs: torch.cat(xs)[None, :]),
    "slot": ([(32, 5, 7)], (), lambda x: x),      # one slot W[e] of a [32, in, out] bank: already [in, out]
    "slot_row": ([(32, 7)], (), lambda x: x[None, :]),
    "unsqueeze": ([(6, 9)], (), lambda x: x[None]),
    "fuse_pad_heads_transpose": ([(INNER, 9)] * 3, (HEADS, HEAD_DIM, PADDED),
                                 lambda *xs: torch.cat([_pad_rows(x) for x in xs]).T),
    "pad_heads_transpose": ([(INNER, 9)], (HEADS, HEAD_DIM, PADDED), lambda x: _pad_rows(x).T),
    "fuse_pad_heads_row": ([(INNER,)] * 2, (HEADS, HEAD_DIM, PADDED),
                           lambda *xs: torch.cat([_pad_rows(x[:, None])[:, 0] for x in xs])[None, :]),
    "pad_heads_row": ([(INNER,)], (HEADS, HEAD_DIM, PADDED), lambda x: _pad_rows(x[:, None])[:, 0][None, :]),
    "pad_heads_in_transpose": ([(9, INNER)], (HEADS, HEAD_DIM, PADDED), lambda x: _pad_cols(x).T),
}


def test_every_transform_has_a_case_and_every_case_a_transform():
    assert sorted(CASES) == sorted(transforms.TRANSFORMS)


@pytest.mark.parametrize("use_c", [True, False], ids=["C kernels", "numpy"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_transform_gives_the_reference_tensor_of_the_promised_shape(name, use_c, monkeypatch):
    if use_c and not kernels.available():
        pytest.skip("no C compiler: the numpy path is the one in use")
    monkeypatch.setattr(kernels, "available", lambda: use_c)
    shapes, params, reference = CASES[name]
    sources = [_bits(*(s[1:] if name in BANKED else s), seed=i) for i, s in enumerate(shapes)]
    out = transforms.apply(name, sources, params)
    expected = reference(*(_t(s) for s in sources))
    assert out.dtype == np.uint16 and out.shape == transforms.output_shape(name, shapes, params) == tuple(expected.shape)
    assert np.array_equal(out.astype(np.int32), expected.numpy())


@pytest.mark.parametrize("name", sorted(n for n in CASES if n in transforms.PADDING))
def test_padding_adds_only_zeros_and_keeps_every_source_value_once(name):
    shapes, params, _ = CASES[name]
    sources = [_bits(*s, seed=i) + 1 for i, s in enumerate(shapes)]  # + 1: no source value is a zero pattern
    out = transforms.apply(name, sources, params)
    assert np.count_nonzero(out) == sum(s.size for s in sources)
    assert sorted(out[out != 0].tolist()) == sorted(np.concatenate([s.ravel() for s in sources]).tolist())


@pytest.mark.parametrize("name,split", [("pad_heads_transpose", 0), ("fuse_pad_heads_row", 0),
                                        ("pad_heads_in_transpose", 1), ("transpose", None)])
def test_padded_dim_is_the_dim_split_into_heads(name, split):
    shapes = [(INNER, 9)] if name != "pad_heads_in_transpose" else [(9, INNER)]
    if name == "fuse_pad_heads_row":
        shapes = [(INNER,)]
    assert transforms.padded_dim(name, shapes) == (None if split is None else shapes[0][split])


def test_outputs_are_new_arrays_never_views_of_the_source():
    """Stage writes the result while other tasks may still hold the source (a shard's mapped bytes)."""
    for name, (shapes, params, _) in CASES.items():
        sources = [_bits(*s) for s in shapes]
        out = transforms.apply(name, sources, params)
        if name in ("identity", "slot", "row", "slot_row", "unsqueeze"):
            continue  # a reshape of the source by design: nothing is rearranged
        assert not any(np.shares_memory(out, s) for s in sources), name
