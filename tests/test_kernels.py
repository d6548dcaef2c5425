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


def test_the_portable_packer_gives_the_bytes_of_the_vectorized_one(tmp_path):
    """kernels.c packs bfloat8_b with AVX-512 where the CPU has it, else in portable C: a machine without it must
    get the same bytes and numerics (the ttnn comparisons in tests/test_tensorbin.py run whichever this CPU builds)."""
    import ctypes
    import shutil
    import subprocess

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    portable = tmp_path / "portable.so"
    subprocess.run([cc, "-O3", "-shared", "-fPIC", "-o", str(portable), str(kernels.SOURCE), "-lm"], check=True)
    lib = ctypes.CDLL(str(portable))
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((70, 97)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    x[5, 3], x[40, 60] = 0x7F80, 0xFFC0  # rows with Inf and NaN take the plain rule
    x[10, :16] = 0x3F81                  # exact ties
    size = 3 * 4 * 1088
    fast, slow = np.zeros(size, np.uint8), np.zeros(size, np.uint8)
    sums = [np.zeros(5), np.zeros(5)]
    worst = [np.zeros(1, np.float32), np.zeros(1, np.float32)]
    kernels.pack_bfp8(x, fast, sums[0], worst[0])
    lib.pack_bfp8(ctypes.c_void_p(x.ctypes.data), ctypes.c_int64(70), ctypes.c_int64(97), ctypes.c_int64(97),
                  ctypes.c_void_p(slow.ctypes.data), ctypes.c_void_p(sums[1].ctypes.data),
                  ctypes.c_void_p(worst[1].ctypes.data))
    assert np.array_equal(fast, slow)
    np.testing.assert_allclose(sums[0], sums[1], rtol=1e-6)
    assert worst[0][0] == worst[1][0]
