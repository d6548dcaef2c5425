"""Blackhole P150, the N1.6 port's own board: entries do not depend on the architecture. Every profile of a micro
N1.6 (tiny's dims, every kind of target, a tenth of the files) converted under the mock N150 and the mock P150
cluster descriptors gives the same entries, file for file; and ttnn itself, under the P150 descriptor, writes each
of those device files again byte for byte from the values it reads out of them. (The device tests on a simulated
Blackhole: tests/test_blackhole.py.)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

DESCRIPTORS = {"N150": ROOT / "configs" / "tt" / "wormhole_N150.yaml", "P150": ROOT / "configs" / "tt" / "blackhole_P150.yaml"}


CHECK_WITH_TTNN = r"""
import sys
from pathlib import Path
import json
import ttnn
tiled = lambda chunk: json.loads((chunk.parent / "zarr.json").read_text())["attributes"].get("tiled") is True
files = sorted(Path(sys.argv[1]).rglob("*.tensorbin")) + sorted(p for p in Path(sys.argv[1]).rglob("c.*") if tiled(p))
for path in files:
    t = ttnn._ttnn.tensor.load_tensor_flatbuffer(str(path), None)  # what ttnn.load_tensor calls: any file name
    again = ttnn.from_torch(ttnn.to_torch(t), dtype=t.dtype, layout=t.layout)
    out = path.with_name("again.tensorbin")
    ttnn.dump_tensor(str(out), again)
    assert path.read_bytes().startswith(out.read_bytes()), path  # a tiled chunk goes on with its Zarr tail
    out.unlink()
print(f"ttnn wrote the same bytes for {len(files)} device files")
"""


def _host_env(descriptor: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TT_METAL_")}  # no simulator: host conversion
    return {**env, "TT_METAL_MOCK_CLUSTER_DESC_PATH": str(descriptor)}


def _files(root: Path) -> dict[str, bytes]:
    entries = root / "entries"
    return {str(p.relative_to(entries)): p.read_bytes() for p in sorted(entries.rglob("*"))
            if p.is_file() and p.name != "MANIFEST.json" and p.name != "zarr.json"}


def test_entries_are_the_same_under_a_blackhole_descriptor(hf_cache, tmp_path):
    caches = {}
    for board, descriptor in DESCRIPTORS.items():
        caches[board] = tmp_path / board
        for profile in ("port", "bf16", "bfp8"):
            proc = subprocess.run([sys.executable, "-m", "pipeline", "convert", "--version", "n16", "--synthetic", "micro",
                                   "--hf-cache", str(hf_cache), "--cache", str(caches[board]), "--profile", profile,
                                   "--embodiments", "gr1", "--json"], cwd=ROOT, env=_host_env(descriptor),
                                  capture_output=True, text=True, timeout=600)
            assert proc.returncode == 0, proc.stderr[-2000:]
    n150, p150 = _files(caches["N150"]), _files(caches["P150"])
    tiled = [name for name in p150 if name.rsplit("/", 1)[1].count(".") >= 6]  # c.0.0.0.0.0.0, c.<slot>.0.0.0.0.0.0
    assert sorted(n150) == sorted(p150) and len(tiled) > 150  # 95 TILE targets in each of port and bfp8
    differ = [name for name in n150 if n150[name] != p150[name]]
    assert differ == [], differ[:5]
    proc = subprocess.run([sys.executable, "-c", CHECK_WITH_TTNN, str(caches["P150"] / "entries")], cwd=ROOT,
                          env=_host_env(DESCRIPTORS["P150"]), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert re.search(r"ttnn wrote the same bytes for \d{3,} device files", proc.stdout), proc.stdout
