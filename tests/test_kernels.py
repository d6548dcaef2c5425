"""The C transpose (tasks/kernels.c) against numpy's `.T`, on the shapes that reach its edges: fewer than 8 rows
or columns, sizes that are not multiples of 8 or of its 256-row blocks, strided views in and out (head padding
writes into column slices), and one full-size N1.6 projection."""

from __future__ import annotations

import numpy as np
import pytest

from tasks import kernels

SHAPES = [(1, 1), (3, 5), (8, 8), (9, 17), (7, 300), (300, 7), (256, 8), (257, 9), (513, 24), (1000, 33), (2048, 6144)]


@pytest.fixture(autouse=True)
def _built():
    if not kernels.available():
        pytest.skip("no C compiler: the kernel was not built (the numpy blocks are used)")


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_transpose_matches_numpy(shape):
    x = np.random.default_rng(shape[0] * 7 + shape[1]).integers(0, 1 << 16, shape, dtype=np.uint16)
    out = np.empty(shape[::-1], np.uint16)
    kernels.transpose_into(out, x)
    assert np.array_equal(out, x.T)


@pytest.mark.parametrize("shape", [(9, 17), (520, 40)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_transpose_between_strided_views_touches_only_its_window(shape):
    rng = np.random.default_rng(1)
    source = rng.integers(0, 1 << 16, (shape[0], shape[1] + 11), dtype=np.uint16)[:, 3:3 + shape[1]]
    canvas = np.zeros((shape[1], shape[0] + 20), np.uint16)
    window = canvas[:, 5:5 + shape[0]]
    kernels.transpose_into(window, source)
    assert np.array_equal(window, source.T)
    assert not canvas[:, :5].any() and not canvas[:, 5 + shape[0]:].any()
