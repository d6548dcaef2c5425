"""Reading a whole file block by block, for the passes that hash every byte, two ways, each where it wins.

`each_block` maps the file: a shard's sha256 and per-tensor xxh3 in a convert. On this project's 2-core VM, page
cache warm, xxh3 over a 3.16 GB shard took 1.03-2.38 s by `readinto` into a reused 16 MiB buffer (the copy out of
the page cache is the cost) and 0.69-0.74 s mapped; both hashes of a full N1.6's shards, two threads: 4.1-4.3 s
(1.0-1.2 sys-s) mapped, 4.4-4.9 s (2.3-2.5 sys-s) read. Each block is populated before it is read
(MADV_POPULATE_READ), so a file cut short meanwhile is an OSError there rather than a SIGBUS on access, and unmapped
after (MADV_DONTNEED: the page cache keeps the pages), so a pass over a 6 GB shard adds no RSS. Where the kernel has
no MADV_POPULATE_READ (before Linux 5.14), or for a file that cannot be mapped, blocks are read instead.

`each_read` reads into one 4 MiB buffer per thread: checking a cache entry's files against their records on a
pool of threads (a reload). Mapping, populating and unmapping take the process's address-space lock, so threads
that map many files wait for each other, and for ttnn mapping the files it loads: the 953 device files and the
float32 table of a one-embodiment N1.6 reload (5.1 GB) took 0.42-0.48 s read and hashed on two threads, 0.82-1.06 s
mapped on two or four. A 4 MiB buffer stays in the cache between the copy and the hash; 16 MiB did not.
"""

from __future__ import annotations

import errno
import mmap
import os
import threading
from pathlib import Path
from typing import Callable

BLOCK = 16 << 20
MADV_POPULATE_READ = 22  # <linux/mman.h>; Python's mmap module does not name it
_local = threading.local()
_mapping_works = True    # False once the kernel refused MADV_POPULATE_READ


def each_block(path: Path | str, consume: Callable[[memoryview, int], None], block: int = BLOCK) -> int:
    """`consume(bytes, offset)` for each block of the file in order; returns the file's size. A view is valid only
    during its call. Raises OSError if the file cannot be read (or shrinks while it is read)."""
    global _mapping_works
    with open(path, "rb", buffering=0) as fh:
        size = os.fstat(fh.fileno()).st_size
        if _mapping_works and size:
            try:
                # private (copy-on-write) rather than read-only: nothing writes, and a consumer such as
                # torch.frombuffer takes the blocks without warning about read-only memory
                mapping = mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_COPY)
            except (OSError, ValueError):  # a pipe, a special file: read it instead
                mapping = None
            if mapping is not None:
                try:
                    if _mapped(mapping, size, consume, block):
                        return size
                    _mapping_works = False  # an older kernel: read every file instead from now on
                finally:
                    mapping.close()
        return _read(fh, consume, block)


def _mapped(mapping: mmap.mmap, size: int, consume: Callable[[memoryview, int], None], block: int) -> bool:
    """False if the kernel has no MADV_POPULATE_READ (found at the first block, before anything is consumed)."""
    with memoryview(mapping) as whole:
        for pos in range(0, size, block):
            n = min(block, size - pos)
            try:
                mapping.madvise(MADV_POPULATE_READ, pos, n)
            except OSError as e:
                if e.errno == errno.EINVAL and pos == 0:
                    return False
                raise OSError(e.errno, f"{e.strerror} at offset {pos} of {size} bytes (did the file change "
                                       "while it was read?)") from e
            with whole[pos:pos + n] as view:
                consume(view, pos)
            mapping.madvise(mmap.MADV_DONTNEED, pos, n)
    return True


READ_BLOCK = 4 << 20


def each_read(path: Path | str, consume: Callable[[memoryview, int], None]) -> int:
    """`consume(bytes, offset)` for each block of the file in order, read into this thread's buffer; returns the
    file's size. A view is valid only during its call, and every block but the last is whole (a short read is
    read on), so a consumer that widens values never sees one cut in two. Raises OSError if the file cannot be
    read, or shrinks while it is read."""
    with open(path, "rb", buffering=0) as fh:
        return _read(fh, consume, READ_BLOCK)


def _read(fh, consume: Callable[[memoryview, int], None], block: int) -> int:
    buffer = getattr(_local, "buffer", None)
    if buffer is None or len(buffer) != block:
        buffer = _local.buffer = memoryview(bytearray(block))
    size, pos = os.fstat(fh.fileno()).st_size, 0
    while n := _fill(fh, buffer):
        with buffer[:n] as view:
            consume(view, pos)
        pos += n
    if pos < size:
        raise OSError(f"read {pos} of {size} bytes (did the file change while it was read?)")
    return pos


def _fill(fh, buffer: memoryview) -> int:
    """Read until the buffer is full or the file ends."""
    n = 0
    while n < len(buffer) and (got := fh.readinto(buffer[n:])):
        n += got
    return n
