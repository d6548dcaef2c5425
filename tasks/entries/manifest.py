"""The records an entry is made of, typed: a file's size and checksum, a chunk's, an array's (with its content id),
the identity an entry is named by, the manifest, the progress record of a staged chunk; and the Zarr documents of
an entry's arrays and group. No I/O: tasks/entries/entry.py reads them, tasks/entries/chunks.py writes chunks.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import xxhash

from tasks.numerics import precision
from tasks.io.file_blocks import each_read
from tasks.entries.names import (CACHE_FORMAT, CONTENT_FORMAT, CONVERTER_VERSION, chunk_key, entry_name, is_object_key,
                                 is_whole_number, slot_of, WHOLE)
from tasks.device.one_file import is_tiled, zarr_codecs, zarr_shape
from tasks.entries.zarr_v3 import DATA_TYPES, PLAIN_CODECS, array_metadata, group_metadata
from tasks.plan import Plan, Target
from tasks.source.shards import checked_against


def checksum(data: np.ndarray | bytes | memoryview) -> str:
    """xxh3-64 of raw bytes (about 10 GB/s: cheap enough to verify every chunk on every load)."""
    if isinstance(data, np.ndarray):
        data = memoryview(np.ascontiguousarray(data).reshape(-1).view(np.uint8))
    return xxhash.xxh3_64_hexdigest(data)


def tiled_record(file: np.ndarray, device_end: int, max_abs_err: float, pcc: float,
                 object: str | None = None) -> "ChunkRecord":
    """The record of a tiled chunk (tasks/device/one_file.py): the whole file's size and xxh3, and those of its
    first `device_end` bytes, which ttnn reads; one pass over the bytes gives both."""
    raw = memoryview(np.ascontiguousarray(file).reshape(-1).view(np.uint8))
    digest = xxhash.xxh3_64(raw[:device_end])
    device = FileRecord(device_end, digest.hexdigest())
    digest.update(raw[device_end:])
    return ChunkRecord(len(raw), digest.hexdigest(), max_abs_err, pcc, object=object, device=device)


# -- records ----
@dataclass(frozen=True)
class FileRecord:
    nbytes: int
    xxh3: str
    object: str | None = field(default=None, kw_only=True)  # an object store's key of these bytes (`object_key`);
                                                            # None: the file in the entry's own folder

    def to_json(self) -> dict:
        return {"nbytes": self.nbytes, "xxh3": self.xxh3, **({"object": self.object} if self.object else {})}

    def matches(self, data: np.ndarray | bytes | memoryview | None) -> bool:
        """Whether bytes are this chunk or device file: its size and xxh3."""
        if data is None:
            return False
        size = data.nbytes if isinstance(data, (np.ndarray, memoryview)) else len(data)
        return size == self.nbytes and checksum(data) == self.xxh3

    def matches_file(self, path: Path, size: int | None = None) -> bool:
        """Whether a local file holds these bytes (read block by block: tasks/io/file_blocks.py `each_read`).
        `size`: the file's, when these are only its first bytes (what ttnn reads of a tiled chunk)."""
        if path.stat().st_size != (self.nbytes if size is None else size):
            return False
        digest = xxhash.xxh3_64()
        return each_read(path, lambda block, _: digest.update(block), end=self.nbytes) == self.nbytes and \
            digest.hexdigest() == self.xxh3


def _object(doc: Mapping) -> str | None:
    """A record's object, which must be one of the store's `objects/` (a manifest is a stranger's file too: a key
    such as `../../x` would read outside the cache)."""
    key = doc.get("object")
    if key is not None and not is_object_key(key):
        raise ValueError(f"names {str(key)[:80]!r} for a chunk's bytes, which is not an object under objects/")
    return key


@dataclass(frozen=True)
class ChunkRecord(FileRecord):
    max_abs_err: float = 0.0
    pcc: float = 1.0
    tensorbin: FileRecord | None = None  # ttnn's device file of this chunk, when the plan keeps one
    device: FileRecord | None = field(default=None, kw_only=True)  # a tiled chunk's first bytes, which ttnn reads:
                                                                   # a device load checks those, not the bf16 after

    @property
    def file_bytes(self) -> int:
        """The bytes the entry stores for this chunk: the chunk, and its device file when there is one."""
        return self.nbytes + (self.tensorbin.nbytes if self.tensorbin else 0)

    def to_json(self) -> dict:
        doc = {**FileRecord.to_json(self), "max_abs_err": self.max_abs_err, "pcc": self.pcc}
        if self.tensorbin is not None:
            doc["tensorbin"] = self.tensorbin.to_json()
        if self.device is not None:
            doc["device"] = self.device.to_json()
        return doc

    @classmethod
    def from_json(cls, doc: Mapping) -> "ChunkRecord":
        packed, device = doc.get("tensorbin"), doc.get("device")
        for record in (doc, *(r for r in (packed, device) if r is not None)):
            if not isinstance(record, dict) or not _is_size(record.get("nbytes")) or \
                    not isinstance(record.get("xxh3"), str):
                raise ValueError("has a chunk record without its size and xxh3")
        if device is not None and device["nbytes"] > doc["nbytes"]:
            raise ValueError("has a chunk whose device bytes are more than the chunk")
        return cls(doc["nbytes"], doc["xxh3"], doc.get("max_abs_err", 0.0), doc.get("pcc", 1.0),
                   FileRecord(packed["nbytes"], packed["xxh3"], object=_object(packed)) if packed else None,
                   object=_object(doc), device=FileRecord(device["nbytes"], device["xxh3"]) if device else None)

    def objects(self) -> list[str]:
        """The object-store keys this chunk's bytes are kept under (none for a chunk in its entry's folder)."""
        return [r.object for r in (self, self.tensorbin) if r is not None and r.object]


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
        return precision.source_dtypes(self.attributes.get("source_dtypes"), len(self.attributes["sources"]))

    @property
    def device_layout(self) -> str:
        return str(self.attributes["device_layout"])

    @property
    def tiled(self) -> bool:
        """Whether each chunk is one tiled file, its device file and its values at once (format 7 on:
        tasks/device/one_file.py); else a chunk holds the values in rows, and a device file lies beside it."""
        return self.attributes.get("tiled") is True

    @property
    def chunk_rank(self) -> int:
        """How many coordinates name a chunk of one slot (or of the whole array): the rank of the Zarr array's
        chunk, less a bank's slot axis; a tiled array's chunk is its padded tiles, six dimensions for a matrix."""
        return len(self.chunk_shape) - self.bank

    def to_json(self) -> dict:
        return {"shape": self.shape, "chunk_shape": self.chunk_shape, "attributes": dict(self.attributes),
                "source_xxh3": dict(self.source_xxh3), "content_id": self.content_id,
                "chunks": {chunk_key(s): c.to_json() for s, c in self.chunks.items()}}

    @classmethod
    def from_json(cls, doc: Mapping) -> "ArrayRecord":
        """Checked as it is read, every field the properties above and a load rely on: a manifest edited by hand or
        torn is refused here, once, and never fails later inside a load, a verify or a gc."""
        attributes, chunks = doc["attributes"], doc["chunks"]
        if not isinstance(attributes, dict) or not isinstance(chunks, dict):
            raise ValueError("has attributes or chunks that are not objects")
        for what, shape in (("shape", doc["shape"]), ("chunk shape", doc["chunk_shape"]),
                            ("logical shape", attributes.get("logical_shape"))):
            if not isinstance(shape, list) or not all(_is_size(n) for n in shape):
                raise ValueError(f"has the {what} {str(shape)[:40]}, not a list of sizes")
        if not isinstance(attributes.get("embodiment_bank"), bool) or not all(
                isinstance(attributes.get(k), str) for k in ("device_dtype", "device_layout", "transform")) or \
                str(attributes.get("dtype", "bfloat16")) not in DATA_TYPES:
            raise ValueError("has attributes of the wrong type (embodiment_bank, device_dtype, device_layout, "
                             "transform, dtype)")
        bank = attributes["embodiment_bank"]
        if not chunks or not all(_is_slot(k, doc["shape"]) if bank else k == WHOLE for k in chunks):
            raise ValueError(f"has {'chunks ' + ', '.join(map(str, list(chunks)[:3])) if chunks else 'no chunk'}, "
                             f"not {'slots of its bank' if bank else 'its whole array'}")
        return cls(shape=doc["shape"], chunk_shape=doc["chunk_shape"], attributes=attributes,
                   source_xxh3=doc.get("source_xxh3", {}), content_id=doc.get("content_id", ""),
                   chunks={slot_of(k): ChunkRecord.from_json(c) for k, c in chunks.items()})


MAX_SIZE = 1 << 40  # no dimension or file of a GR00T entry comes near it; a larger one is a damaged record


def _is_size(value: object) -> bool:
    return type(value) is int and 0 <= value < MAX_SIZE


def _is_slot(key: object, shape: list[int]) -> bool:
    return is_whole_number(key) and bool(shape) and int(key) < shape[0]


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
    # the trainer's processor files kept beside the weights: name -> {nbytes, sha256, xxh3}; their sha256s are
    # hashed (a fine-tune whose statistics alone changed is another entry, sharing every tensor)
    processor: Mapping[str, Mapping[str, object]] = field(default_factory=dict)

    @classmethod
    def of(cls, plan: Plan, *, source: Mapping[str, object], shard_sha: Mapping[str, str], slots: tuple[int, ...],
           source_shapes: Mapping[str, tuple[int, ...]], recipes_sha256: str,
           processor: Mapping[str, bytes] | None = None) -> "Identity":
        """Everything that determines an entry's bytes, and its fingerprint (sha256 of the canonical JSON); plus
        `source` (the snapshot folder, the revision read, and whether it is synthetic), recorded but not hashed
        beyond the revision and the synthetic mark: the same bytes in another folder are the same entry.
        `source_shapes` (every checkpoint key's shape, a function of the hashed shards) is recorded so that a
        consumer's own constructors can be run from the entry alone (pipeline/port_n16/). `processor`: the
        trainer's processor files (name -> bytes), kept in the entry by content."""
        kept = {name: processor_record(data) for name, data in sorted((processor or {}).items())}
        doc = {"cache_format": CACHE_FORMAT, "converter": CONVERTER_VERSION, "version": plan.version,
               "revision": source.get("revision"), "synthetic": source.get("synthetic"), "layout": plan.layout,
               "profile": plan.profile, "shards": dict(sorted(shard_sha.items())), "recipes_sha256": recipes_sha256,
               "slots": list(slots),
               "targets": [[t.name, list(t.sources), t.transform, list(t.params), t.device_dtype, t.device_layout]
                           for t in plan.targets]}
        if kept:  # only then: an entry without a processor keeps the fingerprint it always had
            doc["processor"] = {name: rec["sha256"] for name, rec in kept.items()}
        fingerprint = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
        return cls(fingerprint=fingerprint, **{k: v for k, v in doc.items() if k not in ("targets", "processor")},
                   source=dict(source), source_shapes={k: list(v) for k, v in sorted(source_shapes.items())},
                   processor=kept)

    @property
    def name(self) -> str:
        return entry_name(self.version, self.layout, self.profile, self.fingerprint)

    @property
    def shards_checked_against(self) -> dict[str, str]:
        """Shard -> what its bytes were checked against: a published sha256 (an HF blob name), or its content."""
        return {shard: checked_against(identity) for shard, identity in sorted(self.shards.items())}

    def to_json(self) -> dict:  # (a Manifest's identity part, too)
        doc = {f.name: getattr(self, f.name) for f in fields(Identity)}
        if not self.processor:  # what entries without one always wrote
            del doc["processor"]
        return doc


@dataclass(frozen=True)
class Manifest(Identity):
    """`MANIFEST.json`: the entry's identity (what its bytes are a function of: `Identity`'s fields, first), then
    every array and chunk. Entries of format 3 have no `source_shapes` (read as {})."""

    published_unix: float = 0.0
    arrays: Mapping[str, ArrayRecord] = field(default_factory=dict)
    bytes: int = 0
    chunks: int = 0
    shards_sha256: Mapping[str, str] = field(default_factory=dict)  # shard -> sha256, where one was taken (not hashed)

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
                   processor=_processor_records(doc.get("processor", {})), published_unix=doc.get("published_unix", 0.0),
                   arrays={n: _array(n, a) for n, a in doc["arrays"].items()},
                   bytes=doc.get("bytes", 0), chunks=doc.get("chunks", 0),
                   shards_sha256=doc.get("shards_sha256", {}))  # older entries of this format lack it

    def __post_init__(self) -> None:
        if not isinstance(self.slots, list) or not all(_is_size(s) for s in self.slots) or \
                not all(isinstance(v, dict) for v in (self.source, self.source_shapes, self.shards)):
            raise ValueError("has slots, source or shards of the wrong type")

    def encoded(self) -> bytes:
        """`MANIFEST.json` as an object store keeps it: compact and gzipped (1.28 MB -> a quarter of it for a tiny
        N1.6 of every slot, most of what is left being hashes), since it is sent with every entry and read by every
        load. A folder's is indented JSON, one line per array and chunk, for the reader's eye; `decode_manifest`
        reads both."""
        return gzip.compress(json.dumps(self.to_json(), separators=(",", ":")).encode(), compresslevel=6, mtime=0)

    @property
    def is_synthetic(self) -> bool:
        """Converted from the project's synthetic stand-in, not a GR00T release."""
        return bool(self.synthetic or self.source.get("synthetic"))

    @property
    def bank_slots(self) -> int:
        """How many slots the source's embodiment banks have (0: the entry has no bank)."""
        return next((arr.shape[0] for arr in self.arrays.values() if arr.bank), 0)

    def holds_slot(self, slot: int | None) -> bool:
        """Whether every bank has this slot (None: every slot of every bank)."""
        for arr in self.arrays.values():
            wanted = range(arr.shape[0]) if slot is None else (slot,)
            if arr.bank and any(s not in arr.chunks for s in wanted):
                return False
        return True


def processor_record(data: bytes) -> dict:
    """A kept processor file's record: its size, its sha256 (its name in an object store, and its part of the
    entry's identity) and its xxh3 (checked on every read, as a chunk's is)."""
    return {"nbytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "xxh3": checksum(data)}


def processor_matches(record: Mapping[str, object], data: bytes | None) -> bool:
    return data is not None and len(data) == record["nbytes"] and checksum(data) == record["xxh3"] and \
        hashlib.sha256(data).hexdigest() == record["sha256"]


_FILE_NAME = re.compile(r"^[\w.-]{1,200}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _processor_records(doc: object) -> dict[str, dict]:
    """The manifest's processor records, checked: each a plain file name (never a path: the name is where it is
    kept in a folder) with its size and checksums."""
    if not isinstance(doc, dict):
        raise ValueError("has a processor record that is not an object")
    for name, rec in doc.items():
        if not _FILE_NAME.match(name) or name in (".", "..") or not isinstance(rec, dict) or \
                not _is_size(rec.get("nbytes")) or not _SHA256.match(str(rec.get("sha256"))) or \
                not isinstance(rec.get("xxh3"), str):
            raise ValueError(f"records processor file {str(name)[:60]!r} without a plain name, size and checksums")
    return dict(doc)


def _array(name: str, doc: object) -> ArrayRecord:
    if not isinstance(doc, dict):
        raise ValueError(f"records array {name!r} as {type(doc).__name__}, not an object")
    try:
        return ArrayRecord.from_json(doc)
    except ValueError as e:
        raise ValueError(f"records array {name!r}, which {e}") from None


GZIP_MAGIC = b"\x1f\x8b"  # never the first bytes of JSON


def decode_manifest(raw: bytes) -> object:
    """A `MANIFEST.json` as JSON, plain or gzipped (`Manifest.encoded`). ValueError when it is neither."""
    if raw[:2] == GZIP_MAGIC:
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as e:
            raise ValueError(f"is gzip data that does not decompress ({e})") from None
    return json.loads(raw)


def content_id(source_xxh3: Sequence[str], attributes: Mapping[str, object], converter: object) -> str:
    """What one array's bytes are a function of: its sources' bytes, its transform and device format, the
    converter version and how chunks lay out bytes. Equal ids mean equal bytes, whichever entry they sit in."""
    doc = [list(source_xxh3), attributes.get("source_dtypes"), attributes.get("dtype", "bfloat16"), attributes["transform"],
           attributes.get("transform_params", []), attributes["device_dtype"], attributes["device_layout"],
           attributes["logical_shape"], converter, CONTENT_FORMAT]  # bytes laid out another way: another content
    if attributes.get("tiled") is True:  # one tiled file (format 7): never the bytes of a chunk in rows
        doc.append("tiled")
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


# -- documents ----
def array_attributes(t: Target, slots: tuple[int, ...]) -> dict:
    """What a target's array records about itself (cache/README.md, "entries/")."""
    return {"dtype": t.stored_dtype, "sources": list(t.sources),
            "source_dtypes": precision.source_dtypes(t.source_dtypes, len(t.sources)), "transform": t.transform,
            "transform_params": list(t.params), "kind": t.kind, "device_dtype": t.device_dtype,
            "device_layout": t.device_layout, "host_only": t.host, "logical_shape": list(t.shape),
            "embodiment_bank": t.embodiment, "slots": list(slots) if t.embodiment else None, "mirrors": t.mirrors,
            **({"tiled": True} if is_tiled(t) else {})}


def array_documents(plan: Plan, slots: tuple[int, ...]) -> dict[str, dict]:
    """Every target's `zarr.json` document, by target name: a bank keeps every slot addressable, one chunk each; a
    tiled target's array is its padded tiles (tasks/device/one_file.py), cut to `logical_shape` by a reader."""
    out = {}
    for t in plan.targets:
        stored = zarr_shape(t.shape) if is_tiled(t) else list(t.shape)
        shape = (t.bank_slots, *stored) if t.embodiment else stored
        chunks = (1, *stored) if t.embodiment else stored
        codecs = zarr_codecs(list(chunks)) if is_tiled(t) else PLAIN_CODECS
        out[t.name] = array_metadata(shape, chunks, array_attributes(t, slots), codecs)
    return out


def group_document(arrays: Mapping[str, dict], identity: Identity) -> dict:
    """The entry's root `zarr.json`: every array document consolidated, and the identity as `gr00t_cache`."""
    return group_metadata(arrays, {"gr00t_cache": identity.to_json()})
