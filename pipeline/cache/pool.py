"""What an object store's entries share (pipeline/cache/homes.py `BucketHome`): every chunk and device file is one object under
`objects/`, named by its sha256, and an entry is its manifest, which names the objects it holds. Here: what each
entry's bytes are (shared ones counted once), and the sweep that removes objects no manifest names once they are
older than the grace period (younger ones may belong to a convert whose manifest is not out yet; a convert
freshens an old object before it names it: tasks/entries/store.py `freshen`)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterable, Mapping

from tasks.entries.entry import Entry
from tasks.entries.manifest import decode_manifest
from tasks.entries.names import ENTRIES, OBJECTS, entry_key, is_temporary, manifest_key, object_key
from tasks.entries.objects import present_objects
from tasks.errors import CacheError
from tasks.entries.store import Store


def named_objects(entry: Entry) -> set[str]:
    chunks = {key for arr in entry.manifest.arrays.values() for rec in arr.chunks.values() for key in rec.objects()}
    return chunks | {entry.processor_object(name) for name in entry.manifest.processor}


@dataclass(frozen=True)
class Pool:
    """The store's objects (key -> size) and which entries name each."""
    sizes: Mapping[str, int]
    named_by: Mapping[str, frozenset[str]]

    @classmethod
    def of(cls, store: Store, entries: Iterable[Entry]) -> "Pool":
        names: dict[str, set[str]] = {}
        for e in entries:
            for key in named_objects(e):
                names.setdefault(key, set()).add(e.name)
        return cls(store.sizes(OBJECTS), {k: frozenset(v) for k, v in names.items()})

    def usage(self, store: Store, name: str) -> tuple[int, int, dict]:
        """As `Store.usage` of a folder entry: its bytes (its manifest and every object it names), those no other
        entry names (what removing it frees), and each stored object -> size for totals."""
        own = store.sizes(entry_key(name))
        named = {k: self.sizes[k] for k, names in self.named_by.items() if name in names and k in self.sizes}
        alone = sum(n for k, n in named.items() if self.named_by[k] == {name})
        files = {**own, **named}
        return sum(files.values()), sum(own.values()) + alone, files


def sweep(store: Store, grace_hours: float, dry_run: bool, among: set[str] | None = None,
          removed: set[str] = frozenset()) -> tuple[dict | None, int]:
    """Remove every object under `objects/` (or of `among`) that no manifest names and that was written more than
    `grace_hours` ago. Returns one row saying what went (None when nothing did), and how many objects no manifest
    names stay for being younger. Every manifest is read again here, after whatever the caller removed (`removed`:
    entries a dry run would have removed): one that cannot be read stops the sweep (the objects it names are
    unknown), in one sentence."""
    named: set[str] = set()
    for name in store.children(ENTRIES):
        raw = None if is_temporary(name) or name in removed else store.get(manifest_key(name))
        if raw is None:
            continue
        try:
            doc = decode_manifest(raw)
        except (ValueError, UnicodeDecodeError):
            raise CacheError(f"{store.describe(manifest_key(name))}: not valid JSON, so the objects it names are "
                             "unknown; nothing under objects/ was removed — run `cache gc` again once it is "
                             "removed or repaired") from None
        named.update(_objects_in(doc))
    cutoff = time.time() - grace_hours * 3600
    unnamed = {k: (n, t) for k, (n, t) in present_objects(store).items()
               if k not in named and (among is None or k in among)}
    old = [k for k, (_, t) in unnamed.items() if t < cutoff]
    if not dry_run and old:
        store.delete_many(old)
    freed = sum(unnamed[k][0] for k in old)
    row = {"entry": f"{OBJECTS}/ ({len(old)} objects)", "bytes": freed, "freed_bytes": freed, "refs": [],
           "reason": f"named by no manifest, and written over {grace_hours:g} hours ago (the grace period)"}
    return (row if old else None), len(unnamed) - len(old)


def _objects_in(doc: object) -> Iterable[str]:
    """Every object a manifest names, found by its field wherever it is (whatever format wrote it); a kept processor
    file is the object of its sha256."""
    if isinstance(doc, dict):
        for key, value in doc.items():
            if key == "object" and isinstance(value, str):
                yield value
            elif key == "processor" and isinstance(value, dict):
                yield from (object_key(str(rec.get("sha256"))) for rec in value.values() if isinstance(rec, dict))
            else:
                yield from _objects_in(value)
    elif isinstance(doc, list):
        for value in doc:
            yield from _objects_in(value)
