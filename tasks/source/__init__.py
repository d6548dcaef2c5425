"""The checkpoint being converted.

- `safetensors_file.py`: the safetensors format in one place: parse and check a header, frame a file, read ranges.
- `shards.py`: the graph's tasks on one shard: index it, verify its bytes, read a tensor or one embodiment slot.
- `checkpoint.py`: a lazy view of a whole checkpoint (sharded snapshot, folder or file), key by key.
"""
