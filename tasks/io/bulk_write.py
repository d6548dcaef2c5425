"""Writing a cache entry's big files (chunks, `.tensorbin`s) past the page cache.

Measured on this project's 2-core VM: buffered writes cost ~1.35 s of kernel time per GB once free memory is used
up (the page cache must take pages back and the VM hands out fresh ones slowly), so a full N1.6 tt-n16 entry's
10.7 GB cost ~14 s of CPU in writes alone. `O_DIRECT` writes go from the process's buffer to the disk: 6 GB in
2.8 s of wall time at 0.13 s of CPU. O_DIRECT wants aligned memory and lengths: arrays made by `aligned_empty`
(the converter's outputs and source reads) go to the disk as they are, anything else through a page-aligned
bounce buffer per thread; the last block is padded and the file cut back to its size. Small files, and
filesystems without O_DIRECT (tmpfs), take the buffered path. Chunks and device files are written in place
inside the entry being built (`write_bytes_in_place`: no reader sees it before the rename that publishes it whole);
every other file is written under a temporary name and renamed into place (`write_bytes_atomic`), so a reader never
sees a torn one.

An O_DIRECT write holds its thread until the disk has the bytes. A converting thread can hand its writes off
(`write_behind`) and go on converting, while writer threads keep the disk busy; whoever publishes the folder
waits for them first (`writes_finished`). A full N1.6 fine-tune's convert after its release, 2 cores, in-process
paired runs: 6.70 and 6.61 s before, 5.43 and 5.00 s after (the disk had been idle a third of the graph's time,
waiting for threads that converted, and the cores for threads that waited on the disk).
"""

from __future__ import annotations

import errno
import functools
import json
import mmap
import os
import threading
import uuid
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Callable

import numpy as np

ALIGN = 4096
DIRECT_MIN = 1 << 20        # below 1 MB the page cache costs less than the bounce copy and the device round trip
BOUNCE = 8 << 20            # per thread: big enough for the disk to stream, small enough to stay in cache
DIRECT_PIECE = 64 << 20     # aligned arrays are written in pieces of this (one call is capped near 2 GB)
WRITERS = 4                 # writes in flight beside the converting threads (the disk streams only with several)
BEHIND_BYTES = 256 << 20    # handed off and not yet written, at most (a larger write goes alone): bounds the RSS
_local = threading.local()
_no_direct: set[int] = set()  # st_dev of filesystems that refused O_DIRECT


def nbytes(shape: tuple[int, ...] | list[int] | int, dtype: object = np.uint16) -> int:
    """The bytes of an array of this shape and dtype (default: 2-byte bf16 bits), in int64 whatever the dims."""
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def aligned_empty(shape: tuple[int, ...] | int, dtype: object, zeros: bool = False) -> np.ndarray:
    """A new array whose data starts on a page boundary, so that writing it skips the bounce copy. (A pool that
    reused freed buffers was measured and dropped: numpy's allocations already reuse memory and ask for huge
    pages, and the pool's mappings cost more faults and RSS — 12.8 s and 1.08 GB against 12.0 s and 0.80 GB.)"""
    dtype, size = np.dtype(dtype), nbytes(shape, dtype)
    raw = (np.zeros if zeros else np.empty)(size + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start:start + size].view(dtype).reshape(shape)


def write_bytes_atomic(path: Path, data: memoryview | bytes, durable: bool = False) -> None:
    """Write to `<path>.<uuid>.partial`, then rename: the final name only ever holds complete bytes.
    `durable` fsyncs before the rename (for the manifest, the one file whose presence means "complete")."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex}.partial")
    try:
        _write(tmp, data, durable)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_bytes_in_place(path: Path, data: memoryview | bytes) -> None:
    """Write `path` under its own name, into a folder that exists. Only for an entry still being built: no reader
    sees it before the rename that publishes the whole entry, and a resumed build checks every file against its
    progress record, so a file a kill tore is written again, never published. Saves a rename, a mkdir and an
    unlink per file (~4,800 per N1.6 port-plan entry)."""
    _write(path, data, durable=False)


def write_made_in_place(path: Path, size: int, make: Callable[[memoryview, int], None]) -> None:
    """Write `path` (`size` bytes, in place as `write_bytes_in_place`) from bytes made block by block:
    `make(view, offset)` fills `view` with the file's bytes at `offset`. The blocks are made in this thread's
    bounce buffer, so a file made from something smaller (a bf16 table widened to float32) is never held whole."""
    dev = path.parent.stat().st_dev
    if size >= DIRECT_MIN and dev not in _no_direct:
        try:
            return _write_made(path, size, make, os.O_DIRECT)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
        _no_direct.add(dev)  # refused O_DIRECT: start over buffered (the file is made again from the start)
    _write_made(path, size, make, 0)


def _write_made(path: Path, size: int, make: Callable[[memoryview, int], None], flags: int) -> None:
    fd = _create(path, flags)
    view = memoryview(_bounce())
    try:
        for pos in range(0, size, BOUNCE):
            n = min(BOUNCE, size - pos)
            make(view[:n], pos)
            padded = -(-n // ALIGN) * ALIGN
            if padded > n:
                view[n:padded] = bytes(padded - n)
            _pwrite_all(fd, view[:padded], pos, path)
        os.ftruncate(fd, size)  # the last block was padded out to the alignment
    finally:
        view.release()
        os.close(fd)


def _write(path: Path, data: memoryview | bytes, durable: bool) -> None:
    """`data` as the new file `path`: large buffers past the page cache, the rest buffered."""
    if not durable and len(data) >= DIRECT_MIN and _write_direct(path, memoryview(data).cast("B")):
        return
    fd = _create(path, 0)
    try:
        view = memoryview(data).cast("B")
        while view:
            view = view[os.write(fd, view):]
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


def _create(path: Path, flags: int) -> int:
    """A new file at `path`. One already there (a killed run's, or a hard link to another entry's chunk, which
    reuse makes) is unlinked, never truncated: truncating would write through the link into a published entry."""
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | flags, 0o644)
    except FileExistsError:
        os.unlink(path)
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | flags, 0o644)


def _pwrite_all(fd: int, data: memoryview, offset: int, path: Path) -> None:
    written = os.pwrite(fd, data, offset)
    if written != len(data):
        raise OSError(errno.EIO, f"short O_DIRECT write ({written} of {len(data)} bytes)", str(path))


def _bounce() -> mmap.mmap:
    """This thread's bounce buffer of BOUNCE bytes; made again if BOUNCE changed since (a test shrinks it), so a
    smaller one is never used at the full size."""
    buffer = getattr(_local, "buffer", None)
    if buffer is None or len(buffer) != BOUNCE:
        buffer = _local.buffer = mmap.mmap(-1, BOUNCE)  # anonymous maps are page-aligned
    return buffer


def _write_direct(tmp: Path, data: memoryview) -> bool:
    """Write `data` as the new file `tmp` with O_DIRECT; False where the filesystem refuses."""
    dev = tmp.parent.stat().st_dev
    if dev in _no_direct:
        return False
    try:
        fd = _create(tmp, os.O_DIRECT)
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
        _no_direct.add(dev)
        return False
    pos = 0
    try:
        if np.frombuffer(data, np.uint8).ctypes.data % ALIGN == 0:  # aligned_empty's: straight to the disk
            body = len(data) // ALIGN * ALIGN
            while pos < body:
                n = min(DIRECT_PIECE, body - pos)
                _pwrite_all(fd, data[pos:pos + n], pos, tmp)
                pos += n
        view = memoryview(_bounce())
        try:
            while pos < len(data):
                n = min(BOUNCE, len(data) - pos)
                padded = -(-n // ALIGN) * ALIGN
                view[:n] = data[pos:pos + n]
                if padded > n:
                    view[n:padded] = bytes(padded - n)
                _pwrite_all(fd, view[:padded], pos, tmp)
                pos += n
        finally:
            view.release()
        os.ftruncate(fd, len(data))  # the last block was padded out to the alignment
    except OSError as e:
        if e.errno != errno.EINVAL or pos:
            raise
        _no_direct.add(dev)  # refused at the first write: the caller starts over on the buffered path
        return False
    finally:
        os.close(fd)
    return True


def write_json_atomic(path: Path, doc: object, durable: bool = False) -> None:
    write_bytes_atomic(path, (readable_json(doc) + "\n").encode(), durable)


def readable_json(doc: object, depth: int = 2, indent: str = " ") -> str:
    """`doc` as JSON indented for `depth` levels and compact below them: an entry's manifest reads one line per
    array or chunk, and is written by json's C encoder (its indenting one is Python: 0.19 s for a tiny N1.7's
    manifest of every slot, against 0.03 s)."""
    if depth == 0 or not isinstance(doc, dict) or not doc:
        return json.dumps(doc)
    inner = indent * 2 if depth > 1 else indent
    lines = [f"{indent}{json.dumps(str(k))}: {readable_json(v, depth - 1, inner)}" for k, v in doc.items()]
    return "{\n" + ",\n".join(lines) + "\n" + indent[:-1] + "}"


# -- writes handed off ----------------------------------------------------------------------------------------------
@functools.cache
def writer_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(WRITERS, thread_name_prefix="write-behind")


class _HandedOff:
    """The writes handed off per folder, the first error of each, and the bytes they hold until written."""

    def __init__(self) -> None:
        # Entered as the lock itself, never as the Condition: a Ctrl-C can land inside the Condition's Python-level
        # __enter__ once it holds the lock, leaving it held (on the main thread: a failed build's cleanup waits
        # here), and the writer threads then wait for it forever. A C lock's __enter__ gives it no such moment.
        self.lock = threading.RLock()
        self.room = threading.Condition(self.lock)
        self.held = 0
        self.writes: dict[str, list[Future]] = {}
        self.failed: dict[str, BaseException] = {}

    def add(self, folder: str, nbytes: int, write: Callable[[], None]) -> Future:
        with self.lock:
            if folder in self.failed:  # a full disk stops the run at its next write, not at the publish
                raise self.failed[folder]
            self.room.wait_for(lambda: self.held == 0 or self.held + nbytes <= BEHIND_BYTES)
            self.held += nbytes
            future = writer_pool().submit(write)
            self.writes.setdefault(folder, []).append(future)
        future.add_done_callback(lambda done: self._written(folder, nbytes, done))
        return future

    def _written(self, folder: str, nbytes: int, done: Future) -> None:
        with self.lock:
            self.held -= nbytes
            if done.exception() is not None:
                self.failed.setdefault(folder, done.exception())
            self.room.notify_all()

    def finish(self, folder: str) -> None:
        with self.lock:
            futures = self.writes.pop(folder, [])
        wait(futures)
        with self.lock:
            failed = self.failed.pop(folder, None)
        if failed is not None:
            raise failed


_handed_off = _HandedOff()


def write_behind(folder: Path | str, nbytes: int, write: Callable[[], None]) -> Future:
    """Run `write` (which writes `nbytes` held in memory into `folder`) on a writer thread, and return at once.
    Waits while BEHIND_BYTES are handed off and not yet written; raises the error of an earlier write into
    `folder` that failed. Only where the folder is published in this process: `writes_finished` waits here.
    Writes run in the order handed off: one may wait for an earlier one's future."""
    return _handed_off.add(str(folder), nbytes, write)


def writes_finished(folder: Path | str) -> None:
    """Wait until every write handed off into `folder` is done; raise the first one's error. Before a folder is
    published, and before a failed one is removed (a late write would make it again)."""
    _handed_off.finish(str(folder))
