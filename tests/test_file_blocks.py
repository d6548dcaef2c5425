"""The hash passes' reader (tasks/io/file_blocks.py) and the shard hashes built on it, held to plain reads: hashlib
and xxhash over bytes from `Path.read_bytes`, tensor spans from the safetensors header parsed here with json."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import xxhash

from tasks.io import file_blocks
from tasks.source import shards
from tasks.source.safetensors_file import read_header
from tasks.source.shards import content_identity, hash_shard, identify_shards, verify_shard

BLOCK = 8192


def _blocks(path: Path, how: str = "mapped") -> tuple[bytes, list[int], int]:
    parts, offsets = [], []

    def consume(view: memoryview, pos: int) -> None:
        parts.append(bytes(view))
        offsets.append(pos)

    size = file_blocks.each_read(path, consume) if how == "each_read" else file_blocks.each_block(path, consume, BLOCK)
    return b"".join(parts), offsets, size


@pytest.mark.parametrize("how", ["mapped", "read", "each_read"])
@pytest.mark.parametrize("size", [0, 1, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK + 17])
def test_each_block_gives_every_byte_in_order(tmp_path, monkeypatch, how, size):
    monkeypatch.setattr(file_blocks, "_mapping_works", how == "mapped")
    monkeypatch.setattr(file_blocks, "READ_BLOCK", BLOCK)
    path = tmp_path / "f"
    data = bytes((i * 131 + 7) % 256 for i in range(size))
    path.write_bytes(data)
    got, offsets, returned = _blocks(path, how)
    assert got == data and returned == size
    assert offsets == list(range(0, size, BLOCK))


@pytest.mark.parametrize("how", ["mapped", "read"])
@pytest.mark.parametrize("span", [(0, 1), (5000, 5001), (4096, 3 * BLOCK), (BLOCK + 3, 3 * BLOCK + 17), (17, 17)])
def test_each_block_over_a_span_gives_its_bytes_in_blocks_from_its_start(tmp_path, monkeypatch, how, span):
    """Exactly the span, every block but the last whole from its first byte: a converting read of float32 values
    at an odd offset must never see one cut in two."""
    monkeypatch.setattr(file_blocks, "_mapping_works", how == "mapped")
    path = tmp_path / "f"
    data = bytes((i * 131 + 7) % 256 for i in range(3 * BLOCK + 17))
    path.write_bytes(data)
    parts = []
    assert file_blocks.each_block(path, lambda view, pos: parts.append((pos, bytes(view))), BLOCK, span) == span[1]
    assert b"".join(b for _, b in parts) == data[span[0]:span[1]]
    assert [pos for pos, _ in parts] == list(range(span[0], span[1], BLOCK))


def test_a_span_of_an_object_in_a_store_is_read_by_ranged_gets_only(monkeypatch):
    """A worker converting a tensor of a checkpoint in the bucket asks for its bytes, block by block, and nothing
    else: opening the object would first ask the store for its size (a HEAD a tensor, on every slot of a bank)."""
    from upath import UPath

    path = UPath("memory://bucket/ckpt/model.safetensors")
    data = bytes((i * 131 + 7) % 256 for i in range(3 * BLOCK + 17))
    path.write_bytes(data)
    asked = []
    fs = path.fs
    cat_file = fs.cat_file
    monkeypatch.setattr(fs, "cat_file", lambda p, start=None, end=None, **kw: asked.append((start, end)) or
                        cat_file(p, start=start, end=end, **kw))
    monkeypatch.setattr(type(path), "open", lambda *a, **k: pytest.fail("the object was opened"))
    monkeypatch.setattr(type(path), "stat", lambda *a, **k: pytest.fail("the store was asked for the size"))
    parts = []
    assert file_blocks.each_block(path, lambda view, pos: parts.append((pos, bytes(view))), BLOCK,
                                  (BLOCK + 3, 3 * BLOCK + 17)) == 3 * BLOCK + 17
    assert b"".join(b for _, b in parts) == data[BLOCK + 3:3 * BLOCK + 17]
    assert asked == [(BLOCK + 3, 2 * BLOCK + 3), (2 * BLOCK + 3, 3 * BLOCK + 3), (3 * BLOCK + 3, 3 * BLOCK + 17)]


def test_a_view_kept_past_its_call_neither_fails_the_pass_nor_goes_bad(tmp_path, monkeypatch):
    """A Dask worker's profiler samples the converting thread and can hold its frame, with the array made from a
    block, past the call: releasing the view or closing the mapping then raised BufferError, which failed a
    cluster convert now and then. The pass ends normally and the kept array still reads the file's bytes."""
    import numpy as np

    monkeypatch.setattr(file_blocks, "_mapping_works", True)
    path = tmp_path / "f"
    data = bytes((i * 131 + 7) % 256 for i in range(3 * BLOCK + 17))
    path.write_bytes(data)
    kept = []
    assert file_blocks.each_block(path, lambda view, pos: kept.append(np.frombuffer(view, np.uint8)), BLOCK,
                                  (5, 3 * BLOCK + 17)) == 3 * BLOCK + 17
    assert b"".join(a.tobytes() for a in kept) == data[5:]


@pytest.mark.parametrize("how", ["mapped", "read"])
def test_a_span_past_the_end_of_the_file_is_an_oserror(tmp_path, monkeypatch, how):
    """A header read before the file was cut short names bytes it no longer has: never fewer bytes in silence."""
    monkeypatch.setattr(file_blocks, "_mapping_works", how == "mapped")
    path = tmp_path / "f"
    path.write_bytes(b"\1" * (2 * BLOCK))
    with pytest.raises(OSError, match="did the file change"):
        file_blocks.each_block(path, lambda view, pos: None, BLOCK, (100, 2 * BLOCK + 1))


def test_each_read_gives_whole_blocks_when_the_reads_come_short(tmp_path, monkeypatch):
    """A pipe hands out what was written so far: 3,000 bytes a read. Blocks must still be whole (a consumer widening
    bf16 values must never see one cut in two), and every byte in order."""
    monkeypatch.setattr(file_blocks, "READ_BLOCK", BLOCK)
    path = tmp_path / "fifo"
    os.mkfifo(path)
    data = bytes((i * 7 + 3) % 256 for i in range(2 * BLOCK + 5))

    def write() -> None:
        with open(path, "wb", buffering=0) as fh:
            for i in range(0, len(data), 3000):
                fh.write(data[i:i + 3000])
                time.sleep(0.001)

    writer = threading.Thread(target=write)
    writer.start()
    sizes: list[int] = []
    got = bytearray()

    def consume(view: memoryview, pos: int) -> None:
        sizes.append(len(view))
        got.extend(view)

    file_blocks.each_read(path, consume)
    writer.join()
    assert bytes(got) == data and sizes == [BLOCK, BLOCK, 5]


@pytest.mark.parametrize("call", ["each_block({path!r}, consume, {block})", "each_read({path!r}, consume)"])
def test_a_file_cut_short_while_read_is_an_oserror_not_a_crash(tmp_path, call):
    """A mapped file truncated under the reader would be a SIGBUS on access; the populate step turns it into an
    OSError. A read one must not pass for a shorter file. Run in a child so that a crash fails this test instead of
    killing the worker."""
    path = tmp_path / "f"
    path.write_bytes(b"\1" * (4 * BLOCK))
    code = textwrap.dedent(f"""
        import os
        from tasks.io import file_blocks
        from tasks.source import shards
        def consume(view, pos):
            bytes(view)  # every byte touched, as a hash does
            if pos == 0:
                os.truncate({str(path)!r}, 100)
        file_blocks.READ_BLOCK = {BLOCK}
        try:
            file_blocks.{call.format(path=str(path), block=BLOCK)}
        except OSError as e:
            print("OSError", e)
        else:
            print("no error")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("OSError"), done.stdout
    assert "did the file change" in done.stdout


def _spans(path: Path) -> dict[str, bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    return {k: raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in header.items()}


@pytest.mark.parametrize("piece", [1, 4096, 256 << 20])  # each tensor a run of its own; a few; each shard whole
def test_shard_hashes_equal_plain_hashes(snapshots, monkeypatch, piece):
    monkeypatch.setattr(shards, "PIECE", piece)
    files = sorted(snapshots["n16"].glob("*.safetensors"))
    headers = [read_header(p) for p in files]
    for tensors, header, path in zip(identify_shards(headers, 2), headers, files):
        verified = verify_shard(header, content_identity(header, tensors), record_sha256=True)  # --sha256
        assert verified.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
        assert verify_shard(header, content_identity(header, tensors)).sha256 is None  # none unless asked
        assert tensors == verified.tensor_xxh3 == {k: xxhash.xxh3_128_hexdigest(b) for k, b in _spans(path).items()}
        assert hash_shard(read_header(path)) == (verified.sha256, dict(verified.tensor_xxh3))
