"""Cache entries and refs written by hand, as cache/README.md lays them out, for the contract suites of the entry
format (test_entry.py) and of the cache's policies (test_selection.py, test_leases.py, test_housekeeping.py): no
convert runs, so each suite states exactly what is on disk before the policy acts on it."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import xxhash

from tasks.entries import names as fmt

from tests.conftest import ROOT
NAME = "n16-tt-n16-port-" + "ab" * 10
FINGERPRINT = "ab" * 10 + "0" * 44
DEVICE_BYTES = b"device bytes"


def _xxh3(data: bytes) -> str:
    return xxhash.xxh3_64_hexdigest(data)


def _put(path: Path, data: bytes, link_from: Path | None) -> None:
    """Write `data` at `path`, or hard-link the same file of another entry (as reuse shares bytes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if link_from is not None and link_from.is_file():
        os.link(link_from, path)
    else:
        path.write_bytes(data)


def write_entry(root: Path, name: str = NAME, *, slots=(4, 7), link_from: str | None = None, **overrides) -> dict:
    """A two-array entry: a whole target `t` [2, 3] and a bank `b` [32, 2, 2] holding `slots`, each chunk raw
    little-endian uint16; `t` also keeps a device file. `link_from` names an entry whose files with the same path
    are hard-linked rather than written. `overrides` replace manifest fields. Returns the manifest."""
    entry = root / "entries" / name
    other = root / "entries" / link_from if link_from else None
    whole = np.arange(6, dtype="<u2").reshape(2, 3)
    banked = {s: np.full((1, 2, 2), 100 + s, dtype="<u2") for s in slots}
    for rel, data in [("t/c.0.0", whole.tobytes()), ("tensorbin/t.tensorbin", DEVICE_BYTES),
                      *((f"b/c.{s}.0.0", d.tobytes()) for s, d in banked.items())]:
        _put(entry / rel, data, other / rel if other else None)

    def attrs(logical, bank):
        return {"logical_shape": logical, "embodiment_bank": bank, "device_dtype": "bfloat16", "device_layout": "TILE",
                "host_only": False, "sources": ["k"], "transform": "identity", "dtype": "bfloat16"}
    manifest = {
        "fingerprint": FINGERPRINT, "cache_format": fmt.CACHE_FORMAT, "converter": "1", "version": "n16",
        "revision": None, "synthetic": None, "layout": "tt-n16", "profile": "port", "shards": {"s": "0" * 64},
        "recipes_sha256": "0" * 64, "slots": list(slots), "source": {}, "source_shapes": {"k": [2, 3]},
        "published_unix": 1.0,
        "arrays": {
            "t": {"shape": [2, 3], "chunk_shape": [2, 3], "attributes": attrs([2, 3], False), "source_xxh3": {"k": "1"},
                  "content_id": "c", "chunks": {"all": {"nbytes": 12, "xxh3": _xxh3(whole.tobytes()), "max_abs_err": 0.0,
                                                        "pcc": 1.0, "tensorbin": {"nbytes": 12, "xxh3": _xxh3(DEVICE_BYTES)}}}},
            "b": {"shape": [32, 2, 2], "chunk_shape": [1, 2, 2], "attributes": attrs([2, 2], True),
                  "source_xxh3": {"k": "1"}, "content_id": "d",
                  "chunks": {str(s): {"nbytes": 8, "xxh3": _xxh3(d.tobytes()), "max_abs_err": 0.0, "pcc": 1.0}
                             for s, d in banked.items()}}},
        "bytes": 12 + 8 * len(banked), "chunks": 1 + len(banked), **overrides}
    (entry / "MANIFEST.json").write_text(json.dumps(manifest))
    return manifest


def entry_of(root: Path, tag: str, *, version: str = "n16", layout: str = "tt-n16", profile: str = "port",
             age_days: float = 0.0, **fields) -> str:
    """A sound published entry of this kind, named by content as the converter names one (its fingerprint: the
    sha256 of `tag`), published `age_days` ago; `fields` go to `write_entry`. Returns its name."""
    fingerprint = hashlib.sha256(tag.encode()).hexdigest()
    name = f"{version}-{layout}-{profile}-{fingerprint[:20]}"
    write_entry(root, name, fingerprint=fingerprint, version=version, layout=layout, profile=profile,
                published_unix=time.time() - age_days * 86400, **fields)
    return name


def ref_to(root: Path, name: str, *, synthetic: bool = False) -> Path:
    """`refs/<version>-<layout>-<profile>[.synthetic].json` naming entry `name` (its kind read off the name)."""
    ref = root / "refs" / f"{name.rsplit('-', 1)[0]}{'.synthetic' if synthetic else ''}.json"
    ref.parent.mkdir(parents=True, exist_ok=True)
    ref.write_text(json.dumps({"entry": name, "updated_unix": time.time()}))
    return ref


def file_bytes(path: Path) -> int:
    """Bytes of the files under `path`, each inode once (GNU find, an independent count)."""
    out = subprocess.run(["find", str(path), "-type", "f", "-printf", "%i %s\n"], capture_output=True, text=True,
                         check=True).stdout
    return sum(int(size) for size in dict(line.split() for line in out.splitlines()).values())


def holding(root: Path, name: str) -> subprocess.Popen:
    """Another process that reads entry `name` (holds its lease) until killed."""
    holder = subprocess.Popen([sys.executable, "-c", f"""
import time
from pipeline import cache
with cache.reading(cache.cache_store({str(root)!r}), {name!r}):
    print("holding", flush=True)
    time.sleep(120)
"""], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "holding"
    return holder
