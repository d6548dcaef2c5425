"""A cache entry's format, in one place (cache/README.md says the same): its format version, its names, the
documents and records it is made of (array and group `zarr.json`, the progress record, the manifest, content ids),
the writes that lay its arrays out, and every read of a published entry — listing, opening, verifying, reading a
chunk into a caller's buffer, a device file — through a `Store`, so a local folder and an object store are read by
the same code. The Zarr v3 encoding itself is tasks/zarr_v3.py, which only this module uses. The protocols that use
these definitions live beside it: the progress logs of an entry being built (tasks/progress.py), refs
(tasks/refs.py), and the order in which an entry is made visible, by rename or by `push` (tasks/publish.py).

Keys are relative to the cache root: `entries/<name>/…` and `refs/<version>-<layout>-<profile>.json`.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from pathlib import Path, PurePosixPath
from typing import Callable, Iterator, Mapping, Sequence

import numpy as np
import xxhash

from tasks.bulk_write import write_made_in_place
from tasks.errors import CacheError
from tasks.file_blocks import each_read
from tasks.plan import Plan, Target
from tasks.store import LocalStore, Store
from tasks.zarr_v3 import DATA_TYPES, array_metadata, chunk_path, create_array, group_metadata, write_chunk as _write_chunk

CACHE_FORMAT = 5            # bump when the on-disk layout changes (cache/README.md, "Versioning")
CONVERTER_VERSION = "3"     # bump when a transform changes the bytes it produces (3: host tables stored as float32)
READABLE_FORMATS = (3, 4, 5)  # 3: chunk keys c.0.0; 4: + source_shapes; 5: + source_dtypes, float32 host arrays.
                              # Format 2 kept c/0/0 and is not read.
MANIFEST = "MANIFEST.json"  # written last: present means complete
ENTRIES, REFS = "entries", "refs"
PORT_MODELS = "port-models"  # port-models/<entry>/: the port's model kept per entry (pipeline/port_n16/kept.py)
PROGRESS_DIR = ".staged"    # progress logs of an entry being built (resume): one JSON line per staged chunk
PACKED_DIR = "tensorbin"    # ttnn's `.tensorbin` device files, outside the Zarr arrays
WHOLE = "all"               # the manifest key of a whole-array chunk; a bank's chunks are keyed by slot
TMP_MARK = ".tmp-"          # `<name>.tmp-<pid>-<random>`: an entry being built (local caches only)


# -- names --------------------------------------------------------------------------------------------------------
def entry_key(name: str) -> str:
    return f"{ENTRIES}/{name}"


def manifest_key(name: str) -> str:
    return f"{ENTRIES}/{name}/{MANIFEST}"


SYNTHETIC_REF = ".synthetic"  # synthetic conversions have refs of their own: fake weights never take a real ref


def ref_key(version: str, layout: str, profile: str, synthetic: bool = False) -> str:
    """The ref naming the entry last converted for this version, layout and profile (from a synthetic stand-in:
    `<...>.synthetic.json`, so that converting one never changes what a real load opens)."""
    return f"{REFS}/{version}-{layout}-{profile}{SYNTHETIC_REF if synthetic else ''}.json"


def ref_object(stem: str) -> str:
    """The key of the ref `refs()` lists as `stem`."""
    return f"{REFS}/{stem}.json"


def entry_name(version: str, layout: str, profile: str, fingerprint: str) -> str:
    """`<version>-<layout>-<profile>-<first 20 hex digits of the fingerprint>`: what `open_entry` holds a manifest to."""
    return f"{version}-{layout}-{profile}-{fingerprint[:20]}"


def chunk_key(slot: int | None) -> str:
    return WHOLE if slot is None else str(slot)


def slot_of(key: str) -> int | None:
    return None if key == WHOLE else int(key)


def chunk_coords(ndim: int, slot: int | None) -> tuple[int, ...]:
    """Whole-array targets are one chunk; an embodiment bank has one chunk per slot."""
    return (0,) * ndim if slot is None else (slot,) + (0,) * ndim


def chunk_file(entry: Path | PurePosixPath, name: str, ndim: int, slot: int | None) -> Path | PurePosixPath:
    """The chunk of target `name` (`ndim` = its logical rank) for `slot`, under the entry folder or key."""
    return chunk_path(entry / name, chunk_coords(ndim, slot))


def _chunk_name(name: str, slot: int | None) -> str:
    return name + ("" if slot is None else f"@{slot}")


def packed_path(entry: Path | PurePosixPath, name: str, slot: int | None) -> Path | PurePosixPath:
    """Where a target's `.tensorbin` lives (outside the arrays, so Zarr readers never see it)."""
    return entry / PACKED_DIR / _packed_name(name, slot)


def _packed_name(name: str, slot: int | None) -> str:
    return _chunk_name(name, slot) + ".tensorbin"


def tmp_name(name: str, pid: int, token: str) -> str:
    """The folder an entry is built in: `<name>.tmp-<pid>-<token>` (its owner's pid, so orphans can be told)."""
    return f"{name}{TMP_MARK}{pid}-{token}"


def scratch_name(name: str, pid: int) -> str:
    """A throwaway entry that `--check-against-cache` converts into beside `name`, deleted either way:
    `.tmp-<pid>-check-<name>`. A temporary by its name, so nothing lists or opens it as published, and a kill
    before it is deleted leaves what gc removes once its process is dead (`tmp_owner`)."""
    return f"{TMP_MARK}{pid}-check-{name}"


def tmp_owner(folder: str) -> int | None:
    """The pid that builds in a `tmp_name` folder; None for any other name."""
    try:
        return int(folder.split(TMP_MARK, 1)[1].split("-", 1)[0])
    except (IndexError, ValueError):
        return None


def progress_log(entry: Path, writer: str) -> Path:
    """One append-only log per writing process and thread: a file per chunk would cost an inode each, which is
    what creating files costs most on ext4 (find_inode_bit), thousands of times per entry."""
    return entry / PROGRESS_DIR / f"{writer}.jsonl"


def checksum(data: np.ndarray | bytes | memoryview) -> str:
    """xxh3-64 of raw bytes (about 10 GB/s: cheap enough to verify every chunk on every load)."""
    if isinstance(data, np.ndarray):
        data = memoryview(np.ascontiguousarray(data).reshape(-1).view(np.uint8))
    return xxhash.xxh3_64_hexdigest(data)


# -- the manifest, typed ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FileRecord:
    nbytes: int
    xxh3: str

    def matches(self, data: np.ndarray | bytes | memoryview | None) -> bool:
        """Whether bytes are this chunk or device file: its size and xxh3."""
        if data is None:
            return False
        size = data.nbytes if isinstance(data, (np.ndarray, memoryview)) else len(data)
        return size == self.nbytes and checksum(data) == self.xxh3

    def matches_file(self, path: Path) -> bool:
        """Whether a local file holds these bytes (read block by block: tasks/file_blocks.py `each_read`)."""
        if path.stat().st_size != self.nbytes:
            return False
        digest = xxhash.xxh3_64()
        return each_read(path, lambda block, _: digest.update(block)) == self.nbytes and \
            digest.hexdigest() == self.xxh3


@dataclass(frozen=True)
class ChunkRecord(FileRecord):
    max_abs_err: float = 0.0
    pcc: float = 1.0
    tensorbin: FileRecord | None = None  # ttnn's device file of this chunk, when the plan keeps one

    def to_json(self) -> dict:
        doc = {"nbytes": self.nbytes, "xxh3": self.xxh3, "max_abs_err": self.max_abs_err, "pcc": self.pcc}
        if self.tensorbin is not None:
            doc["tensorbin"] = {"nbytes": self.tensorbin.nbytes, "xxh3": self.tensorbin.xxh3}
        return doc

    @classmethod
    def from_json(cls, doc: Mapping) -> "ChunkRecord":
        packed = doc.get("tensorbin")
        return cls(doc["nbytes"], doc["xxh3"], doc.get("max_abs_err", 0.0), doc.get("pcc", 1.0),
                   FileRecord(packed["nbytes"], packed["xxh3"]) if packed else None)


@dataclass(frozen=True, kw_only=True)
class ArrayRecord:
    shape: list[int]                    # stored shape: [bank slots, *logical] for a bank
    chunk_shape: list[int]
    attributes: Mapping[str, object]    # what the array records about itself (cache/README.md, "entries/")
    source_xxh3: Mapping[str, str]      # source key -> xxh3-128 of its bytes
    content_id: str                     # what the bytes are a function of (reuse across entries)
    chunks: Mapping[int | None, ChunkRecord]  # slot (None: the whole array) -> record

    @property
    def logical_shape(self) -> list[int]:
        return list(self.attributes["logical_shape"])

    @property
    def bank(self) -> bool:
        return bool(self.attributes["embodiment_bank"])

    @property
    def host_only(self) -> bool:
        return bool(self.attributes.get("host_only"))

    @property
    def device_dtype(self) -> str:
        return str(self.attributes["device_dtype"])

    @property
    def storage_dtype(self) -> np.dtype:
        """The numpy dtype of the stored bytes: bf16 bits (uint16), or float32 for a host table."""
        return DATA_TYPES[str(self.attributes.get("dtype", "bfloat16"))][1]

    @property
    def source_dtypes(self) -> list[str]:
        """Each source's safetensors dtype (entries before format 5: BF16, as every release)."""
        return list(self.attributes.get("source_dtypes") or ["BF16"] * len(self.attributes["sources"]))

    @property
    def device_layout(self) -> str:
        return str(self.attributes["device_layout"])

    def to_json(self) -> dict:
        return {"shape": self.shape, "chunk_shape": self.chunk_shape, "attributes": dict(self.attributes),
                "source_xxh3": dict(self.source_xxh3), "content_id": self.content_id,
                "chunks": {chunk_key(s): c.to_json() for s, c in self.chunks.items()}}

    @classmethod
    def from_json(cls, doc: Mapping) -> "ArrayRecord":
        return cls(shape=doc["shape"], chunk_shape=doc["chunk_shape"], attributes=doc["attributes"],
                   source_xxh3=doc.get("source_xxh3", {}), content_id=doc.get("content_id", ""),
                   chunks={slot_of(k): ChunkRecord.from_json(c) for k, c in doc["chunks"].items()})


@dataclass(frozen=True, kw_only=True)
class Identity:
    """What an entry's bytes are a function of, and its fingerprint: the manifest's first fields, the group
    metadata's `gr00t_cache`, and the entry's name."""

    fingerprint: str
    cache_format: int
    converter: str
    version: str
    revision: str | None
    synthetic: str | None
    layout: str
    profile: str
    shards: Mapping[str, str]          # shard file -> its identity: the HF blob's sha256, else its content id
    recipes_sha256: str
    slots: list[int]
    source: Mapping[str, object]       # snapshot folder, revision, synthetic mark (recorded, not hashed)
    source_shapes: Mapping[str, list[int]]

    @classmethod
    def of(cls, plan: Plan, *, source: Mapping[str, object], shard_sha: Mapping[str, str], slots: tuple[int, ...],
           source_shapes: Mapping[str, tuple[int, ...]], recipes_sha256: str) -> "Identity":
        """Everything that determines an entry's bytes, and its fingerprint (sha256 of the canonical JSON); plus
        `source` (the snapshot folder, the revision read, and whether it is synthetic), recorded but not hashed
        beyond the revision and the synthetic mark: the same bytes in another folder are the same entry.
        `source_shapes` (every checkpoint key's shape, a function of the hashed shards) is recorded so that a
        consumer's own constructors can be run from the entry alone (pipeline/port_n16/)."""
        doc = {"cache_format": CACHE_FORMAT, "converter": CONVERTER_VERSION, "version": plan.version,
               "revision": source.get("revision"), "synthetic": source.get("synthetic"), "layout": plan.layout,
               "profile": plan.profile, "shards": dict(sorted(shard_sha.items())), "recipes_sha256": recipes_sha256,
               "slots": list(slots),
               "targets": [[t.name, list(t.sources), t.transform, list(t.params), t.device_dtype, t.layout]
                           for t in plan.targets]}
        fingerprint = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
        return cls(fingerprint=fingerprint, **{k: v for k, v in doc.items() if k != "targets"}, source=dict(source),
                   source_shapes={k: list(v) for k, v in sorted(source_shapes.items())})

    @property
    def name(self) -> str:
        return entry_name(self.version, self.layout, self.profile, self.fingerprint)

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(Identity)}  # (a Manifest's identity part, too)


@dataclass(frozen=True)
class Manifest(Identity):
    """`MANIFEST.json`: the entry's identity (what its bytes are a function of: `Identity`'s fields, first), then
    every array and chunk. Entries of format 3 have no `source_shapes` (read as {})."""

    published_unix: float = 0.0
    arrays: Mapping[str, ArrayRecord] = field(default_factory=dict)
    bytes: int = 0
    chunks: int = 0
    shards_sha256: Mapping[str, str] = field(default_factory=dict)  # every shard's sha256 (not hashed: taken in the graph)

    def to_json(self) -> dict:
        return {**Identity.to_json(self), "published_unix": self.published_unix,
                "arrays": {n: a.to_json() for n, a in self.arrays.items()}, "bytes": self.bytes, "chunks": self.chunks,
                **({"shards_sha256": dict(sorted(self.shards_sha256.items()))} if self.shards_sha256 else {})}

    @classmethod
    def published(cls, identity: Identity, arrays: Mapping[str, ArrayRecord], nbytes: int, chunks: int,
                  shards_sha256: Mapping[str, str]) -> "Manifest":
        """The manifest of an entry being published now."""
        return cls(**Identity.to_json(identity), published_unix=time.time(), arrays=arrays, bytes=nbytes, chunks=chunks,
                   shards_sha256=shards_sha256)

    @classmethod
    def from_json(cls, doc: Mapping) -> "Manifest":
        return cls(fingerprint=doc["fingerprint"], cache_format=doc["cache_format"], converter=doc["converter"],
                   version=doc["version"], revision=doc.get("revision"), synthetic=doc.get("synthetic"),
                   layout=doc.get("layout", "generic"), profile=doc["profile"], shards=doc.get("shards", {}),
                   recipes_sha256=doc.get("recipes_sha256", ""), slots=doc.get("slots", []),
                   source=doc.get("source", {}), source_shapes=doc.get("source_shapes", {}),
                   published_unix=doc.get("published_unix", 0.0),
                   arrays={n: ArrayRecord.from_json(a) for n, a in doc["arrays"].items()},
                   bytes=doc.get("bytes", 0), chunks=doc.get("chunks", 0),
                   shards_sha256=doc.get("shards_sha256", {}))  # absent in entries written before 2026-12-04

    @property
    def is_synthetic(self) -> bool:
        """Converted from the project's synthetic stand-in, not a GR00T release."""
        return bool(self.synthetic or self.source.get("synthetic"))

    def holds_slot(self, slot: int | None) -> bool:
        """Whether every bank has this slot (None: every slot of every bank)."""
        for arr in self.arrays.values():
            wanted = range(arr.shape[0]) if slot is None else (slot,)
            if arr.bank and any(s not in arr.chunks for s in wanted):
                return False
        return True


# -- building an entry: its documents, its chunks, its progress records ------------------------------------------
def array_attributes(t: Target, slots: tuple[int, ...]) -> dict:
    """What a target's array records about itself (cache/README.md, "entries/")."""
    return {"dtype": t.stored_dtype, "sources": list(t.sources),
            "source_dtypes": list(t.source_dtypes) or ["BF16"] * len(t.sources), "transform": t.transform,
            "transform_params": list(t.params), "kind": t.kind, "device_dtype": t.device_dtype,
            "device_layout": t.layout, "host_only": t.host, "logical_shape": list(t.shape),
            "embodiment_bank": t.embodiment, "slots": list(slots) if t.embodiment else None, "mirrors": t.mirrors}


def array_documents(plan: Plan, slots: tuple[int, ...]) -> dict[str, dict]:
    """Every target's `zarr.json` document, by target name: a bank keeps every slot addressable, one chunk each."""
    out = {}
    for t in plan.targets:
        shape = (t.bank_slots, *t.shape) if t.embodiment else t.shape
        chunks = (1, *t.shape) if t.embodiment else t.shape
        out[t.name] = array_metadata(shape, chunks, array_attributes(t, slots))
    return out


def create_arrays(tmp: Path, arrays: Mapping[str, dict]) -> None:
    """Every target's array folder and document (idempotent, so a resumed run can repeat it): the stage tasks
    then write their chunks into folders that exist."""
    for name, meta in arrays.items():
        create_array(tmp / name, meta)


def group_document(arrays: Mapping[str, dict], identity: Identity) -> dict:
    """The entry's root `zarr.json`: every array document consolidated, and the identity as `gr00t_cache`."""
    return group_metadata(arrays, {"gr00t_cache": identity.to_json()})


def write_chunk(entry: Path, name: str, slot: int | None, data: np.ndarray) -> None:
    """One chunk of target `name` (a bank: the chunk of `slot`), into an entry being built."""
    _write_chunk(entry / name, chunk_coords(data.ndim, slot), data)


def write_host_chunk(entry: Path, name: str, slot: int | None, table, seen=None) -> str:
    """A host table's chunk (tasks/source.py HostTable), stored as the float32 the port keeps it in, read from its
    shard block by block as it is written: the table is never held whole, and read once (`seen(first, block)` is
    shown every block, for the finite check). Returns the stored bytes' xxh3."""
    digest = xxhash.xxh3_64()

    def make(block: memoryview, pos: int) -> None:
        values = np.frombuffer(block, np.float32)
        table.read_float32(pos // 4, values)
        if seen is not None:
            seen(pos // 4, values)
        digest.update(block)

    write_made_in_place(chunk_path(entry / name, chunk_coords(table.ndim, slot)), table.size * 4, make)
    return digest.hexdigest()


def content_id(source_xxh3: Sequence[str], attributes: Mapping[str, object], converter: object) -> str:
    """What one array's bytes are a function of: its sources' bytes, its transform and device format, the
    converter version and the cache format. Equal ids mean equal bytes, whichever entry they sit in."""
    doc = [list(source_xxh3), attributes.get("source_dtypes"), attributes.get("dtype", "bfloat16"), attributes["transform"],
           attributes.get("transform_params", []), attributes["device_dtype"], attributes["device_layout"],
           attributes["logical_shape"], converter, CACHE_FORMAT]  # the same bytes stored another way are another content
    return hashlib.sha256(json.dumps(doc).encode()).hexdigest()


@dataclass(frozen=True)
class Staged:
    """A chunk written into an entry being built: which one, and its record (one JSON line of a progress log)."""
    name: str
    slot: int | None
    record: ChunkRecord

    def to_json(self) -> dict:
        return {"name": self.name, "slot": self.slot, **self.record.to_json()}

    @classmethod
    def from_json(cls, doc: Mapping) -> "Staged":
        return cls(doc["name"], doc["slot"], ChunkRecord.from_json(doc))

    def numerics(self) -> dict:
        """The summary's line for this chunk: what the device dtype costs against the bf16 source."""
        return {"name": self.name, "slot": self.slot, "nbytes": self.record.nbytes, "max_abs_err": self.record.max_abs_err,
                "pcc": self.record.pcc}


def manifest_arrays(staged: Sequence[Staged], array_meta: Mapping[str, dict], tensor_xxh3: Mapping[str, str],
                    converter: object) -> dict[str, ArrayRecord]:
    """Per array: its metadata, content id, and per chunk (slot or whole array) byte count and xxh3.
    Does not perform I/O."""
    chunks: dict[str, dict[int | None, ChunkRecord]] = {name: {} for name in array_meta}
    for s in staged:
        chunks[s.name][s.slot] = s.record
    arrays = {}
    for name, meta in array_meta.items():
        sources = {k: tensor_xxh3[k] for k in meta["attributes"]["sources"]}
        arrays[name] = ArrayRecord(shape=meta["shape"], chunk_shape=meta["chunk_grid"]["configuration"]["chunk_shape"],
                                   attributes=meta["attributes"], source_xxh3=sources,
                                   content_id=content_id(list(sources.values()), meta["attributes"], converter),
                                   chunks=chunks[name])
    return arrays


# -- a published entry, read through a Store ----------------------------------------------------------------------
@dataclass(frozen=True)
class Entry:
    store: Store
    name: str
    manifest: Manifest

    @property
    def path(self) -> Path:
        """The entry's folder (local caches; an object store's entries have no path)."""
        if not isinstance(self.store, LocalStore):
            raise CacheError(f"{self.describe()}: an object-store entry has no local path")
        return self.store.path(entry_key(self.name))

    def describe(self, rel: str = "") -> str:
        return self.store.describe(f"{entry_key(self.name)}/{rel}" if rel else entry_key(self.name))

    def chunk_object(self, array: str, slot: int | None) -> str:
        """The store key of a chunk (slot None: the whole array)."""
        ndim = len(self.manifest.arrays[array].logical_shape)
        return chunk_file(PurePosixPath(entry_key(self.name)), array, ndim, slot).as_posix()

    def device_object(self, array: str, slot: int | None) -> str:
        """The store key of a chunk's `.tensorbin`."""
        return packed_path(PurePosixPath(entry_key(self.name)), array, slot).as_posix()

    def read_chunk(self, array: str, slot: int | None, out: np.ndarray | None = None) -> np.ndarray:
        """One chunk, checked against its manifest record (the pass that touches every byte): read into `out`
        (e.g. a slot's slice of a whole bank), else mapped (locally) or fetched on its own."""
        arr = self.manifest.arrays[array]
        key = self.chunk_object(array, slot)
        if out is None:
            out = self.store.map(key, arr.storage_dtype, tuple(arr.logical_shape))
        else:
            self.store.read_into(key, out)
        if not arr.chunks[slot].matches(out):
            raise CacheError(f"{self.describe(array)}: chunk {chunk_key(slot)} does not match its manifest checksum "
                             "(tampered or corrupt); run `python -m pipeline cache verify` and convert again with --force")
        return out

    def checked_chunk(self, array: str, slot: int | None) -> np.ndarray:
        """One chunk as a private mapping nothing has touched yet, its file read and checked first: for a caller
        that uses the bytes later, or some of them (a reload's embed_tokens), the check costs a read, not a page
        fault per page, and adds no RSS. An object store's chunk is fetched and checked (`read_chunk`)."""
        if not isinstance(self.store, LocalStore):
            return self.read_chunk(array, slot)
        self.each_chunk_block(array, slot, lambda block, pos: None)
        arr = self.manifest.arrays[array]
        return self.store.map(self.chunk_object(array, slot), arr.storage_dtype, tuple(arr.logical_shape))

    def each_chunk_block(self, array: str, slot: int | None, consume: Callable[[memoryview, int], None]) -> None:
        """`consume(bytes, offset)` over one chunk's consecutive blocks (tasks/file_blocks.py `each_read`),
        for a caller that converts as it reads: a 622 MB table then needs no second copy. The checksum is held to
        the record after the last block; a mismatch raises there, so the caller must use nothing before the end."""
        record, key = self.manifest.arrays[array].chunks[slot], self.chunk_object(array, slot)
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
        if total != record.nbytes or digest.hexdigest() != record.xxh3:
            raise CacheError(f"{self.describe(array)}: chunk {chunk_key(slot)} does not match its manifest checksum "
                             "(tampered or corrupt); run `python -m pipeline cache verify` and convert again with --force")

    def device_file(self, array: str, slot: int | None) -> Path:
        """ttnn's `.tensorbin` of a chunk as a local file, checked against its record (which warms its pages)."""
        rec, key = self.manifest.arrays[array].chunks[slot].tensorbin, self.device_object(array, slot)
        path = self.store.local_file(key)
        if path is None:
            raise CacheError(f"{self.store.describe(key)}: packed tensor listed in the manifest is missing; convert "
                             "again with --force")
        if not rec.matches_file(path):
            raise CacheError(f"{self.store.describe(key)}: packed tensor does not match its manifest checksum "
                             "(tampered or corrupt); convert again with --force")
        return path

    def device_paths(self, chunks: Sequence[tuple[str, int | None]]) -> list[str]:
        """The chunks' `.tensorbin` files as local paths, real ones (as the kernel names a mapping), each of the size
        its record says (ttnn is never handed a short file); their bytes are not read here. One missing or of
        another size is read and refused by name (`device_file`). An object store's are fetched into local files."""
        local = isinstance(self.store, LocalStore)
        folder = os.path.realpath(self.path / PACKED_DIR) if local else ""  # once (1,387 Paths cost 0.05 s)
        paths = []
        for name, slot in chunks:
            if local:
                path = os.path.join(folder, _packed_name(name, slot))
            else:
                fetched = self.store.local_file(self.device_object(name, slot))
                path = os.path.realpath(fetched) if fetched else ""
            try:
                fits = os.stat(path).st_size == self.manifest.arrays[name].chunks[slot].tensorbin.nbytes
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
            return [problem for problems in found for problem in problems]

    def _problems(self, key: str, record: ChunkRecord, packed: str) -> list[str]:
        problems = []
        found = self._matches(key, record)
        if found is None:
            problems.append(f"{self.store.describe(key)}: chunk listed in the manifest is missing")
        elif not found:
            problems.append(f"{self.store.describe(key)}: chunk bytes do not match the manifest checksum (tampered or "
                            "corrupt)")
        if record.tensorbin is not None and not self._matches(packed, record.tensorbin):
            problems.append(f"{self.store.describe(packed)}: packed tensor is missing or does not match the manifest "
                            "checksum")
        return problems

    def _matches(self, key: str, record: FileRecord) -> bool | None:
        """Whether the object holds the record's bytes; None when there is no such object."""
        if isinstance(self.store, LocalStore):  # read block by block, not whole: a chunk may be 1.24 GB
            path = self.store.local_file(key)
            return None if path is None else record.matches_file(path)
        data = self.store.get(key)
        return None if data is None else record.matches(data)


class OldFormatError(CacheError):
    """A complete entry in a cache format this code does not read."""

    def __init__(self, message: str, cache_format: int):
        super().__init__(message)
        self.cache_format = cache_format


def open_entry(store: Store, name: str) -> Entry:
    """A published entry: its manifest must exist, parse, and carry the fingerprint its name promises."""
    key = manifest_key(name)
    raw = store.get(key)
    if raw is None:
        remedy = ("published — run `python -m pipeline cache gc` and convert again" if store.can_rename else
                  "pushed (a push in progress, or one that died) — convert again to complete it")
        raise CacheError(f"{store.describe(entry_key(name))}: no {MANIFEST}; the entry was never completely {remedy}")
    try:
        manifest = Manifest.from_json(json.loads(raw))
    except (ValueError, UnicodeDecodeError) as e:
        raise CacheError(f"{store.describe(key)}: manifest is not valid JSON ({e}); convert again with --force") from e
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


def list_entries(store: Store, opened: Entry | None = None) -> Iterator[tuple[str, Entry | None, str]]:
    """Every name under entries/: (name, entry or None, state). States: published; incomplete (being built
    locally, or — where there is no rename — no manifest yet: a push in progress or abandoned); broken (a local
    final name without a valid manifest, which publish-by-rename can never produce). `opened`: an entry of this
    store the caller opened already, handed back as it is (its manifest is not parsed again)."""
    for name in store.children(ENTRIES):
        if TMP_MARK in name:
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
            yield name, None, "broken" if store.can_rename or store.get(manifest_key(name)) is not None else "incomplete"
