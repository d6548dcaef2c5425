"""ttnn's `.tensorbin` made in numpy (tasks/device/tensorbin.py) against ttnn itself, on inputs chosen to break it: every
finite bf16 pattern, exact ties, saturation, denormals and tiny exponents, Inf/NaN rows, row and column padding,
ranks 2 and 3. Byte for byte against `dump_tensor`, value for value against `to_torch`."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
import ttnn

from tasks.numerics import kernels
from tasks.device import tensorbin
from tasks.device.host_tensors import convert_target
from tasks.numerics.precision import widen_bf16
from tasks.plan import Target

RNG = np.random.default_rng(7)


def _bf16(shape) -> np.ndarray:
    return (RNG.standard_normal(shape).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def _patterns() -> dict[str, np.ndarray]:
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    finite = every[((every >> 7) & 0xFF) != 0xFF]
    cut = lambda x, w: x[: x.size // w * w].reshape(-1, w)  # noqa: E731
    inf_nan = _bf16((32, 64))
    inf_nan[3, 5], inf_nan[7, 20], inf_nan[10, 40], inf_nan[20, 1] = 0x7F80, 0xFF80, 0x7FC0, 0x7FC0
    tiny = (RNG.integers(0, 4, (32, 64)) << 7 | RNG.integers(0, 128, (32, 64))).astype(np.uint16)
    return {
        "every finite pattern, in order": cut(finite, 128),
        "every finite pattern, shuffled": cut(RNG.permutation(finite), 96),
        "exact ties": np.full((32, 32), 0x3F81, np.uint16),
        "saturation": np.tile(np.array([0x3FFF, 0x3F80] * 8, np.uint16), (32, 2)),
        "denormals and tiny exponents": tiny,
        "zeros and signed zeros": np.tile(np.array([0x0000, 0x8000], np.uint16), (32, 16)),
        "Inf and NaN rows (NaN as 0x7FC0: ttnn makes every bf16 NaN that)": inf_nan,
        "row and column padding": _bf16((37, 70)),
        "rank 3 (position tables)": _bf16((1, 50, 40)),
        "one row (biases, norms)": _bf16((1, 300)),
    }


def _ttnn_file(bits: np.ndarray, dtype: str) -> tuple[bytes, object]:
    host = ttnn.Tensor(tensor=widen_bf16(bits), data_type=getattr(ttnn, dtype), layout=ttnn.TILE_LAYOUT)
    with tempfile.TemporaryDirectory() as tmp:
        ttnn.dump_tensor(str(Path(tmp) / "t.tensorbin"), host)
        return (Path(tmp) / "t.tensorbin").read_bytes(), host


@pytest.fixture(params=["C kernel", "numpy"])
def packer(request, monkeypatch):
    """Both packers, each held to ttnn: tasks/numerics/kernels.c (when a compiler built it) and the numpy fallback."""
    if request.param == "numpy":
        monkeypatch.setattr(kernels, "available", lambda: False)
    elif not kernels.available():
        pytest.skip("no C compiler: the kernel was not built")
    return request.param


@pytest.mark.parametrize("dtype", ["bfloat8_b", "bfloat16"])
@pytest.mark.parametrize("case", list(_patterns()))
def test_numpy_tensorbin_is_byte_identical_to_dump_tensor(case, dtype, packer):
    bits = _patterns()[case]
    expected, host = _ttnn_file(bits, dtype)
    made = tensorbin.tensorbin(bits, dtype)
    assert made is not None, "the header template did not check out against this ttnn"
    blob, packed = made
    assert blob.tobytes() == expected
    if dtype == "bfloat8_b":  # the values the numerics are computed from are the ones ttnn reads back
        back = ttnn.to_torch(host).float().numpy().reshape(bits.shape)
        assert np.array_equal(tensorbin.unpack_bfp8(packed.payload, bits.shape), back, equal_nan=True)
        if np.isfinite(back).all():
            assert packed.max_abs_err == float(np.abs(back - widen_bf16(bits)).max())


@pytest.mark.parametrize("case", list(_patterns()))
def test_untilize_gives_back_what_ttnn_reads_from_the_tile_buffer(case, packer):
    """A bf16 TILE buffer, as ttnn itself writes it, back to rows: equal to ttnn's `to_torch` bit for bit, padding
    dropped; into a caller's buffer too (a slot of a bank)."""
    bits = _patterns()[case]
    blob, host = _ttnn_file(bits, "bfloat16")
    payload = np.frombuffer(blob, np.uint8)[8 + int(np.frombuffer(blob[:8], "<u8")[0]):]
    expected = ttnn.to_torch(host).view(torch.int16).numpy().view(np.uint16).reshape(bits.shape)
    assert np.array_equal(tensorbin.untilize(payload, bits.shape), expected)
    bank = np.full((3, *bits.shape), 0xFFFF, np.uint16)
    tensorbin.untilize(payload, bits.shape, out=bank[1])
    assert np.array_equal(bank[1], expected) and (bank[[0, 2]] == 0xFFFF).all()


def test_numpy_numerics_match_the_ttnn_round_trip_and_the_bytes_match_ttnn_path(packer, tmp_path):
    bits = _bf16((96, 200))
    target = Target(name="w", sources=("k",), transform="identity", kind="matmul", device_dtype="bfloat8_b",
                    device_layout="TILE", shape=bits.shape, device_file=True, min_pcc=0.999)
    ours = convert_target(bits.view(np.uint16), target)
    theirs = convert_target(bits.view(np.uint16), target, check_bf16=True)
    assert bytes(ours.packed) == bytes(theirs.packed)  # the ttnn path: from_torch, dump_tensor, to_torch numerics
    assert ours.max_abs_err == theirs.max_abs_err
    (tmp_path / "t.tensorbin").write_bytes(bytes(ours.packed))
    loaded = ttnn.load_tensor(str(tmp_path / "t.tensorbin"))
    back = ttnn.to_torch(ttnn.Tensor(tensor=widen_bf16(bits), data_type=ttnn.bfloat8_b, layout=ttnn.TILE_LAYOUT))
    assert torch.equal(ttnn.to_torch(loaded), back)
    # Both PCCs against the exact one (float64 over ttnn's read-back values): every path sums in float64 (the C
    # kernel over the whole matrix, numpy and the ttnn path per block).
    exact = np.corrcoef(back.double().numpy().ravel(), widen_bf16(bits).astype(np.float64).ravel())[0, 1]
    assert ours.pcc < 1.0 and theirs.pcc == pytest.approx(exact, abs=1e-6)
    assert ours.pcc == pytest.approx(exact, abs=1e-8 if packer == "C kernel" else 1e-6)


def test_checked_headers_are_kept_per_install_and_a_damaged_record_is_checked_again(tmp_path, monkeypatch):
    monkeypatch.setattr(kernels, "homes", lambda: [tmp_path])
    first = tensorbin._Headers().get(2, "bfloat8_b")  # a new process: checked against ttnn, then kept
    assert first is not None
    (record,) = tmp_path.glob("_ttnn-headers-*.json")
    monkeypatch.setattr(tensorbin, "ttnn_module", lambda: pytest.fail("ttnn was asked again for a header already kept"))
    assert tensorbin._Headers().get(2, "bfloat8_b") == first
    record.write_text("{half a reco")
    monkeypatch.setattr(tensorbin, "ttnn_module", lambda: ttnn)
    assert tensorbin._Headers().get(2, "bfloat8_b") == first  # checked again, and kept again
    assert json.loads(record.read_text())["2:bfloat8_b"][0] == first[0].hex()


def test_the_kept_headers_are_named_by_the_packer_source_too(tmp_path, monkeypatch):
    before = tensorbin._learned_name()
    edited = tmp_path / "kernels.c"
    edited.write_bytes(kernels.SOURCE.read_bytes() + b"\n/* an edit */\n")
    monkeypatch.setattr(kernels, "SOURCE", edited)
    assert tensorbin._learned_name() != before  # an edited packer is checked against ttnn again


def test_a_large_untilize_into_fresh_huge_pages_gives_back_the_values(packer):
    """Past four huge pages the values are untilized into memory asked for as huge pages: the same values."""
    bits = _bf16((2048, 2100))  # 8.6 MB, padding in the columns
    out = tensorbin.untilize(tensorbin.pack(bits, "bfloat16").payload, bits.shape)
    assert out.nbytes >= 4 * tensorbin._HUGE and out.flags.writeable and np.array_equal(out, bits)
