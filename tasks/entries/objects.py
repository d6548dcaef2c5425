"""An object store's shared objects (`objects/<sha256>`, tasks/entries/names.py `object_key`) as a convert meets
them: what the store holds when the convert begins, and which of those it may name without sending them again. And
how long `cache gc` leaves one alone: it removes an object no manifest names once it is older than the grace period,
so one written long ago is freshened before a convert names it (as git freshens an object it would otherwise have
written again)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Mapping

from tasks.entries.names import OBJECTS
from tasks.entries.store import Store

GRACE_HOURS = 24.0  # `cache gc --grace-hours`: an object (or a push without its manifest) written this recently may
                    # belong to a convert in flight, and stays
FRESH_FOR = GRACE_HOURS * 3600 / 2  # seconds: an object older than this that a convert names is freshened first

Present = Mapping[str, tuple[int, float]]  # key -> (size, when last written)


@dataclass(frozen=True)
class Listing:
    """An object store's `objects/` as one listing saw them (`present`), and the time before which an object
    counts as old (`fresh_after`): a convert that names an old one freshens it first, so that `cache gc` leaves it
    until the new manifest is out. Empty for a local folder, which names no objects."""
    present: Present = field(default_factory=dict)
    fresh_after: float = 0.0


def present_objects(store: Store) -> dict[str, tuple[int, float]]:
    """Every object under `objects/` with its size and when it was last written. One the store lists without a time
    is taken as written now: gc never deletes what it cannot date (a convert may be pushing it)."""
    now = time.time()
    return {key: (size, now if when is None else when) for key, (size, when) in store.sizes_and_times(OBJECTS).items()}


def still_held(store: Store, wanted: Mapping[str, int], present: Present, fresh_after: float) -> set[str]:
    """Which of `wanted` (key -> size) the store holds, by `present`, so that they need not be sent: each of the
    right size, those written before `fresh_after` once freshened (one gone meanwhile is not held)."""
    held = {key for key, size in wanted.items() if key in present and present[key][0] == size}
    old = [key for key in held if present[key][1] < fresh_after]
    return held - (set(old) - store.freshen(old))
