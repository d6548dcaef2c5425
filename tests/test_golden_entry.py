"""The cache format, pinned: a tiny entry's manifest and one chunk of each kind must equal a copy committed in
tests/golden/ (written by the converter of 2026-11-30 before the entry code was restructured, and written again
for cache format 3 — chunk keys `c.0.0` instead of `c/0/0` — with nothing else changed but PCC digits; and for
format 4, whose manifest records every checkpoint key's shape, `source_shapes`, for the port hand-off; for
converter 3, which stores host tables as the float32 the port keeps; and for format 7, whose TILE targets with a
device file are one tiled file each, `.tensorbin` and Zarr chunk at once: tasks/device/one_file.py).

What legitimately varies between runs is normalized first: the publish time, the snapshot folder, the
fingerprint and the recipes hash (the last two change whenever configs/recipes.toml does). A deliberate format
change regenerates the copy with `GOLDEN_UPDATE=1 pytest tests/test_golden_entry.py` (which then fails, having
compared nothing) and says so in the commit.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pipeline.jobs.convert import ConvertOptions, convert

GOLDEN = Path(__file__).resolve().parent / "golden" / "n16-tt-n16-port-gr1"
# One array of each kind: a whole bf16 TILE matrix, a bank slot (bf16, transposed never), a bfloat8_b matrix (its
# `.tensorbin` and its lossless bf16 in one file), a host-only float32 norm, and a fused, head-padded projection.
TILES = "0.0.0.0.0.0"  # a tiled chunk's coordinates: [H/32, 2, 16, W/32, 2, 16]
PINNED = {
    "bank slot": ("action_encoder.W1.W", f"c.20.{TILES}"),
    "whole bf16": ("language.model.layers.0.self_attn.q_proj.weight", f"c.{TILES}"),
    "bfloat8_b": ("dit.transformer_blocks.0.ff.net.0.proj.weight", f"c.{TILES}"),
    "host only": ("language.model.layers.0.self_attn.q_norm.weight", "c.0"),
    "fused, padded": ("vision.encoder.layers.0.self_attn.qkv_padded.weight", f"c.{TILES}"),
}
VARYING = {"published_unix": 0, "fingerprint": "<fingerprint>", "recipes_sha256": "<recipes sha256>"}


def _normalized_manifest(doc: dict) -> dict:
    doc = {k: VARYING.get(k, v) for k, v in doc.items()}
    doc["source"] = {**doc["source"], "snapshot": "<snapshot>"}
    doc["arrays"] = {name: doc["arrays"][name] for name, _ in PINNED.values()}
    return doc


def _entry_files(entry: Path) -> dict[str, bytes]:
    manifest = json.loads((entry / "MANIFEST.json").read_text())
    files = {"MANIFEST.json": (json.dumps(_normalized_manifest(manifest), indent=1) + "\n").encode()}
    for name, chunk in PINNED.values():
        files[f"{name}/zarr.json"] = (entry / name / "zarr.json").read_bytes()
        files[f"{name}/{chunk}"] = (entry / name / chunk).read_bytes()
        slot = chunk.split(".")[1] if manifest["arrays"][name]["attributes"]["embodiment_bank"] else None
        packed = entry / "tensorbin" / (name + (f"@{slot}" if slot else "") + ".tensorbin")
        if packed.exists():
            files[f"tensorbin/{packed.name}"] = packed.read_bytes()
    return files


def test_a_tiny_entry_is_byte_for_byte_the_golden_copy(hf_cache, cache_root):
    summary = convert(ConvertOptions("n16", hf_cache=hf_cache, synthetic="tiny", cache_root=cache_root,
                                     embodiments="gr1", layout="tt-n16", profile="port", progress=False))
    files = _entry_files(Path(summary["cache_path"]))
    arrays = json.loads(files["MANIFEST.json"])["arrays"]
    assert [arrays[name]["attributes"].get("tiled", False) for name, _ in PINNED.values()] == \
        [True, True, True, False, True], "every pinned device target is one tiled file, the host table a plain chunk"
    assert not any(k.startswith("tensorbin/") for k in files), "a tiled target keeps no device file beside its chunk"
    if os.environ.get("GOLDEN_UPDATE"):  # writes the copy, and fails: a run that rewrites it proves nothing
        for rel, data in files.items():
            (GOLDEN / rel).parent.mkdir(parents=True, exist_ok=True)
            (GOLDEN / rel).write_bytes(data)
        pytest.fail(f"GOLDEN_UPDATE=1: tests/golden/{GOLDEN.name} rewritten from this run ({len(files)} files); "
                    "review `git diff tests/golden`, commit it with the format change, and run again without it")
    golden = {str(p.relative_to(GOLDEN)): p.read_bytes() for p in sorted(GOLDEN.rglob("*")) if p.is_file()}
    assert sorted(files) == sorted(golden)
    # A PCC is a measurement, not format: summed in float64 (the C kernel) or float32 blocks (numpy), it moves in
    # the 7th digit. It must agree to 1e-6; everything else byte for byte.
    got_pcc, want_pcc = _pccs(files), _pccs(golden)
    assert got_pcc.keys() == want_pcc.keys() and all(abs(got_pcc[k] - want_pcc[k]) <= 1e-6 for k in got_pcc)
    files["MANIFEST.json"], golden["MANIFEST.json"] = _without_pcc(files), _without_pcc(golden)
    for rel in golden:
        assert files[rel] == golden[rel], f"{rel} differs from tests/golden/{GOLDEN.name}/{rel}"


def _pccs(files: dict[str, bytes]) -> dict[tuple[str, str], float]:
    arrays = json.loads(files["MANIFEST.json"])["arrays"]
    return {(name, chunk): rec["pcc"] for name, arr in arrays.items() for chunk, rec in arr["chunks"].items()}


def _without_pcc(files: dict[str, bytes]) -> bytes:
    doc = json.loads(files["MANIFEST.json"])
    for arr in doc["arrays"].values():
        for rec in arr["chunks"].values():
            rec["pcc"] = "<pcc>"
    return json.dumps(doc, indent=1).encode()
