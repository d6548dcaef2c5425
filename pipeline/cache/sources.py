"""The source-identity memo: a shard without an HF blob name is identified once (its tensors' xxh3) and remembered
by its path, size, mtime and inode (an object in a store: its URL, size, ETag and time) under `sources/`, so the
next convert of the same folder names its entry without reading it."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from tasks.source import shards
from tasks.entries.names import SOURCES
from tasks.io.bulk_write import write_json_atomic
from tasks.source.checkpoint import Checkpoint
from tasks.io.file_blocks import is_remote


def _stat_key(path: Path) -> dict:
    if is_remote(path):  # an object: its ETag changes with its bytes (S3 keeps whole seconds, and no inode)
        info = path.fs.info(path.path)
        return {"path": str(path), "size": info["size"], "etag": info.get("ETag"),
                "modified": str(info.get("LastModified"))}
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}


def source_identity(root: Path, ck: Checkpoint) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """Content identity per shard, what the entry is named by: the HF blob name's sha256 when there is one; else
    the shard's content identity (its tensors' xxh3-128: tasks/source/shards.py `content_identity`), remembered for this
    exact file (path, size, mtime, inode), else taken now, at memory speed, and remembered. The sha256 of such a
    shard is taken by the graph's verify task, beside the conversion, and recorded in the manifest. Returns the
    identities, and the tensor hashes of the shards identified now (reuse takes them: read once)."""
    out, todo = {}, []
    for shard in sorted(ck.headers):
        named = ck.blob_sha256(shard)
        if named:
            out[shard] = named
            continue
        stat = _stat_key(ck.shard_path(shard))
        record = root / SOURCES / (hashlib.sha256(stat["path"].encode()).hexdigest()[:32] + ".json")
        try:
            known = json.loads(record.read_text())
            if known["stat"] == stat and known["content"].startswith(shards.CONTENT_ID):
                out[shard] = known["content"]
                continue
        except (OSError, ValueError, KeyError, AttributeError):  # none, unreadable, or of an older converter
            pass
        todo.append((shard, stat, record))
    found = shards.identify_shards([ck.headers[t[0]] for t in todo], os.cpu_count() or 1)
    tensors = {shard: hashes for (shard, _, _), hashes in zip(todo, found)}
    for shard, stat, record in todo:
        out[shard] = shards.content_identity(ck.headers[shard], tensors[shard])
        write_json_atomic(record, {"stat": stat, "content": out[shard]})
    return out, tensors
