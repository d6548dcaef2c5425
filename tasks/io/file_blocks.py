"""Reading files: a byte range into a caller's buffer (`read_into`, `open_at`), or a whole file block by block for
the passes that hash or convert every byte (`each_block`, `each_read`). A checkpoint may also be in an object store
(`--snapshot s3://bucket/prefix`): `source_path` makes such a URL a path (universal_pathlib's UPath over fsspec),
and `open_at` / `each_block` / `open_binary` read it by ranged GETs, so a worker reads only its own tasks' byte ranges,
each retried through a network that fails (tasks/io/network.py).

`each_block` reads a local file in blocks, two ways, each where it wins.

`each_block` maps the file: a shard's sha256 and per-tensor xxh3 in a convert, and a converted source's values
(F32 or F16 rounded to bf16, bf16 widened) where the page cache holds them. On this project's 2-core VM, page
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
import io
import mmap
import os
import threading
from pathlib import Path
from typing import Callable

import numpy as np

from tasks.errors import CheckpointError
from tasks.io.network import (NetworkError, ShortBody, s3fs_options, shared_s3_client, stall_seconds, with_field,
                              with_retries)

BLOCK = 16 << 20
MADV_POPULATE_READ = 22  # <linux/mman.h>; Python's mmap module does not name it
_local = threading.local()
_mapping_works = True    # False once the kernel refused MADV_POPULATE_READ


def is_remote(path: object) -> bool:
    """A path into an object store (a UPath of `source_path`), not a file on this machine."""
    return getattr(path, "protocol", "") not in ("", "file", "local")


def is_url(where: object) -> bool:
    """A place given as a URL (`s3://bucket/prefix`), not a path: a cache root or a checkpoint in an object store."""
    return isinstance(where, str) and "://" in where


def source_path(where: str | os.PathLike, stall: float | None = None) -> Path:
    """A checkpoint's place as a path: a local one, or for a URL (`s3://bucket/prefix`) a UPath, which answers
    `/`, `glob`, `is_file`, `read_text`, `stat` and `open` through fsspec as a local path does, and carries the
    stall limit (`stall`; None: the default) to every read through it, on whichever worker it runs."""
    if is_url(where):
        from upath import UPath  # lazy: only sources in an object store need it

        scheme, _, place = where.partition("://")
        if not place.strip("/"):
            raise CheckpointError(where, f"names no bucket; pass {scheme}://BUCKET/PREFIX, the folder the trainer "
                                         "saved the model in")
        return UPath(where, **(s3fs_options(stall) if scheme in ("s3", "s3a") else {}))
    return where if is_remote(where) else Path(where)


def read_whole(path: Path | str) -> bytes:
    """A small file's bytes (an index, a trainer's config): of a file in an object store, read as its shards are
    (`_RemoteFile`: retried, and never taken short)."""
    if not is_remote(path):
        return Path(path).read_bytes()
    with open_binary(path) as fh:
        return fh.read()


def file_size(path: Path | str) -> int:
    """A file's size; of one in an object store, asked as its shards' are (`_RemoteFile.size`)."""
    return _RemoteFile(path).size() if is_remote(path) else os.stat(path).st_size


def open_binary(path: Path | str):
    """The file for reading from its start (a stream that seeks): a local file, or an object in a store read by
    ranged GETs, each retried through a network that fails (`_RemoteFile`)."""
    return io.BufferedReader(_RemoteStream(path), 8 << 20) if is_remote(path) else open(path, "rb")


_PREADV_MAX = 0x7FFFF000  # Linux caps one read at this many bytes


def read_into(fd: int, offset: int, out: np.ndarray, path: Path | str = "?") -> None:
    """Fill `out` (C-contiguous) with the bytes at `offset` of the open file `fd` (named `path` in errors)."""
    view = memoryview(out.reshape(-1).view(np.uint8))
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:done + _PREADV_MAX]], offset + done)
        if n == 0:
            raise CheckpointError(path, f"file ended after {done} of {len(view)} bytes at offset {offset}: truncated")
        done += n


class _LocalFile:
    def __init__(self, path: Path | str):
        self.path, self.fd = path, os.open(path, os.O_RDONLY)

    def read_into(self, offset: int, out: np.ndarray) -> None:
        read_into(self.fd, offset, out, self.path)

    def close(self) -> None:
        os.close(self.fd)


class _RemoteFile:
    """An object read by byte range: one ranged GET per read, straight from the store. Each read goes through
    tasks/io/network.py `with_retries`: a cut connection, a timeout or a throttled store is read again, and said in
    one sentence when it outlasts the retries; an object that holds fewer bytes than asked is a truncated file.
    On S3 the bytes go through boto3's client (its timeouts, no retries of its own), from the socket into `out`."""
    def __init__(self, path):
        self.path = path
        self.s3 = path.protocol in ("s3", "s3a") or "s3" in getattr(path.fs, "protocol", ())
        self.bucket, _, self.key = str(path.path).partition("/")
        # the stall limit the path was made with (`source_path`): the client's, on every worker
        self.stall = getattr(path, "storage_options", {}).get("config_kwargs", {}).get("read_timeout") or stall_seconds()

    def size(self) -> int:
        def head() -> int:
            if self.s3:
                response = shared_s3_client(self.stall).head_object(Bucket=self.bucket, Key=self.key)
                return int(with_field(response, "ContentLength", "a HEAD")["ContentLength"])
            return int(self.path.fs.size(self.path.path))
        return self._retried(head)

    def read_into(self, offset: int, out: np.ndarray) -> None:
        view = memoryview(out.reshape(-1).view(np.uint8))
        if len(view):
            self._retried(lambda: self._read(offset, view))

    def _read(self, offset: int, view: memoryview) -> None:
        end = offset + len(view)
        if self.s3:
            try:
                response = shared_s3_client(self.stall).get_object(Bucket=self.bucket, Key=self.key,
                                                                       Range=f"bytes={offset}-{end - 1}")
            except Exception as e:
                if "InvalidRange" not in str(e):
                    raise
                self._truncated(0, view, offset)
            if with_field(response, "ContentLength", "a ranged GET")["ContentLength"] < len(view):
                self._truncated(response["ContentLength"], view, offset)
            with response["Body"] as body:
                filled = read_full(body, view)
            if filled < len(view):
                raise ShortBody(f"the response ended after {filled} of {len(view)} bytes")
            return
        data = self.path.fs.cat_file(self.path.path, start=offset, end=end)
        if len(data) != len(view):
            self._truncated(len(data), view, offset)
        view[:] = data

    def _truncated(self, got: int, view: memoryview, offset: int):
        raise CheckpointError(self.path, f"object ended after {got} of {len(view)} bytes at offset {offset}: truncated")

    def _retried(self, call):
        try:
            return with_retries(str(self.path), call, stall=self.stall)
        except (CheckpointError, NetworkError):
            raise
        except OSError as e:
            said = f"could not be read ({e})"
        except Exception as e:
            if type(e).__name__ not in ("ClientError", "NoCredentialsError"):
                raise
            said = f"could not be read ({e})"
        raise CheckpointError(self.path, f"{said}; check the object store and its credentials (AWS_ENDPOINT_URL, "
                                         "AWS_ACCESS_KEY_ID)")

    def close(self) -> None:
        pass


class _RemoteStream(io.RawIOBase):
    """An object in a store as a file that seeks, read by ranged GETs (`_RemoteFile`): a header, a digest."""
    def __init__(self, path):
        self.file, self.pos, self.end = _RemoteFile(path), 0, None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def _size(self) -> int:
        if self.end is None:
            self.end = self.file.size()
        return self.end

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self.pos, os.SEEK_END: None}[whence]
        self.pos = (self._size() if base is None else base) + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, buffer) -> int:
        want = max(0, min(len(buffer), self._size() - self.pos))
        self.file.read_into(self.pos, np.frombuffer(buffer, np.uint8, want) if want else np.empty(0, np.uint8))
        self.pos += want
        return want


class open_at:
    """`with open_at(path) as f: f.read_into(offset, out)`: byte ranges of a local file (one descriptor, `preadv`)
    or of an object in a store (ranged GETs)."""
    def __init__(self, path: Path | str):
        self.file = _RemoteFile(path) if is_remote(path) else _LocalFile(path)

    def __enter__(self):
        return self.file

    def __exit__(self, *exc) -> None:
        self.file.close()


def each_block(path: Path | str, consume: Callable[[memoryview, int], None], block: int = BLOCK,
               span: tuple[int, int] | None = None) -> int:
    """`consume(bytes, offset)` for each block of the file in order; returns the file's size (with `span`, the
    span's end). A view is valid only during its call. Raises OSError if the file cannot be read (or shrinks while
    it is read). An object in a store is read by one ranged GET a block (each retried: tasks/io/network.py). `span` (start, end): only those bytes, in blocks
    from `start` (so a consumer that takes values of a size dividing `block` never sees one cut in two)."""
    global _mapping_works
    if is_remote(path):
        if span is not None:
            return _ranged(path, span[0], span[1], consume, block)
        return _ranged(path, 0, _RemoteFile(path).size(), consume, block)
    with open(path, "rb", buffering=0) as fh:
        size = os.fstat(fh.fileno()).st_size
        start, end = span or (0, None)
        if _mapping_works and size:
            try:
                # private (copy-on-write) rather than read-only: nothing writes, and a consumer such as
                # torch.frombuffer takes the blocks without warning about read-only memory
                mapping = mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_COPY)
            except (OSError, ValueError):  # a pipe, a special file: read it instead
                mapping = None
            if mapping is not None:
                try:
                    last = size if end is None else end
                    if last > size:
                        raise OSError(f"{last} bytes asked for of a file of {size} (did the file change while it "
                                      "was read?)")
                    if _mapped(mapping, start, last, consume, block):
                        return last
                    _mapping_works = False  # an older kernel: read every file instead from now on
                finally:
                    _close(mapping)
        fh.seek(start)
        return _read(fh, consume, block, size, start, end)


def _ranged(path, start: int, end: int, consume: Callable[[memoryview, int], None], block: int) -> int:
    """The span of an object in a store, one ranged GET a block into one buffer; returns the span's end."""
    buffer = np.empty(min(block, max(end - start, 0)), np.uint8)
    with open_at(path) as fh:
        for pos in range(start, end, block):
            view = buffer[:min(block, end - pos)]
            fh.read_into(pos, view)
            consume(memoryview(view), pos)
    return end


def _mapped(mapping: mmap.mmap, start: int, end: int, consume: Callable[[memoryview, int], None],
            block: int) -> bool:
    """False if the kernel has no MADV_POPULATE_READ (found at the first block, before anything is consumed).
    Blocks start at `start`; what is populated and dropped starts at the page that holds them."""
    whole = memoryview(mapping)
    for pos in range(start, end, block):
        n = min(block, end - pos)
        page = pos - pos % mmap.PAGESIZE
        try:
            mapping.madvise(MADV_POPULATE_READ, page, pos + n - page)
        except OSError as e:
            if e.errno == errno.EINVAL and pos == start:
                return False
            raise OSError(e.errno, f"{e.strerror} at offset {pos} of {len(mapping)} bytes (did the file "
                                   "change while it was read?)") from e
        consume(whole[pos:pos + n], pos)
        mapping.madvise(mmap.MADV_DONTNEED, page, pos + n - page)
    return True


def _close(mapping: mmap.mmap) -> None:
    """Unmap now, or, while a view of it is still referenced, when the last one goes: a consumer's array can
    outlive its call in a frame that is kept (a traceback, or a Dask worker's profiler sampling the thread), and
    closing would raise BufferError over whatever was being said. Views are never released by hand for that
    reason; a view kept is still valid memory."""
    try:
        mapping.close()
    except BufferError:
        pass


READ_BLOCK = 4 << 20


def each_read(path: Path | str, consume: Callable[[memoryview, int], None], end: int | None = None) -> int:
    """`consume(bytes, offset)` for each block of the file in order (up to byte `end` when given), read into this
    thread's buffer; returns the file's size (or `end`). A view is valid only during its call, and every block but
    the last is whole (a short read is read on), so a consumer that widens values never sees one cut in two.
    Raises OSError if the file cannot be read, or shrinks while it is read."""
    with open(path, "rb", buffering=0) as fh:
        return _read(fh, consume, READ_BLOCK, end=end)


def _read(fh, consume: Callable[[memoryview, int], None], block: int, size: int | None = None, start: int = 0,
          end: int | None = None) -> int:
    """The bytes from `start` (where `fh` stands) to `end`, or to the end of the file (a pipe's too: its size says
    nothing), block by block; returns the bytes read to the end, or the span's end."""
    buffer = getattr(_local, "buffer", None)
    if buffer is None or len(buffer) != block:
        buffer = _local.buffer = memoryview(bytearray(block))
    size, pos = os.fstat(fh.fileno()).st_size if size is None else size, start
    while (want := block if end is None else min(block, end - pos)) > 0 and (n := read_full(fh, buffer[:want])):
        with buffer[:n] as view:
            consume(view, pos)
        pos += n
    if pos < (size if end is None else end):
        raise OSError(f"read {pos} of {size} bytes (did the file change while it was read?)")
    return pos if end is None else end


def read_full(fh, buffer: memoryview) -> int:
    """Read until the buffer is full or the stream ends (any object with `readinto`); the bytes read."""
    n = 0
    while n < len(buffer) and (got := fh.readinto(buffer[n:])):
        n += got
    return n
