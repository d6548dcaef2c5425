"""A published entry, read through a `Store` (tasks/entries/store.py), so a local folder and an object store are
read by the same code: listing, opening, verifying, reading a chunk into a caller's buffer, a device file. The
entry's names are tasks/entries/names.py, its records tasks/entries/manifest.py; the order in which an entry is
made visible is tasks/entries/publish.py, refs tasks/entries/refs.py (cache/README.md says the same)."""

from __future__ import annotations

import functools
import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Callable, Iterator, Sequence

import numpy as np
import xxhash

from tasks.device import one_file
from tasks.errors import CacheError
from tasks.io.file_blocks import each_read
from tasks.entries.manifest import ChunkRecord, FileRecord, Manifest, decode_manifest, processor_matches
from tasks.entries.names import (ENTRIES, MANIFEST, PACKED_DIR, PROCESSOR_DIR, READABLE_FORMATS,
                                 chunk_file, chunk_key, entry_key, is_temporary, manifest_key, object_key, packed_name,
                                 packed_path)
from tasks.entries.store import Store


SMALL_FILE = 1 << 20  # a tiled chunk below it is read into memory, not mapped: it is copied into rows anyway


@dataclass(frozen=True)
class Entry:
    store: Store
    name: str
    manifest: Manifest

    @property
    def path(self) -> Path:
        """The entry's folder (local caches; an object store's entries have no path)."""
        path = self.store.local_path(entry_key(self.name))
        if path is None:
            raise CacheError(f"{self.describe()}: an object-store entry has no local path")
        return path

    def describe(self, rel: str = "") -> str:
        return self.store.describe(f"{entry_key(self.name)}/{rel}" if rel else entry_key(self.name))

    def chunk_object(self, array: str, slot: int | None) -> str:
        """The store key of a chunk (slot None: the whole array): the object its record names, else its file in
        the entry's folder."""
        arr = self.manifest.arrays[array]
        named = arr.chunks[slot].object if slot in arr.chunks else None
        return named or chunk_file(PurePosixPath(entry_key(self.name)), array, arr.chunk_rank, slot).as_posix()

    def has_device_file(self, array: str, slot: int | None) -> bool:
        """Whether ttnn loads this chunk from a file as it stored it: its `.tensorbin`, or the tiled chunk itself."""
        return self.manifest.arrays[array].tiled or self.manifest.arrays[array].chunks[slot].tensorbin is not None

    def device_record(self, array: str, slot: int | None) -> FileRecord | None:
        """The record of the bytes ttnn reads for this chunk: its `.tensorbin`, or a tiled chunk's first bytes
        (the whole file where a record names no such part); None without a device file."""
        arr, record = self.manifest.arrays[array], self.manifest.arrays[array].chunks[slot]
        return (record.device or record) if arr.tiled else record.tensorbin

    def device_file_size(self, array: str, slot: int | None) -> int:
        """The size of the file that holds the bytes ttnn reads: a tiled chunk's own, or the `.tensorbin`'s."""
        arr, record = self.manifest.arrays[array], self.manifest.arrays[array].chunks[slot]
        return record.nbytes if arr.tiled else record.tensorbin.nbytes

    def device_object(self, array: str, slot: int | None) -> str:
        """The store key of a chunk's device file: a tiled chunk's own, else its `.tensorbin`'s (the object its
        record names, else its file in the entry's folder)."""
        if self.manifest.arrays[array].tiled:
            return self.chunk_object(array, slot)
        record = self.manifest.arrays[array].chunks.get(slot)
        named = record.tensorbin.object if record is not None and record.tensorbin is not None else None
        return named or packed_path(PurePosixPath(entry_key(self.name)), array, slot).as_posix()

    def processor_object(self, name: str) -> str:
        """The store key of a kept processor file: in the entry's folder, or, in an entry whose chunks are objects
        (an object store's), the object of its sha256 (shared, as chunks are, by every entry that keeps the same
        bytes)."""
        if self._names_objects:
            return object_key(str(self.manifest.processor[name]["sha256"]))
        return f"{entry_key(self.name)}/{PROCESSOR_DIR}/{name}"

    @functools.cached_property
    def _names_objects(self) -> bool:
        return any(rec.object for arr in self.manifest.arrays.values() for rec in arr.chunks.values())

    def processor_files(self) -> dict[str, bytes]:
        """The trainer's processor files the entry keeps, name -> bytes, each checked against its record."""
        files = {}
        for name, key, data, whole in self._processor_reads():
            if not whole:
                raise CacheError(f"{self.store.describe(key)}: processor file {name} is "
                                 f"{'missing' if data is None else 'not what the manifest records (tampered or corrupt)'};"
                                 " run `python -m pipeline cache verify` and convert again with --force")
            files[name] = data
        return files

    def _processor_reads(self) -> Iterator[tuple[str, str, bytes | None, bool]]:
        """Each kept processor file: its name, its key, its bytes (None: missing), and whether they match."""
        for name, record in self.manifest.processor.items():
            key = self.processor_object(name)
            data = self.store.get(key)
            yield name, key, data, processor_matches(record, data)

    def read_chunk(self, array: str, slot: int | None, out: np.ndarray | None = None) -> np.ndarray:
        """One chunk, checked against its manifest record (the pass that touches every byte): read into `out`
        (e.g. a slot's slice of a whole bank), else mapped (locally) or fetched on its own."""
        arr = self.manifest.arrays[array]
        key, record = self.chunk_object(array, slot), arr.chunks[slot]

        def read() -> np.ndarray:
            if arr.tiled and record.nbytes < SMALL_FILE:  # read: a mapping costs more than the bytes
                file = np.empty(record.nbytes, np.uint8)
                self.store.read_into(key, file)
                return file
            if arr.tiled:  # the file as it lies (in tile order): put in rows once it is checked
                return self.store.map(key, np.dtype(np.uint8), (record.nbytes,))
            if out is None:
                return self.store.map(key, arr.storage_dtype, tuple(arr.logical_shape))
            self.store.read_into(key, out)
            return out

        found = read()
        whole = record.matches(found)  # the check touches every byte once
        if not whole and self.store.forget(key):  # a copy kept here, not the object: fetched again
            found = read()
            whole = record.matches(found)
        if not whole:
            raise CacheError(f"{self.describe(array)}: chunk {chunk_key(slot)} does not match its manifest checksum "
                             "(tampered or corrupt); run `python -m pipeline cache verify` and convert again with --force")
        if not arr.tiled:
            return found
        try:  # a copy: the rows a reader wants are not the tiles the device wants
            return one_file.logical(found, tuple(arr.logical_shape), out)
        except ValueError as e:  # a checked file whose index does not fit: written so, by a converter with a bug
            raise CacheError(f"{self.describe(array)}: chunk {chunk_key(slot)} {e}; convert again with --force") from None

    def checked_chunk(self, array: str, slot: int | None) -> np.ndarray:
        """One chunk as a private mapping nothing has touched yet, its file read and checked first: for a caller
        that uses the bytes later, or some of them (a reload's embed_tokens), the check costs a read, not a page
        fault per page, and adds no RSS. An object store's chunk is fetched and checked (`read_chunk`)."""
        if self.store.local_path(self.chunk_object(array, slot)) is None or self.manifest.arrays[array].tiled:
            return self.read_chunk(array, slot)
        self.each_chunk_block(array, slot, lambda block, pos: None)
        arr = self.manifest.arrays[array]
        return self.store.map(self.chunk_object(array, slot), arr.storage_dtype, tuple(arr.logical_shape))

    def each_chunk_block(self, array: str, slot: int | None, consume: Callable[[memoryview, int], None]) -> None:
        """`consume(bytes, offset)` over one chunk's consecutive blocks (tasks/io/file_blocks.py `each_read`),
        for a caller that converts as it reads: a 622 MB table then needs no second copy. The checksum is held to
        the record after the last block; a mismatch raises there, so the caller must use nothing before the end."""
        record, key = self.manifest.arrays[array].chunks[slot], self.chunk_object(array, slot)
        if not self._each_block_matches(key, record, consume) and (not self.store.forget(key) or
                                                                   not self._each_block_matches(key, record, consume)):
            raise CacheError(f"{self.describe(array)}: chunk {chunk_key(slot)} does not match its manifest checksum "
                             "(tampered or corrupt); run `python -m pipeline cache verify` and convert again with --force")

    def _each_block_matches(self, key: str, record: FileRecord, consume: Callable[[memoryview, int], None]) -> bool:
        """`consume` over the object's blocks; whether they were the record's bytes."""
        path = self.store.local_file(key)
        if path is None:
            raise CacheError(f"{self.store.describe(key)}: chunk is missing from the cache entry; run `python -m "
                             "pipeline cache verify` and convert again with --force")
        digest = xxhash.xxh3_64()

        def hashed(block: memoryview, pos: int) -> None:
            digest.update(block)
            consume(block, pos)

        try:
            total = each_read(path, hashed)
        except OSError as e:
            raise CacheError(f"{self.store.describe(key)}: chunk could not be read ({e.strerror or e}); run `python "
                             "-m pipeline cache verify`") from e
        return total == record.nbytes and digest.hexdigest() == record.xxh3

    def device_file(self, array: str, slot: int | None) -> Path:
        """ttnn's `.tensorbin` of a chunk as a local file, checked against its record (which warms its pages)."""
        rec, key = self.device_record(array, slot), self.device_object(array, slot)
        size = self.device_file_size(array, slot)
        path = self.store.local_file(key)
        whole = path is not None and rec.matches_file(path, size)  # the check reads what ttnn reads, once
        if path is not None and not whole and self.store.forget(key):  # a copy kept here, not the object: fetched again
            path = self.store.local_file(key)
            whole = path is not None and rec.matches_file(path, size)
        if path is None:
            raise CacheError(f"{self.store.describe(key)}: device file (what ttnn loads) listed in the manifest is "
                             "missing; convert again with --force")
        if not whole:
            raise CacheError(f"{self.store.describe(key)}: device file (what ttnn loads) does not match its manifest "
                             "checksum (tampered or corrupt); convert again with --force")
        return path

    def device_paths(self, chunks: Sequence[tuple[str, int | None]]) -> list[str]:
        """The chunks' `.tensorbin` files as local paths, real ones (as the kernel names a mapping), each of the size
        its record says (ttnn is never handed a short file); their bytes are not read here. One missing or of
        another size is read and refused by name (`device_file`). An object store's are fetched into local files."""
        packed = self.store.local_path(f"{entry_key(self.name)}/{PACKED_DIR}")
        folder = os.path.realpath(packed) if packed is not None else ""  # once (1,387 Paths cost 0.05 s)
        here, prefix = os.path.dirname(folder), f"{entry_key(self.name)}/"  # the entry's own folder, resolved once
        paths = []
        for name, slot in chunks:
            if packed is not None and not self.manifest.arrays[name].tiled:
                path = os.path.join(folder, packed_name(name, slot))
            elif packed is not None and self.device_object(name, slot).startswith(prefix):  # a tiled chunk here
                path = os.path.join(here, self.device_object(name, slot)[len(prefix):])
            else:
                fetched = self.store.local_file(self.device_object(name, slot))
                path = os.path.realpath(fetched) if fetched else ""
            try:
                fits = os.stat(path).st_size == self.device_file_size(name, slot)
            except OSError:
                fits = False
            paths.append(path if fits else str(self.device_file(name, slot)))
        return paths

    def verify(self, threads: int = 8) -> list[str]:
        """Every chunk and device file the manifest lists must exist with its size and xxh3; the problems found, in
        the manifest's order. Checked on `threads` threads: an object store answers each request in a round trip
        (2,000 of them one after another took 18 s against a local S3), and a local file is hashed as it is read,
        so no thread holds a whole chunk."""
        objects = [(self.chunk_object(array, slot), rec, self.device_object(array, slot))
                   for array, arr in self.manifest.arrays.items() for slot, rec in arr.chunks.items()]
        with ThreadPoolExecutor(threads) as pool:
            found = pool.map(lambda o: self._problems(*o), objects)
            problems = [problem for problems in found for problem in problems]
        for _, key, data, whole in self._processor_reads():
            if not whole:
                problems.append(f"{self.store.describe(key)}: processor file {'listed in the manifest is missing' if data is None else 'does not match the manifest checksum (tampered or corrupt)'}")
        return problems

    def _problems(self, key: str, record: ChunkRecord, packed: str) -> list[str]:
        problems = []
        found = self._matches(key, record)
        if found is None:
            problems.append(f"{self.store.describe(key)}: chunk listed in the manifest is missing")
        elif not found:
            problems.append(f"{self.store.describe(key)}: chunk bytes do not match the manifest checksum (tampered or "
                            "corrupt)")
        if record.tensorbin is not None and not self._matches(packed, record.tensorbin):
            problems.append(f"{self.store.describe(packed)}: device file (what ttnn loads) is missing or does not "
                            "match the manifest checksum")
        return problems

    def _matches(self, key: str, record: FileRecord) -> bool | None:
        """Whether the object holds the record's bytes; None when there is no such object."""
        path = self.store.local_path(key)
        if path is not None:  # read block by block, not whole: a chunk may be 1.24 GB
            return record.matches_file(path) if path.is_file() else None
        data = self.store.get(key)
        return None if data is None else record.matches(data)


class OldFormatError(CacheError):
    """A complete entry in a cache format this code does not read."""

    def __init__(self, message: str, cache_format: int):
        super().__init__(message)
        self.cache_format = cache_format


UNPUBLISHED = "published — run `python -m pipeline cache gc` and convert again"  # in a folder (pipeline/cache/homes.py)


def open_entry(store: Store, name: str, unpublished: str = UNPUBLISHED) -> Entry:
    """A published entry: its manifest must exist, parse, and carry the fingerprint its name promises.
    `unpublished`: what a final name without its manifest means in this store, and the remedy (the home's)."""
    key = manifest_key(name)
    raw = store.get(key)
    if raw is None:
        raise CacheError(f"{store.describe(entry_key(name))}: no {MANIFEST}; the entry was never completely "
                         f"{unpublished}")
    try:
        manifest = Manifest.from_json(decode_manifest(raw))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CacheError(f"{store.describe(key)}: manifest is not valid JSON ({e}); convert again with --force") from e
    except ValueError as e:  # what decode_manifest and the records refuse, said by them
        raise CacheError(f"{store.describe(key)}: manifest {e}; convert again with --force") from None
    except (KeyError, TypeError, AttributeError) as e:
        raise CacheError(f"{store.describe(key)}: manifest lacks {e} or has the wrong type; convert again with "
                         "--force") from None
    if manifest.cache_format not in READABLE_FORMATS:
        raise OldFormatError(f"{store.describe(entry_key(name))}: written in cache format {manifest.cache_format}, "
                             f"which this converter does not read (it reads {', '.join(map(str, READABLE_FORMATS))}); "
                             f"convert again (the new entry gets a new name) and remove this one with `python -m "
                             f"pipeline cache rm {name} --include-current`", manifest.cache_format)
    if not manifest.fingerprint or not name.endswith(manifest.fingerprint[:20]):
        raise CacheError(f"{store.describe(key)}: fingerprint {manifest.fingerprint[:20] or 'missing'} does not match "
                         f"the entry name {name}: the entry was copied or tampered with; convert again with --force")
    return Entry(store, name, manifest)


def list_entries(store: Store, opened: Entry | None = None,
                 unpublished: str = "broken") -> Iterator[tuple[str, Entry | None, str]]:
    """Every name under entries/: (name, entry or None, state). States: published; incomplete (a temporary being
    built); broken (a manifest that is not valid); `unpublished` for a final name without a manifest (the home's
    meaning: in a folder, broken, which publish-by-rename can never produce; in an object store, a push in progress
    or abandoned). `opened`: an entry of this store the caller opened already, handed back as it is (its manifest
    is not parsed again)."""
    for name in store.children(ENTRIES):
        if is_temporary(name):
            yield name, None, "incomplete"
            continue
        if opened is not None and name == opened.name:
            yield name, opened, "published"
            continue
        try:
            yield name, open_entry(store, name), "published"
        except OldFormatError as e:
            yield name, None, f"cache format {e.cache_format} (unreadable here: gc removes it)"
        except CacheError:
            yield name, None, "broken" if store.get(manifest_key(name)) is not None else unpublished
