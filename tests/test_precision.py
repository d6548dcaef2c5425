"""Every safetensors dtype, odd shapes and short buffers, through each path that takes a checkpoint's bytes: the
rounding to bf16 (held to torch's `.to(torch.bfloat16)`), the C kernels and the numpy packers (a sentence or the
right bytes, never memory corruption), and the convert itself (one sentence naming the key and its dtype). The
kernels also run once under AddressSanitizer, in a subprocess."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from pipeline.jobs.convert import ConvertOptions, convert
from tasks.numerics import kernels
from tasks.device import tensorbin
from tasks.errors import CheckpointError
from tasks.numerics.precision import to_bf16
from tasks.source.safetensors_file import NUMPY_DTYPES, read_header

from tests.conftest import ROOT


def _torch_bf16_bits(values: np.ndarray) -> np.ndarray:
    import torch

    return torch.from_numpy(values.copy()).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def _special_f32() -> np.ndarray:
    """Every pattern the rounding can get wrong: ties (exactly half-way, odd and even), one ulp either side of a
    tie, denormals (the smallest, the largest, random ones), zeros, the largest values that still round to a finite
    bf16, ±Inf, and NaNs with payloads, quiet and signalling, of either sign."""
    top = np.arange(1 << 16, dtype=np.uint32) << 16
    ties = top | 0x8000
    near = np.concatenate([top | 0x7FFF, top | 0x8001])
    rng = np.random.default_rng(3)
    denormals = np.concatenate([np.array([1, 0x7FFFFF, 0x8000, 0x18000, 0x807FFFFF, 0x80000001], np.uint32),
                                rng.integers(1, 1 << 23, 4096, dtype=np.uint32) | (rng.integers(0, 2, 4096) << 31).astype(np.uint32)])
    edges = np.array([0, 0x80000000, 0x7F7F7FFF, 0xFF7F7FFF, 0x7F7F0000, 0x7F800000, 0xFF800000], np.uint32)
    nans = np.array([0x7F800001, 0xFF800001, 0x7FC00000, 0xFFC00000, 0x7FA5A5A5, 0xFFFFFFFF, 0x7FBFFFFF], np.uint32)
    bits = np.concatenate([ties, near, denormals, edges, nans])
    magnitude = bits & 0x7FFFFFFF
    keep = (magnitude < 0x7F7F8000) | (magnitude >= 0x7F800000)  # a finite value from the tie up rounds to Inf
    return bits[keep].view(np.float32)


@pytest.fixture(params=["C", "numpy"])
def rounding_path(request, monkeypatch):
    if request.param == "C":
        _needs_kernels()
    monkeypatch.setenv("GR00T_TT_KERNELS", "1" if request.param == "C" else "0")
    return request.param


def _torch_nan_is_vectorised() -> bool:
    import torch

    return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


def test_f32_rounds_to_bf16_exactly_as_torch_does(rounding_path):
    rng = np.random.default_rng(0)
    values = rng.integers(0, 2 ** 32, 1 << 21, dtype=np.uint64).astype(np.uint32).view(np.float32)
    values = values[np.isfinite(values) & (np.abs(values) < 3.38e38)]
    specials = _special_f32()
    if not _torch_nan_is_vectorised():  # torch's scalar path writes 0x7FC0 for NaN: hold the rest to it
        specials = specials[~np.isnan(specials)]
    for batch in (values, specials, specials[::-1].copy(), specials[:7].copy()):
        assert np.array_equal(to_bf16(batch, "k", "f").view(np.uint16), _torch_bf16_bits(batch))


def test_every_f16_rounds_to_bf16_exactly_as_torch_does(rounding_path):
    values = np.arange(1 << 16, dtype=np.uint16).view(np.float16)  # every pattern: Inf, NaNs, denormals included
    assert np.array_equal(to_bf16(values, "k", "f").view(np.uint16), _torch_bf16_bits(values))


def test_a_wide_tensor_is_rounded_as_it_is_read_and_refused_by_its_flat_index(rounding_path, tmp_path):
    """The graph's read (tasks/source/shards.py read_weight): block by block from the file, the same bits as torch."""
    from safetensors.numpy import save_file

    from tasks.source import shards

    values = np.random.default_rng(5).standard_normal((1500, 1100)).astype(np.float32)  # several read blocks
    values.reshape(-1)[[7, 1_234_567]] = [np.inf, np.nan]
    save_file({"w": values}, str(tmp_path / "m.safetensors"))
    got = shards.read_weight(read_header(tmp_path / "m.safetensors"), "w")
    assert got.dtype == ml_dtypes.bfloat16 and np.array_equal(got.view(np.uint16), _torch_bf16_bits(values))
    values.reshape(-1)[1_600_000] = 3.4e38
    save_file({"w": values}, str(tmp_path / "m.safetensors"))
    with pytest.raises(CheckpointError, match=r"value 3.39999995e\+38 \(flat index 1600000\) rounds to \+Inf"):
        shards.read_weight(read_header(tmp_path / "m.safetensors"), "w")


def test_a_wide_tensor_at_an_odd_offset_is_rounded_as_torch_rounds_it(rounding_path, tmp_path):
    """The format asks nothing of the header's length: a stranger's file may start its data at an odd byte, and
    a block of the shard's mapping then starts mid-float."""
    from tasks.source import shards

    values = np.random.default_rng(8).standard_normal((700, 900)).astype(np.float32)
    header = json.dumps({"w": {"dtype": "F32", "shape": [700, 900], "data_offsets": [0, values.nbytes]}}).encode()
    header += b" " * (3 - (8 + len(header)) % 4)  # data from an offset of 3 mod 4
    (tmp_path / "m.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + values.tobytes())
    parsed = read_header(tmp_path / "m.safetensors")
    assert parsed.data_start % 4 == 3
    assert np.array_equal(shards.read_weight(parsed, "w").view(np.uint16), _torch_bf16_bits(values))


def test_a_wide_tensor_cut_short_after_its_header_was_read_is_refused_by_its_file(tmp_path):
    """The header was read when the checkpoint was opened; a file cut short since (still being written, copied)
    is one sentence naming it, never a crash on the mapping or values made up."""
    from safetensors.numpy import save_file

    from tasks.source import shards

    save_file({"w": np.ones((1500, 1100), np.float32)}, str(tmp_path / "m.safetensors"))
    header = read_header(tmp_path / "m.safetensors")
    os.truncate(tmp_path / "m.safetensors", (tmp_path / "m.safetensors").stat().st_size - 4096)
    with pytest.raises(CheckpointError, match=r"m\.safetensors, key 'w': could not be read to the end .* wait for it"):
        shards.read_weight(header, "w")




@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_a_wide_banks_slot_is_rounded_as_it_is_read_into_a_page_aligned_array(rounding_path, tmp_path, dtype):
    """The graph's slot task (tasks/source/shards.py read_weight_slot): only the slot's bytes, rounded block by block as
    torch rounds `W[e]`, into memory the stage writes past the page cache as it is; refused by the flat index in
    the bank."""
    from safetensors.numpy import save_file

    from tasks.source import shards
    from tasks.io.bulk_write import ALIGN

    bank = np.random.default_rng(6).standard_normal((4, 1300, 900)).astype(dtype)  # a slot spans several blocks
    save_file({"b": bank}, str(tmp_path / "m.safetensors"))
    for slot in (0, 2, 3):
        got = shards.read_weight_slot(read_header(tmp_path / "m.safetensors"), "b", slot)
        assert got.dtype == ml_dtypes.bfloat16 and got.shape == (1300, 900)
        assert np.array_equal(got.view(np.uint16), _torch_bf16_bits(bank[slot]))
        assert got.ctypes.data % ALIGN == 0
    if dtype == np.float32:
        bank[2].reshape(-1)[5] = 3.4e38
        save_file({"b": bank}, str(tmp_path / "m.safetensors"))
        with pytest.raises(CheckpointError, match=rf"flat index {2 * 1300 * 900 + 5}\) rounds to \+Inf"):
            shards.read_weight_slot(read_header(tmp_path / "m.safetensors"), "b", 2)
TIE_TO_INF = float(np.array(0x7F7F8000, np.uint32).view(np.float32))  # half-way past bf16's largest: to even, Inf


@pytest.mark.parametrize("value", [3.3962e38, -3.4e38, 3.4028235e38, TIE_TO_INF])
def test_a_finite_value_that_rounds_to_inf_is_named_with_its_key(value, rounding_path):
    with pytest.raises(CheckpointError) as err:
        to_bf16(np.array([0.5, value], np.float32), "action_head.vlln.weight", "model.safetensors")
    msg = str(err.value)
    assert msg.startswith("model.safetensors, key 'action_head.vlln.weight': value ") and "(flat index 1)" in msg
    assert f"rounds to {'-' if value < 0 else '+'}Inf in bf16" in msg


# -- the C kernels and the numpy packers at their boundary ---------------------------------------------------------
ODD_SHAPES = [(1, 1), (1, 33), (31, 1), (33, 65), (70, 97)]


def _bits(shape, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def _needs_kernels():
    if not kernels.available():
        pytest.skip("no C compiler: the kernels were not built (the numpy packers are used)")


@pytest.mark.parametrize("dtype", sorted(NUMPY_DTYPES))
def test_every_dtype_but_bf16_bits_is_refused_before_a_kernel_is_called(dtype):
    _needs_kernels()
    matrix = np.zeros((33, 65), NUMPY_DTYPES[dtype])
    out = np.zeros(1 << 16, np.uint8)
    calls = [lambda: kernels.tilize_bf16(matrix, out),
             lambda: kernels.pack_bfp8(matrix, out, np.zeros(5), np.zeros(1, np.float32)),
             lambda: kernels.transpose_into(np.zeros((65, 33), NUMPY_DTYPES[dtype]), matrix)]
    for call in calls:
        if dtype in ("BF16", "U16"):
            call()  # bf16 bits (or their uint16 view): taken
        else:
            with pytest.raises(ValueError, match="expected a 2-D array of bf16 bits"):
                call()


@pytest.mark.parametrize("shape", ODD_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_short_output_buffers_are_refused_and_exact_ones_give_the_numpy_packers_bytes(shape, monkeypatch):
    _needs_kernels()
    x = _bits(shape)
    for dtype, call in (("bfloat16", lambda o: kernels.tilize_bf16(x, o)),
                        ("bfloat8_b", lambda o: kernels.pack_bfp8(x, o, np.zeros(5), np.zeros(1, np.float32)))):
        size = tensorbin.payload_size(shape, dtype)
        with pytest.raises(ValueError, match=f"holds {size - 1} bytes, the result needs {size}"):
            call(np.zeros(size - 1, np.uint8))
        exact = np.zeros(size, np.uint8)
        call(exact)
        monkeypatch.setenv("GR00T_TT_KERNELS", "0")
        assert np.array_equal(exact, tensorbin.pack(x, dtype).payload)  # the numpy packer: the same bytes
        monkeypatch.delenv("GR00T_TT_KERNELS")
    with pytest.raises(ValueError, match="does not fit"):
        kernels.transpose_into(np.zeros((shape[1], shape[0] + 1), np.uint16), x)
    with pytest.raises(ValueError, match="read-only"):
        out = np.zeros(shape[::-1], np.uint16)
        out.flags.writeable = False
        kernels.transpose_into(out, x)


@pytest.mark.parametrize("kernels_on", ["1", "0"], ids=["C", "numpy"])
def test_the_packer_refuses_wide_values_and_short_buffers_in_both_paths(kernels_on, monkeypatch):
    monkeypatch.setenv("GR00T_TT_KERNELS", kernels_on)
    for wrong in (np.float32, np.float16, np.int16):  # 2-byte values that are not bf16 are refused too, not read as it
        with pytest.raises(ValueError, match=rf"pack takes bf16 values .*, got {np.dtype(wrong)}"):
            tensorbin.pack(np.zeros((33, 65), wrong), "bfloat8_b")
    with pytest.raises(ValueError, match="pack needs a uint8 buffer of"):
        tensorbin.pack(_bits((33, 65)), "bfloat16", np.zeros(100, np.uint8))


SANITIZED = """
import ctypes, sys
import numpy as np
from tasks.numerics import kernels
from tasks.device import tensorbin
kernels._lib = lambda: kernels.bind(ctypes.CDLL(sys.argv[1]))
for shape in {shapes}:
    x = (np.random.default_rng(1).standard_normal(shape).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    for dtype in ("bfloat16", "bfloat8_b"):
        tensorbin.pack(x, dtype, np.empty(tensorbin.payload_size(shape, dtype), np.uint8))  # exactly sized
    wide = np.zeros((shape[1], shape[0] + 5), np.uint16)
    kernels.transpose_into(wide[:, 2:2 + shape[0]], x)
    assert np.array_equal(wide[:, 2:2 + shape[0]], x.T) and not wide[:, :2].any() and not wide[:, 2 + shape[0]:].any()
    for bad in (np.zeros(shape, np.float32), np.zeros(shape, np.int8)):
        try:
            tensorbin.pack(bad, "bfloat8_b")
        except ValueError:
            pass
for n in (0, 1, 31, 1000):
    w = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    w[:n // 2] = np.float32(3.4e38)  # the overflow scan runs to its end
    o = np.zeros(n + 4, np.uint16)
    kernels.round_f32_bf16(w, o[:n], 0xFFFF)
    assert not o[n:].any()
print("sanitized run: clean")
"""


def test_the_kernels_run_clean_under_address_sanitizer(tmp_path):
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    libasan = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    if not os.path.isabs(libasan) or not os.path.exists(libasan):
        pytest.skip(f"{cc} has no AddressSanitizer runtime here")
    built = tmp_path / "kernels-asan.so"
    subprocess.run([cc, "-O1", "-g", "-fsanitize=address", "-fno-omit-frame-pointer", "-shared", "-fPIC", "-o",
                    str(built), str(kernels.SOURCE), "-lm"], check=True)
    env = {**os.environ, "LD_PRELOAD": libasan, "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0"}
    proc = subprocess.run([sys.executable, "-c", SANITIZED.format(shapes=ODD_SHAPES + [(256, 96)]), str(built)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert "ERROR: AddressSanitizer" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 0 and "sanitized run: clean" in proc.stdout, proc.stderr[-3000:]


# -- the convert: one sentence naming the key and its dtype --------------------------------------------------------
RELABELLED = "action_head.model.transformer_blocks.1.ff.net.2.weight"


def _relabel(snapshot: Path, out: Path, key: str, dtype: str) -> Path:
    """A copy of the snapshot whose `key` claims `dtype`, its bytes kept (the shape scaled to fit them): a valid
    safetensors file, as a stranger may hand us."""
    shutil.copytree(snapshot, out, symlinks=False)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    path = out / index["weight_map"][key]
    head = read_header(path)
    raw = path.read_bytes()
    doc = json.loads(raw[8:8 + head.header_len])
    entry = doc[key]
    nbytes = entry["data_offsets"][1] - entry["data_offsets"][0]
    width = NUMPY_DTYPES[dtype].itemsize
    entry["dtype"], entry["shape"] = dtype, [nbytes // width] if nbytes % width == 0 else entry["shape"]
    assert nbytes % width == 0
    text = json.dumps(doc, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path.unlink()
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + head.header_len:])
    index["metadata"].pop("total_size", None)
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    return out


@pytest.mark.parametrize("dtype", ["I16", "U16", "I32", "I8", "U8", "F8_E4M3", "F8_E5M2", "BOOL", "F64", "I64"])
def test_a_tensor_of_another_dtype_is_named_with_its_dtype_and_nothing_is_published(snapshots, tmp_path, dtype):
    snap = _relabel(snapshots["n16"], tmp_path / "snap", RELABELLED, dtype)
    with pytest.raises(CheckpointError) as err:
        convert(ConvertOptions(None, snapshot=snap, cache_root=tmp_path / "cache", embodiments="gr1", progress=False))
    assert f"key {RELABELLED!r}: dtype {dtype} is not a weight dtype (GR00T weights are BF16, F16, F32)" in str(err.value)
    assert not (tmp_path / "cache" / "entries").exists() or not list((tmp_path / "cache" / "entries").iterdir())


def test_the_cli_says_it_in_one_sentence_and_exits_2(snapshots, tmp_path):
    snap = _relabel(snapshots["n16"], tmp_path / "snap", RELABELLED, "I16")
    proc = subprocess.run([sys.executable, "-m", "pipeline", "convert", "--snapshot", str(snap), "--cache",
                           str(tmp_path / "cache"), "--embodiments", "gr1"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and "dtype I16 is not a weight dtype" in proc.stderr


def test_a_f32_value_past_bf16s_range_refuses_the_convert_by_key_and_value(snapshots, tmp_path):
    from pipeline.inputs.synth import _write_shards
    from tasks.source.checkpoint import Checkpoint

    with Checkpoint(snapshots["n16"]) as ck:
        tensors = {k: ck.get(k) for k in ck.keys()}
        shard_of = {k: ck.shard_of(k) for k in ck.keys()}
    big = tensors[RELABELLED].astype(np.float32)
    big.reshape(-1)[7] = 3.4e38  # finite in F32, past the half-way point above bf16's largest value
    tensors[RELABELLED] = big
    _write_shards(tmp_path / "snap", tensors, shard_of, "synthetic, a value past bf16's range")
    with pytest.raises(CheckpointError) as err:
        convert(ConvertOptions(None, snapshot=tmp_path / "snap", cache_root=tmp_path / "cache", progress=False))
    assert f"key {RELABELLED!r}: value 3.39999995e+38 (flat index 7) rounds to +Inf in bf16" in str(err.value)
    assert not (tmp_path / "cache" / "entries").exists() or not list((tmp_path / "cache" / "entries").iterdir())


@pytest.mark.parametrize("direct", [False, True], ids=["buffered", "O_DIRECT"])
@pytest.mark.parametrize("dtype", ["BF16", "F16", "F32"])
def test_a_host_table_is_staged_as_torchs_float32_of_it_block_by_block(disk_path, monkeypatch, dtype, direct):
    """A host table (embed_tokens) is kept as the float32 the port holds, streamed from its file as it is written
    (F32 copied, BF16 and F16 widened), one bounce block at a time: never whole in memory. Every block boundary
    and the last short block give, on disk and in the record, what torch's `.to(torch.float32)` gives of the whole
    tensor."""
    import torch
    import xxhash
    from safetensors.torch import save_file

    from tasks.io import bulk_write
    from tasks.source import shards
    from tasks.device.host_tensors import convert_target
    from tasks.plan import HOST, Target
    from tasks.stage import stage_target

    rows = torch.randn(37, 96, dtype=torch.float32)
    stored = rows.to({"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}[dtype])
    save_file({"embed_tokens.weight": stored}, str(disk_path / "m.safetensors"))
    monkeypatch.setattr(bulk_write, "BOUNCE", 4096)      # 4 blocks of the 14,208-byte float32 table
    monkeypatch.setattr(bulk_write, "DIRECT_MIN", 0 if direct else 1 << 40)
    read = shards.read_weight(read_header(disk_path / "m.safetensors"), "embed_tokens.weight", host=True)
    target = Target(name="language.embed_tokens.weight", sources=("embed_tokens.weight",), transform="identity",
                    kind="host", shape=(37, 96), device_dtype="float32", device_layout=HOST)
    (disk_path / "entry" / target.name).mkdir(parents=True)
    staged = stage_target(disk_path / "entry", convert_target(read, target))
    want = stored.to(torch.float32).numpy().tobytes()
    got = (disk_path / "entry" / target.name / "c.0.0").read_bytes()
    assert got == want
    assert (staged.record.nbytes, staged.record.xxh3) == (len(want), xxhash.xxh3_64_hexdigest(want))


def test_a_nan_in_a_streamed_host_table_is_named_by_its_flat_index(tmp_path):
    """A host table is checked as the stage streams it into the entry, block by block (read once): a NaN past the
    first block is still named."""
    import torch
    from safetensors.torch import save_file

    from tasks.source import shards
    from tasks.device.host_tensors import convert_target
    from tasks.plan import HOST, Target

    table = torch.randn(1500, 1000, dtype=torch.float32)  # 1.5 M values: two blocks of 1 M
    table.view(-1)[1_200_000] = float("nan")
    table.view(-1)[1_300_000] = float("inf")
    save_file({"embed_tokens.weight": table}, str(tmp_path / "m.safetensors"))
    from tasks.stage import stage_target

    read = shards.read_weight(read_header(tmp_path / "m.safetensors"), "embed_tokens.weight", host=True)
    target = Target(name="language.embed_tokens.weight", sources=("embed_tokens.weight",), transform="identity",
                    kind="host", shape=(1500, 1000), device_dtype="float32", device_layout=HOST)
    (tmp_path / "entry" / target.name).mkdir(parents=True)
    with pytest.raises(CheckpointError, match=r"m.safetensors, key 'embed_tokens.weight': 2 NaN/Inf value\(s\) in "
                                              r"target 'language.embed_tokens.weight' \(first at flat index 1200000\)"):
        stage_target(tmp_path / "entry", convert_target(read, target, origin="m.safetensors"))
