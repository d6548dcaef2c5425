"""The C transpose (tasks/numerics/kernels.c) against numpy's `.T`, on the shapes that reach its edges: fewer than 8 rows
or columns, sizes that are not multiples of 8 or of its 256-row blocks, strided views in and out (head padding
writes into column slices), and one full-size N1.6 projection."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.numerics import kernels

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

    from tasks.device import tensorbin

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


def _misaligned(shape: tuple[int, ...], dtype) -> np.ndarray:
    """An array of `dtype` that starts one byte past an element boundary (a view into a byte buffer)."""
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return np.zeros(n + 16, np.uint8)[1:1 + n].view(dtype).reshape(shape)


@pytest.mark.parametrize("call", ["tilize", "pack", "transpose", "round"])
def test_a_misaligned_input_gives_the_bytes_of_an_aligned_one(call):
    """C reads each element at a multiple of its size (UBSan reported kernels.c:18, :167, :269, :281 and :286 on a
    view that starts mid-element); such an input, which a Dask worker's unpickled buffer can be, is copied aligned
    first, so the result is the aligned input's."""
    rng = np.random.default_rng(3)
    good = rng.integers(0, 0x7F00, (32, 40), dtype=np.uint16)  # finite bf16 patterns
    bad = _misaligned(good.shape, np.uint16)
    bad[:] = good
    wide = rng.standard_normal(64).astype(np.float32)
    bad_wide = _misaligned(wide.shape, np.float32)
    bad_wide[:] = wide

    def run(x, w):
        if call == "tilize":
            out = np.zeros(2 * 2048, np.uint8)
            kernels.tilize_bf16(x, out)
        elif call == "pack":
            out = np.zeros(2 * 1088, np.uint8)
            kernels.pack_bfp8(x, out, np.zeros(5), np.zeros(1, np.float32))
        elif call == "transpose":
            out = np.zeros(x.shape[::-1], np.uint16)
            kernels.transpose_into(out, x)
        else:
            out = np.zeros(w.size, np.uint16)
            kernels.round_f32_bf16(w, out, 0x7FC0)
        return out.tobytes()

    assert bad.ctypes.data % 2 and bad_wide.ctypes.data % 4
    assert run(bad, bad_wide) == run(good, wide)


@pytest.mark.parametrize("call", ["tilize", "pack", "transpose", "round"])
def test_a_misaligned_output_is_refused_in_one_sentence(call):
    good = np.zeros((32, 32), np.uint16)
    calls = {
        "tilize": lambda: kernels.tilize_bf16(good, _misaligned((2048,), np.uint16).view(np.uint8)[:2048]),
        "pack": lambda: kernels.pack_bfp8(good, np.zeros(1088, np.uint8), _misaligned((5,), np.float64),
                                          np.zeros(1, np.float32)),
        "transpose": lambda: kernels.transpose_into(_misaligned((32, 32), np.uint16), good),
        "round": lambda: kernels.round_f32_bf16(np.zeros(64, np.float32), _misaligned((64,), np.uint16), 0x7FC0),
    }
    with pytest.raises(ValueError, match="not a multiple of its"):
        calls[call]()


@pytest.mark.parametrize("nan", [0x17FC0, -1, 1.5])
def test_a_nan_pattern_wider_than_16_bits_is_refused(nan):
    """ctypes keeps a c_uint16's low 16 bits: 0x17fc0 would be written as 0x7fc0 without a word."""
    with pytest.raises(ValueError, match="16-bit pattern"):
        kernels.round_f32_bf16(np.full(4, np.nan, np.float32), np.zeros(4, np.uint16), nan)


def test_the_widest_nan_pattern_is_written_as_given():
    out = np.zeros(4, np.uint16)
    kernels.round_f32_bf16(np.array([np.nan, 1.0, np.nan, 0.0], np.float32), out, 0xFFFF)
    assert out.tolist() == [0xFFFF, 0x3F80, 0xFFFF, 0]
