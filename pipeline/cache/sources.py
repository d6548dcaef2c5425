"""The source-hash memo: a shard without an HF blob name is hashed once and remembered by its path, size, mtime
and inode under `sources/`, so the next convert of the same folder names its entry without reading it."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from tasks import source
from tasks.bulk_write import write_json_atomic
from tasks.checkpoint import Checkpoint


def _stat_key(path: Path) -> dict:
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}


def source_sha256(root: Path, ck: Checkpoint) -> tuple[dict[str, str], dict[str, source.VerifiedShard]]:
    """Content identity per shard: the HF blob name when there is one, else a remembered hash of this exact file
    (path, size, mtime, inode), else hashed now and remembered. A shard hashed now gets its sha256 and every
    tensor's xxh3 at once, on every core (tasks/source.py: hash_shards); those are returned too, verified (the
    graph and reuse take them as they are: a fresh folder is not hashed twice)."""
    out, todo = {}, []
    for shard in sorted(ck.headers):
        named = ck.blob_sha256(shard)
        if named:
            out[shard] = named
            continue
        stat = _stat_key(ck.shard_path(shard))
        record = root / "sources" / (hashlib.sha256(stat["path"].encode()).hexdigest()[:32] + ".json")
        try:
            known = json.loads(record.read_text())
            if known["stat"] == stat:
                out[shard] = known["sha256"]
                continue
        except (OSError, ValueError, KeyError):
            pass
        todo.append((shard, stat, record))
    hashed = dict(zip((t[0] for t in todo), source.hash_shards([ck.headers[t[0]] for t in todo], os.cpu_count() or 1)))
    for shard, stat, record in todo:
        out[shard] = hashed[shard].sha256
        write_json_atomic(record, {"stat": stat, "sha256": out[shard]})
    return out, hashed


