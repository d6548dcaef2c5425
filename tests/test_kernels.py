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


def test_the_portable_packer_gives_ttnns_own_bytes(tmp_path):
    """kernels.c packs bfloat8_b with AVX-512 where the CPU has it, else in portable C. The portable build, made
    here without -march=native, must give the payload ttnn's own `dump_tensor` writes, whatever this CPU is (the
    build the project uses is held to ttnn in tests/test_tensorbin.py)."""
    import ctypes
    import shutil
    import subprocess

    import torch
    import ttnn

    from tasks import tensorbin

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    portable = tmp_path / "portable.so"
    subprocess.run([cc, "-O3", "-shared", "-fPIC", "-o", str(portable), str(kernels.SOURCE), "-lm"], check=True)
    lib = ctypes.CDLL(str(portable))
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((70, 97)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    x[5, 3], x[40, 60] = 0x7F80, 0x7FC0  # rows with Inf and NaN take the plain rule (ttnn writes every NaN 0x7FC0)
    x[10, :16] = 0x3F81                  # exact ties
    payload = np.zeros(tensorbin.payload_size((70, 97), "bfloat8_b"), np.uint8)
    sums, worst = np.zeros(5), np.zeros(1, np.float32)
    lib.pack_bfp8(ctypes.c_void_p(x.ctypes.data), ctypes.c_int64(70), ctypes.c_int64(97), ctypes.c_int64(97),
                  ctypes.c_void_p(payload.ctypes.data), ctypes.c_void_p(sums.ctypes.data),
                  ctypes.c_void_p(worst.ctypes.data))
    theirs = ttnn.from_torch(torch.from_numpy(x.view(np.int16)).view(torch.bfloat16), dtype=ttnn.bfloat8_b,
                             layout=ttnn.TILE_LAYOUT)
    ttnn.dump_tensor(str(tmp_path / "theirs.tensorbin"), theirs)
    dumped = (tmp_path / "theirs.tensorbin").read_bytes()
    assert len(dumped) > payload.nbytes and dumped[-payload.nbytes:] == payload.tobytes()


def test_a_source_that_does_not_compile_is_said_not_silently_replaced(tmp_path, monkeypatch, capsys):
    import shutil

    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler")
    broken = tmp_path / "kernels.c"
    broken.write_text(kernels.SOURCE.read_text() + "\nint this_is_not_c(;\n")
    monkeypatch.setattr(kernels, "SOURCE", broken)
    monkeypatch.setattr(kernels, "homes", lambda: [tmp_path / "home"])
    assert kernels.build() is None
    err = capsys.readouterr().err
    assert err.startswith(f"warning: {broken} does not compile with ") and "error" in err and err.count("\n") == 1
    assert not list((tmp_path / "home").glob("_kernels-*.so"))
