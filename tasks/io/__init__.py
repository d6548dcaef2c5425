"""Bytes in and out, and nothing about what they mean.

- `file_blocks.py`: reading a byte range, or a whole file block by block, from a local file or an object store.
- `bulk_write.py`: writing big files past the page cache (O_DIRECT), atomically or in place, and writes handed off.
- `network.py`: every request to an object store through a network that fails: faults, retries, stalls.
"""
