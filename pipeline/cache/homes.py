"""Where a cache's entries go: one class per kind of cache, and the only code that asks which kind it has.

A `Store` (tasks/entries/store.py) moves bytes. A home decides what they mean for an entry:
- **a folder** (`FolderHome`) builds an entry under a temporary name beside its final one, gives it another entry's
  bytes by hard links, and publishes it by one rename; a manifest-less final name is broken (a rename cannot make
  one). Readers hold leases (pipeline/cache/leases.py), since every process shares the folder.
- **a bucket** (`BucketHome`) has no rename and no links: every stage task puts its objects under `objects/` from
  the worker that ran it, an entry names the objects it holds (shared by every entry that holds the same bytes),
  and the manifest goes last; a name without its manifest is a push in progress or abandoned. A pid means nothing
  on another machine, so there are no leases; `cache gc` sweeps objects no manifest names once past the grace
  period. A load keeps what it fetched in the local cache (tasks/entries/fetched.py), and a convert with a device
  open builds the entry in the local cache and pushes it after.
What a new kind of file in an entry needs (a processor file, one file per target) is written once per home.
"""

from __future__ import annotations

import contextlib
import errno
import shutil
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ContextManager, Mapping

from pipeline.cache import leases
from pipeline.cache.pool import Pool, named_objects, sweep
from pipeline.cache.roots import cache_root, claim_tmp, entries_dir, entry_at
from tasks.entries.chunks import create_arrays
from tasks.entries.entry import UNPUBLISHED, Entry, list_entries
from tasks.entries.fetched import KeepingStore
from tasks.entries.manifest import ArrayRecord, Staged, processor_record
from tasks.entries.names import ENTRIES, FETCHED, PORT_MODELS, PROCESSOR_DIR, entry_key, manifest_key, object_key
from tasks.entries.objects import FRESH_FOR, Listing, present_objects, still_held
from tasks.entries.progress import adopt_staged
from tasks.entries.publish import push
from tasks.entries.object_stores import ObjectStore
from tasks.entries.store import LocalStore, Store
from tasks.errors import CacheError
from tasks.io.bulk_write import writes_finished
from tasks.plan import Plan
from tasks.places import InBucket, InFolder, Place

READ_THREADS = 4  # a load's chunk reads and checks overlap on a small pool (I/O waits and hashing release the GIL)
Held = Mapping[tuple[str, int | None], tuple[Staged, str, dict[str, tuple[str, int]]]]  # unit -> record, holder, keys


@dataclass
class Site:
    """One entry being built: where (`key` in its home's store), the graph's place for it, and what the run must
    know of it."""
    key: str
    place: Place
    listing: Listing = field(default_factory=Listing)  # an object store's objects when the build began
    folder: Path | None = None                         # the folder it is built in, which a cluster's workers must see
    store: ObjectStore | None = None                   # the object store every worker must reach


class EntryHome(ABC):
    """Where the entries of one cache go (the module's docstring). Each home answers every question below its own
    way; none answers for the other."""

    unpublished_state: str   # a final name without its manifest, as `cache ls` says it
    unpublished_remedy: str  # and what to do about it, as a reader says it
    over_network: bool       # every request crosses a network, which a summary counts the retries of

    def __init__(self, store: Store):
        self.store = store

    @property
    @abstractmethod
    def local_root(self) -> Path:
        """This machine's folder for the cache: the source-hash memo, a build with a device open, what loads keep."""

    # -- building -----------------------------------------------------------------------------------------------
    @abstractmethod
    def builder(self, device_open: bool) -> "EntryHome":
        """The home an entry is built in: itself, or one that can hold an open device's build."""

    @abstractmethod
    def start(self, name: str, *, replace: bool, behind: bool) -> Site:
        """Begin building entry `name` (`replace`: --force; `behind`: stage writes may be handed off)."""

    @abstractmethod
    def lay_out(self, site: Site, plan: Plan, slots: tuple[int, ...], arrays: Mapping[str, dict],
                reused: Mapping, holders: list[str], processor: Mapping[str, bytes]) -> dict:
        """Put in place what the graph does not write (the arrays' documents, the trainer's processor files); the
        units that need no conversion, keyed (target, slot): those `reused`, and a killed run's still whole."""

    @abstractmethod
    def abandon(self, site: Site, error: BaseException) -> None:
        """After `error` stopped the build at `site`: leave nothing half-built that a later run cannot take over."""

    @abstractmethod
    def sent(self, site: Site, result: dict) -> int | None:
        """The bytes the workers sent to the store (None: nothing went over a network)."""

    @abstractmethod
    def push(self, built: "EntryHome", name: str, progress: bool) -> tuple[str, int] | None:
        """When `built` is not this home: copy its published entry `name` here; where it was built and the bytes
        sent (None: it was built here)."""

    # -- giving a new entry another entry's bytes ----------------------------------------------------------------
    @abstractmethod
    def gives(self, array: ArrayRecord) -> bool:
        """Whether an array of a published entry can be given to a new one."""

    @abstractmethod
    def give(self, held: Held, listing: Listing) -> set[str]:
        """Give each held chunk and device file to the entry being built; the new keys that now stand for them."""

    # -- reading -------------------------------------------------------------------------------------------------
    @abstractmethod
    def is_published(self, name: str) -> bool:
        """Whether the final name `name` is an entry to open (a broken one says so when opened)."""

    @abstractmethod
    def reading(self, name: str) -> ContextManager:
        """Hold entry `name` while reading it, so that gc and rm leave it alone."""

    @abstractmethod
    def readers(self, name: str) -> list[int]:
        """The live processes reading entry `name`."""

    @abstractmethod
    def keeping(self) -> KeepingStore | None:
        """The store a load reads through, keeping what it fetches (None: it reads local files, and keeps nothing)."""

    @abstractmethod
    def read_threads(self, transfers: int) -> int:
        """Chunk reads a load runs at once (`transfers`: asked for an object store)."""

    # -- sizes and removing ----------------------------------------------------------------------------------------
    @abstractmethod
    def usage_of(self, entries: list[Entry]) -> Callable[[str], tuple[int, int, dict]]:
        """For the listed `entries`: name -> its bytes, its own bytes (what removing it frees), and each stored
        file's identity -> size, for totals that count shared bytes once."""

    @abstractmethod
    def usage_of_one(self, name: str) -> tuple[int, int, Entry | None]:
        """Entry `name`'s bytes and its own (as `usage_of`), and the entry, where removing it removes more."""

    @abstractmethod
    def delete_unread(self, name: str) -> bool:
        """Delete entry `name` unless a process reads it; False (nothing deleted) if one does."""

    @abstractmethod
    def freed_by_removing(self, entry: Entry | None, grace_hours: float, dry_run: bool) -> tuple[int, int] | None:
        """After `cache rm` removed `entry` (`usage_of_one`'s): the bytes of what went with it, and how many of its
        files stay for being young (None: nothing goes with an entry)."""

    @abstractmethod
    def tidy(self, grace_hours: float, dry_run: bool, removed: set[str], unused_before: float | None,
             days: float | None) -> list[dict]:
        """The rest of `cache gc`, after its entries: one row per kind of thing removed."""


class FolderHome(EntryHome):
    unpublished_state = "broken"
    unpublished_remedy = UNPUBLISHED
    over_network = False

    def __init__(self, store: LocalStore):
        super().__init__(store)
        self.folder: LocalStore = store

    @property
    def local_root(self) -> Path:
        return self.folder.root

    def builder(self, device_open: bool) -> EntryHome:
        return self

    def start(self, name: str, *, replace: bool, behind: bool) -> Site:
        tmp = claim_tmp(self.local_root, name)
        return Site(tmp.relative_to(self.local_root).as_posix(),
                    InFolder(str(tmp), str(entries_dir(self.local_root) / name), behind, replace), folder=tmp)

    def lay_out(self, site, plan, slots, arrays, reused, holders, processor) -> dict:
        if processor:
            folder = site.folder / PROCESSOR_DIR
            folder.mkdir(exist_ok=True)
            for name, data in processor.items():
                (folder / name).write_bytes(data)
        create_arrays(site.folder, arrays, like=[self.folder.path(entry_key(e)) for e in holders])
        return adopt_staged(site.folder, plan.targets, slots, reused)

    def abandon(self, site: Site, error: BaseException) -> None:
        """A kill -9 never gets here and Ctrl-C is let through, so their folder stays for the next run to resume;
        an error must not leave a half-built folder behind (nor a write handed off make it again). A full disk is
        said in one sentence."""
        with contextlib.suppress(Exception):  # the error being raised is `error`; a handed-off write's is a symptom
            writes_finished(site.folder)
        if not isinstance(error, KeyboardInterrupt):
            shutil.rmtree(site.folder, ignore_errors=True)
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            name = Path(site.place.final).name
            raise CacheError(f"{error.filename or site.folder}: no space left on the device while staging {name}; "
                             "nothing was published and the temporary files were removed — free space or pass "
                             "--cache DIR on a larger disk") from error

    def sent(self, site: Site, result: dict) -> None:
        return None

    def push(self, built: EntryHome, name: str, progress: bool) -> None:
        return None  # a folder holds an open device's build itself

    def gives(self, array: ArrayRecord) -> bool:
        return True

    def give(self, held: Held, listing: Listing) -> set[str]:
        """Hard links: each held file becomes a file of the new entry, under a lease on its holder meanwhile (a
        link outlives its source, but a holder removed first leaves nothing to link)."""
        with contextlib.ExitStack() as held_open:
            kept = {e for e in {e for _, e, _ in held.values()} if self._hold(held_open, e)}
            wanted = {new: old for _, e, objects in held.values() if e in kept for new, (old, _) in objects.items()}
            return self.folder.copy_many(wanted)

    def _hold(self, stack: contextlib.ExitStack, name: str) -> bool:
        try:
            stack.enter_context(self.reading(name))
        except CacheError:
            return False
        return True

    def is_published(self, name: str) -> bool:
        return True  # a rename made it; one without its manifest is broken, and says so when opened

    def reading(self, name: str) -> ContextManager:
        return leases.reading(self.folder, name)

    def readers(self, name: str) -> list[int]:
        return leases.readers(self.folder, name)

    def keeping(self) -> None:
        return None

    def read_threads(self, transfers: int) -> int:
        return READ_THREADS

    def usage_of(self, entries: list[Entry]) -> Callable[[str], tuple[int, int, dict]]:
        return lambda name: self.folder.usage(entry_key(name))  # hard links: the files' own link counts say it

    def usage_of_one(self, name: str) -> tuple[int, int, None]:
        size, own, _ = self.folder.usage(entry_key(name))
        return size, own, None

    def delete_unread(self, name: str) -> bool:
        return leases.delete_unread(self.folder, name)

    def freed_by_removing(self, entry: Entry | None, grace_hours: float, dry_run: bool) -> None:
        return None

    def tidy(self, grace_hours, dry_run, removed, unused_before, days) -> list[dict]:
        if not dry_run:  # the port's models kept for entries that are gone (a start kept one as its entry went)
            for name in set(self.folder.children(PORT_MODELS)) - set(self.folder.children(ENTRIES)):
                self.folder.delete(f"{PORT_MODELS}/{name}")
        return [] if unused_before is None else self._unused_fetches(unused_before, days, dry_run)

    def _unused_fetches(self, cutoff: float, days: float, dry_run: bool) -> list[dict]:
        """What loads from an object store kept here (tasks/entries/fetched.py), unused since `cutoff` (a load that
        uses a kept file touches it): one row for all of them. The bucket still holds them."""
        folder = self.folder.path(FETCHED)
        old = [p for p in folder.iterdir() if p.is_file() and p.stat().st_mtime < cutoff] if folder.is_dir() else []
        if not old:
            return []
        size = sum(p.stat().st_size for p in old)
        for p in old if not dry_run else ():
            p.unlink(missing_ok=True)
        return [{"entry": f"{FETCHED}/ ({len(old)} files)", "reason": f"kept from an object store, unused for "
                 f"{days:g} days", "bytes": size, "freed_bytes": size, "refs": []}]


class BucketHome(EntryHome):
    store: ObjectStore
    unpublished_state = "incomplete (no manifest: a push in progress or abandoned)"
    unpublished_remedy = "pushed (a push in progress, or one that died) — convert again to complete it"
    over_network = True

    @property
    def local_root(self) -> Path:
        return cache_root(None)

    def builder(self, device_open: bool) -> EntryHome:
        return FolderHome(LocalStore(self.local_root)) if device_open else self

    def start(self, name: str, *, replace: bool, behind: bool) -> Site:
        present = present_objects(self.store)
        listing = Listing(present, time.time() - FRESH_FOR)
        url = self.store.url  # what the workers reopen it from
        return Site(entry_key(name), InBucket(url, name, self.store.stall, present, listing.fresh_after), listing,
                    store=self.store)

    def lay_out(self, site, plan, slots, arrays, reused, holders, processor) -> dict:
        # sent even where the store has them: a few kilobytes, and the put dates them now, so that `cache gc` leaves
        # them until the manifest names them
        for data in processor.values():
            self.store.put(object_key(processor_record(data)["sha256"]), data)
        return dict(reused)

    def abandon(self, site: Site, error: BaseException) -> None:
        pass  # what the workers put is named by no manifest: the next convert finds it there, or gc sweeps it

    def sent(self, site: Site, result: dict) -> int:
        present = site.listing.present
        return sum(n for k, n in result["objects"].items() if k not in present) + result["document_bytes"]

    def push(self, built: EntryHome, name: str, progress: bool) -> tuple[str, int] | None:
        if built is self:
            return None
        final = entries_dir(built.local_root) / name
        return str(final), push(entry_at(final), self.store, progress)

    def gives(self, array: ArrayRecord) -> bool:
        return all(r.objects() for r in array.chunks.values())  # an older format's chunks named no objects

    def give(self, held: Held, listing: Listing) -> set[str]:
        """Nothing is copied: the new manifest names the holder's objects. Those the store still holds count as
        given, an old one once it is freshened."""
        there = still_held(self.store, {old: size for _, _, objects in held.values() for old, size in objects.values()},
                           listing.present, listing.fresh_after)
        return {new for _, _, objects in held.values() for new, (key, _) in objects.items() if key in there}

    def is_published(self, name: str) -> bool:
        return self.store.get(manifest_key(name)) is not None  # the manifest goes last: without it, not there yet

    def reading(self, name: str) -> ContextManager:
        return contextlib.nullcontext()  # a pid means nothing to another machine

    def readers(self, name: str) -> list[int]:
        return []

    def keeping(self) -> KeepingStore:
        return KeepingStore(self.store, self.local_root / FETCHED)

    def read_threads(self, transfers: int) -> int:
        return max(1, transfers)  # each waits on the network, not on a core

    def usage_of(self, entries: list[Entry]) -> Callable[[str], tuple[int, int, dict]]:
        pool = Pool.of(self.store, entries)  # one listing of objects/ for every entry
        return lambda name: pool.usage(self.store, name)

    def usage_of_one(self, name: str) -> tuple[int, int, Entry | None]:
        entries = [e for _, e, _ in list_entries(self.store) if e is not None]
        size, own, _ = self.usage_of(entries)(name)
        return size, own, next((e for e in entries if e.name == name), None)

    def delete_unread(self, name: str) -> bool:
        self.store.delete(entry_key(name))  # no leases: nothing here can tell a reader on another machine
        return True

    def freed_by_removing(self, entry, grace_hours, dry_run) -> tuple[int, int] | None:
        if entry is None:
            return None
        swept, young = sweep(self.store, grace_hours, dry_run, among=named_objects(entry), removed={entry.name})
        return (swept["freed_bytes"] if swept else 0), young

    def tidy(self, grace_hours, dry_run, removed, unused_before, days) -> list[dict]:
        swept, _ = sweep(self.store, grace_hours, dry_run, removed=removed)
        return [swept] if swept else []


def home_of(store: Store) -> EntryHome:
    """The home of a cache's entries: a folder's, or an object store's."""
    return FolderHome(store) if isinstance(store, LocalStore) else BucketHome(store)


def reading(store: Store, name: str) -> ContextManager:
    """Hold a lease on entry `name` while reading it (pipeline/cache/leases.py; an object store has none)."""
    return home_of(store).reading(name)


def readers(store: Store, name: str) -> list[int]:
    """The live processes reading entry `name`."""
    return home_of(store).readers(name)


def build_root(store: Store) -> Path:
    """Where entries are built: in the cache itself when it is a folder, else in the local cache (and pushed from
    there, manifest last)."""
    return home_of(store).local_root


def build_store(store: Store) -> Store:
    """The store of `build_root`."""
    return LocalStore(build_root(store))

