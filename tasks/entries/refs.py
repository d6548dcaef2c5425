"""Refs: `refs/<version>-<layout>-<profile>[.synthetic].json` names the entry `load` opens for that kind (the
key is the format's, tasks/entries/names.py `ref_key`). Read and written through a `Store`, as entries are.
"""

from __future__ import annotations

import time
from pathlib import PurePosixPath
from typing import Sequence

from tasks.entries.names import ENTRIES, REFS, SYNTHETIC_REF, ref_key
from tasks.errors import CacheError
from tasks.entries.store import Store


def read_ref(store: Store, version: str, layout: str, profile: str, synthetic: bool = False) -> str | None:
    key = ref_key(version, layout, profile, synthetic)
    ref = store.get_json(key)
    if ref is not None and not _names_entry(ref):
        raise CacheError(f"{store.describe(key)}: is not a ref (an object naming an entry: {{\"entry\": NAME}}); "
                         "convert again to write it anew, or load with --entry NAME")
    return None if ref is None else ref["entry"]


def _names_entry(ref: object) -> bool:
    """A ref as `write_ref` writes it: an object naming an entry."""
    return isinstance(ref, dict) and isinstance(ref.get("entry"), str)


def write_ref(store: Store, version: str, layout: str, profile: str, name: str, synthetic: bool = False) -> None:
    store.put_json(ref_key(version, layout, profile, synthetic), {"entry": name, "updated_unix": time.time()})


UNREADABLE_REF = " (unreadable)"  # how `refs()` lists a ref it cannot read


def refs(store: Store) -> dict[str, list[str]]:
    """Entry name -> the refs that point to it (what `load` opens: in use). A ref that cannot be read (torn, hand
    edited) might name any entry of its version, layout and profile, so it is listed against each of them as
    `<stem> (unreadable)`: gc keeps what `load` may open, and gc and rm never delete that ref."""
    out: dict[str, list[str]] = {}
    names: list[str] | None = None
    for key in store.list(REFS):
        if not key.endswith(".json"):
            continue
        stem = PurePosixPath(key).stem
        try:
            ref = store.get_json(key)
        except CacheError:
            ref = None
        if _names_entry(ref):
            out.setdefault(ref["entry"], []).append(stem)
            continue
        names = store.children(ENTRIES) if names is None else names
        kind = stem.removesuffix(SYNTHETIC_REF) + "-"  # <version>-<layout>-<profile>-
        for name in names:
            if name.startswith(kind):
                out.setdefault(name, []).append(stem + UNREADABLE_REF)
    return out


def readable(ref_stems: Sequence[str]) -> list[str]:
    """The refs of `refs()` that can be deleted with their entry (not the unreadable ones)."""
    return [r for r in ref_stems if not r.endswith(UNREADABLE_REF)]
