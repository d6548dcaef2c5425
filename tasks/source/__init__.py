"""The checkpoint being converted.

- `safetensors_file.py`: the safetensors format in one place: parse and check a header, frame a file, read ranges.
- `shards.py`: the graph's tasks on one shard: index it, verify its bytes, read a tensor or one embodiment slot.
- `checkpoint.py`: a lazy view of a whole checkpoint (sharded snapshot, folder or file), key by key.
"""

from tasks.old_paths import names_moved

# 0.2.0's module `tasks.source` is this room now: its names, from where they live (deprecated, CHANGELOG.md)
_SHARDS = (
    "VerifiedShard", "index_shard", "hash_shard", "PIECE", "identify_shards", "CONTENT_ID",
    "CHECKED_BY_SHA256", "CHECKED_BY_CONTENT", "checked_against", "content_identity", "verify_shard",
    "read_rows", "read_tensor", "read_slot", "read_weight", "read_weight_slot",
)
__getattr__ = names_moved("tasks.source", {**dict.fromkeys(_SHARDS, "tasks.source.shards"), "HostTable": "tasks.plan"})
