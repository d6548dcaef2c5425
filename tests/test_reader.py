"""The reader against plain `safetensors` reads, and every malformed input it must refuse with one clear error."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from pipeline.model.state_dict import tensor_specs
from pipeline.model.versions import VERSIONS, load_config
from tasks.source.checkpoint import INDEX_NAME, Checkpoint
from tasks.errors import CheckpointError
from tasks.source.safetensors_file import write_file


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.int16).numpy().view(np.uint16)


@pytest.mark.parametrize("version", VERSIONS)
def test_every_tensor_equals_a_plain_safetensors_read(snapshots, version):
    with Checkpoint(snapshots[version]) as ck:
        assert len(ck) == len(tensor_specs(version))
        for shard in ck.headers:
            with safe_open(str(ck.shard_path(shard)), "pt") as f:
                for key in f.keys():
                    assert ck.shard_of(key) == shard
                    ref = f.get_tensor(key)
                    got = ck.get(key)
                    assert got.shape == tuple(ref.shape) and ck.dtype(key) == "BF16"
                    assert np.array_equal(got.view(np.uint16), _bits(ref)), key


def test_keys_are_shard_then_name_ordered(snapshots):
    with Checkpoint(snapshots["n16"]) as ck:
        keys = ck.keys()
        assert keys == sorted(keys, key=lambda k: (ck.shard_of(k), k))
        assert keys[0].startswith("action_head.") and ck.shard_of(keys[0]).startswith("model-00001")


def test_slot_and_rows_read_only_what_they_return(snapshots):
    key = "action_head.action_encoder.W2.W"
    with Checkpoint(snapshots["n17"]) as ck, safe_open(str(ck.shard_path(ck.shard_of(key))), "pt") as f:
        ref = f.get_tensor(key)
        for e in (0, 5, 31):
            before = ck.bytes_read
            slot = ck.slot(key, e)
            assert ck.bytes_read - before == ck.info(key).nbytes // 32 == slot.nbytes
            assert np.array_equal(slot.view(np.uint16), _bits(ref[e]))  # [in, out], not transposed
        before = ck.bytes_read
        rows = ck.rows("action_head.position_embedding.weight", 3, 7)
        assert rows.shape[0] == 4 and ck.bytes_read - before == rows.nbytes


def test_prefix_queries_and_straddle(snapshots):
    with Checkpoint(snapshots["n15"]) as ck:
        unit = "backbone.eagle_model.language_model.model.layers.5."
        assert ck.shards_for_prefix(unit) == ("model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors")
        assert len(ck.shards_for_prefix("backbone.eagle_model.language_model.model.layers.4.")) == 1
        with pytest.raises(CheckpointError, match="no key starts with 'backbone.typo'"):
            ck.keys_with_prefix("backbone.typo")
        with pytest.raises(CheckpointError, match="slot 32 is out of range: the bank has slots 0..31"):
            ck.slot("action_head.state_encoder.layer1.W", 32)


def test_byte_accounting_closes(snapshots):
    with Checkpoint(snapshots["n17"]) as ck:
        acct = ck.byte_accounting()
        for name, s in acct.items():
            assert 8 + s["header_bytes"] + s["data_bytes"] == s["file_size"] == os.path.getsize(ck.shard_path(name))
        assert sum(s["data_bytes"] for s in acct.values()) == ck.metadata["total_size"]


def test_streaming_writer_is_byte_identical_to_safetensors(tmp_path):
    rng = np.random.default_rng(1)
    tensors = {"b.w": rng.standard_normal((3, 5)).astype(np.float32), "a.x": rng.standard_normal(7).astype(np.float32)}
    with open(tmp_path / "ours.safetensors", "wb") as fh:
        write_file(fh, [(k, "F32", v.shape) for k, v in tensors.items()], lambda k: [tensors[k]])
    save_file({k: torch.from_numpy(v) for k, v in tensors.items()}, str(tmp_path / "ref.safetensors"), metadata={"format": "pt"})
    assert (tmp_path / "ours.safetensors").read_bytes() == (tmp_path / "ref.safetensors").read_bytes()


# ---- malformed inputs: each builds its own corrupt snapshot -------------------------------------------------------

def _small_snapshot(root: Path) -> Path:
    """Two shards, three bf16 tensors: enough structure for every corruption."""
    root.mkdir(parents=True, exist_ok=True)
    plan = {"model-00001-of-00002.safetensors": [("a", "BF16", (2, 4)), ("b", "BF16", (4,))],
            "model-00002-of-00002.safetensors": [("c", "BF16", (3, 2)), ("d", "BF16", (2,))]}
    numel = {"a": 8, "b": 4, "c": 6, "d": 2}
    for name, entries in plan.items():
        with open(root / name, "wb") as fh:
            write_file(fh, entries, lambda k: [np.zeros(numel[k], np.uint16)])
    index = {"metadata": {"total_size": 40}, "weight_map": {k: n for n, es in plan.items() for k, _, _ in es}}
    (root / INDEX_NAME).write_text(json.dumps(index))
    return root


def _rewrite_header(path: Path, mutate) -> None:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header = mutate(header)
    body = header if isinstance(header, bytes) else json.dumps(header, separators=(",", ":")).encode()
    body += b" " * (-len(body) % 8)
    path.write_bytes(struct.pack("<Q", len(body)) + body + raw[8 + n:])


def _edit_index(root: Path, mutate) -> None:
    index = json.loads((root / INDEX_NAME).read_text())
    mutate(index)
    (root / INDEX_NAME).write_text(json.dumps(index))


S1, S2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"


def _set(d, path, value):
    *head, last = path
    for p in head:
        d = d[p]
    d[last] = value
    return d


def corrupt_cases():
    """(id, function(root) that corrupts the snapshot, expected error fragment)."""
    def header(shard, mutate):
        return lambda root: _rewrite_header(root / shard, mutate)

    def entry(key, field, value):
        return header(S1, lambda h: (_set(h, [key, field], value), h)[1])

    def raw_prefix(value):
        return lambda root: (root / S1).write_bytes(struct.pack("<Q", value) + (root / S1).read_bytes()[8:])

    return [
        ("header-length-2^63", raw_prefix(2**63), "exceeds the 104857600-byte cap"),
        ("header-length-past-eof", raw_prefix(10_000), "runs past the end of the"),
        ("truncated-in-header", lambda r: (r / S1).write_bytes((r / S1).read_bytes()[:40]), "runs past the end of the"),
        ("truncated-prefix", lambda r: (r / S1).write_bytes(b"\x01\x02"), "too short for the 8-byte header length"),
        ("truncated-in-data", lambda r: (r / S2).write_bytes((r / S2).read_bytes()[:-2]), "is past the end of the data"),
        ("trailing-bytes", lambda r: (r / S2).write_bytes((r / S2).read_bytes() + b"xx"), "tensors cover 16 data bytes but the file holds 18"),
        ("header-not-utf8", header(S1, lambda h: b"\xff\xfe" + b" " * 6), "header is not UTF-8"),
        ("header-not-json", header(S1, lambda h: b"{nope"), "header is not valid JSON"),
        ("header-not-object", header(S1, lambda h: b"[1,2]"), "header must be a JSON object, found list"),
        ("metadata-not-strings", header(S1, lambda h: {**h, "__metadata__": {"format": 1}}), "__metadata__ must be an object of strings"),
        ("offsets-reversed", entry("a", "data_offsets", [16, 0]), "are reversed or negative"),
        ("offsets-overlap", entry("b", "data_offsets", [14, 22]), "overlaps the previous tensor"),
        ("offsets-gap", header(S1, lambda h: (_set(h, ["b", "data_offsets"], [18, 26]), h)[1]), "leaves a gap of 2 bytes"),
        ("offsets-out-of-range", entry("b", "data_offsets", [16, 1000]), "span 984 bytes but shape [4] x BF16 needs 8"),
        ("shape-span-mismatch", entry("b", "shape", [5]), "span 8 bytes but shape [5] x BF16 needs 10"),
        ("unknown-dtype", entry("b", "dtype", "BF17"), "unknown dtype 'BF17'"),
        ("negative-shape", entry("b", "shape", [-4]), "shape must be a list of non-negative integers, found [-4]"),
        ("non-integer-shape", entry("b", "shape", [4.0]), "shape must be a list of non-negative integers, found [4.0]"),
        ("key-in-two-shards", header(S2, lambda h: {**{k: v for k, v in h.items() if k != "c"}, "a": {**h["c"], "shape": [3, 2]}}),
         "key is also stored in"),
        ("index-lists-missing-key", lambda r: _edit_index(r, lambda i: i["weight_map"].update(z=S2)), "listed in the index are in no shard header"),
        ("header-key-not-in-index", lambda r: _edit_index(r, lambda i: i["weight_map"].pop("c")), "does not list it"),
        ("index-disagrees-on-shard", lambda r: _edit_index(r, lambda i: i["weight_map"].update(c=S1)), "places it in"),
        ("total-size-wrong", lambda r: _edit_index(r, lambda i: i["metadata"].update(total_size=37)), "metadata.total_size is 37 but the shards hold 40"),
        ("shard-dotdot", lambda r: _edit_index(r, lambda i: i["weight_map"].update(c="../x")), "is not a plain file name"),
        ("shard-absolute", lambda r: _edit_index(r, lambda i: i["weight_map"].update(c="/etc/passwd")), "is not a plain file name"),
        ("shard-separator", lambda r: _edit_index(r, lambda i: i["weight_map"].update(c="a/b")), "is not a plain file name"),
        ("shard-missing", lambda r: (r / S2).unlink(), "shard listed in model.safetensors.index.json is missing"),
        ("index-not-json", lambda r: (r / INDEX_NAME).write_text("{"), "index is not valid JSON"),
    ]


@pytest.mark.parametrize("case_id,corrupt,expected", corrupt_cases(), ids=[c[0] for c in corrupt_cases()])
def test_malformed_snapshot_is_refused_naming_the_file(tmp_path, case_id, corrupt, expected):
    root = _small_snapshot(tmp_path / "snap")
    corrupt(root)
    with pytest.raises(CheckpointError) as err:
        Checkpoint(root)
    message = str(err.value)
    assert expected in message
    assert str(root) in message  # names the file


def test_symlink_escaping_the_hf_cache_is_refused(tmp_path):
    repo = tmp_path / "models--x--y"
    snap = _small_snapshot(repo / "snapshots" / "rev")
    (repo / "blobs").mkdir()
    outside = tmp_path / "elsewhere.safetensors"
    (snap / S2).rename(outside)
    (snap / S2).symlink_to(outside)
    with pytest.raises(CheckpointError, match="outside the HF cache blobs folder"):
        Checkpoint(snap)


def test_resolving_an_absent_version_names_the_download_command(tmp_path):
    from pipeline.inputs.snapshot import resolve_snapshot

    with pytest.raises(CheckpointError) as err:
        resolve_snapshot(load_config("n16"), hf_cache=tmp_path)
    assert "hf download nvidia/GR00T-N1.6-3B --revision d0814e7ecb19202e7c8468b46098b0b7ef3a6d61" in str(err.value)
