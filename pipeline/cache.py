"""Cache entries: named by content, built in a temporary directory beside the final one, published by rename.

The format is written down in cache/README.md and defined in tasks/entry.py, which also names an entry: a
fingerprint of everything that determines its bytes (`Identity.of`: source content, recipe and profile, selected
slots, format and converter versions). `refs/<version>-<layout>-<profile>` names the entry the last conversion
produced, so a later process can load without touching the source checkpoint.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from tasks import source
from tasks.checkpoint import Checkpoint
from tasks.bulk_write import write_json_atomic
from tasks.entry import (ENTRIES, TMP_MARK, Entry, OldFormatError, entry_key, list_entries, manifest_key, open_entry,
                         ref_key, ref_object, tmp_name, tmp_owner)
from tasks.refs import read_ref, readable, refs
from tasks.errors import CacheError
from tasks.store import LocalStore, Store, open_store



def _default_root() -> Path:
    """The source checkout's `cache/` when running from one (its cache/README.md is there), else, installed from a
    wheel, the user's cache folder ($XDG_CACHE_HOME/gr00t-tt, ~/.cache/gr00t-tt): never site-packages."""
    checkout = Path(__file__).resolve().parent.parent
    if (checkout / "cache" / "README.md").is_file() and (checkout / "pyproject.toml").is_file():
        return checkout / "cache"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gr00t-tt"


DEFAULT_ROOT = _default_root()


def cache_root(root: Path | str | None = None) -> Path:
    """The local cache: `--cache`, else $GR00T_CACHE when it names a folder, else the project's `cache/` folder.
    (An object-store $GR00T_CACHE is handled by convert/load, which build locally here and push there.)"""
    env = os.environ.get("GR00T_CACHE")
    return Path(root or (env if env and "://" not in env else None) or DEFAULT_ROOT)


def _stat_key(path: Path) -> dict:
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}


def source_sha256(root: Path, ck: Checkpoint) -> tuple[dict[str, str], dict[str, source.VerifiedShard]]:
    """Content identity per shard: the HF blob name when there is one, else a remembered hash of this exact file
    (path, size, mtime, inode), else hashed now and remembered. A shard hashed now gets its sha256 and every
    tensor's xxh3 at once, on every core (tasks/source.py: hash_shards); those are returned too, verified (the
    graph and reuse take them as they are: a fresh folder is not hashed twice)."""
    out, todo = {}, []
    for shard in sorted(ck.headers):
        named = ck.blob_sha256(shard)
        if named:
            out[shard] = named
            continue
        stat = _stat_key(ck.shard_path(shard))
        record = root / "sources" / (hashlib.sha256(stat["path"].encode()).hexdigest()[:32] + ".json")
        try:
            known = json.loads(record.read_text())
            if known["stat"] == stat:
                out[shard] = known["sha256"]
                continue
        except (OSError, ValueError, KeyError):
            pass
        todo.append((shard, stat, record))
    hashed = dict(zip((t[0] for t in todo), source.hash_shards([ck.headers[t[0]] for t in todo], os.cpu_count() or 1)))
    for shard, stat, record in todo:
        out[shard] = hashed[shard].sha256
        write_json_atomic(record, {"stat": stat, "sha256": out[shard]})
    return out, hashed


def entries_dir(root: Path) -> Path:
    return root / ENTRIES


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def claim_tmp(root: Path, name: str) -> Path:
    """A fresh temporary directory for `name`, adopting the work of a dead process that was building the same
    entry (resume), and removing other orphans of dead processes."""
    base = entries_dir(root)
    base.mkdir(parents=True, exist_ok=True)
    mine = base / tmp_name(name, os.getpid(), uuid.uuid4().hex[:8])
    for orphan in sorted(base.glob(f"*{TMP_MARK}*"), key=lambda p: p.stat().st_mtime, reverse=True):
        owner = tmp_owner(orphan.name)
        if owner is None or _pid_alive(owner):
            continue
        try:
            if orphan.name.startswith(name + TMP_MARK) and not mine.exists():
                os.rename(orphan, mine)  # resume: rename is atomic, so two resumers cannot both adopt it
            else:
                shutil.rmtree(orphan)
        except FileNotFoundError:
            pass  # another process adopted or removed it first
    mine.mkdir(exist_ok=True)
    return mine


def cache_store(root: Store | Path | str | None = None) -> Store:
    """The cache `--cache` names, else $GR00T_CACHE (a folder or an object-store URL), else the project's folder."""
    return open_store(root if root is not None else os.environ.get("GR00T_CACHE") or DEFAULT_ROOT)


def build_root(store: Store) -> Path:
    """Where entries are built: in the cache itself when it can publish by rename, else in the local cache (and
    pushed from there, manifest last)."""
    return store.root if isinstance(store, LocalStore) else cache_root(None)


def entry_at(path: Path) -> Entry:
    """The published entry in a local folder `<root>/entries/<name>`."""
    return open_entry(LocalStore(path.parent.parent), path.name)


def find_entry(store: Store, name: str) -> Entry | None:
    """The published entry `name`, or None. Where there is no rename, an entry without its manifest is a push not
    finished: not there yet (converting pushes it again). A local one is broken, and says so."""
    if name not in store.children(ENTRIES):
        return None
    if not store.can_rename and store.get(manifest_key(name)) is None:
        return None
    return open_entry(store, name)


class SyntheticWeightsWarning(UserWarning):
    """`load` handed out weights converted from the project's synthetic stand-in, not from a GR00T release."""


def resolve_ref(store: Store, version: str, layout: str, profile: str) -> Entry:
    """The entry the last conversion of a release produced, else (none) the last synthetic conversion's."""
    for synthetic in (False, True):
        name = read_ref(store, version, layout, profile, synthetic)
        if name is None:
            continue
        if name not in store.children(ENTRIES):
            raise CacheError(f"{store.describe(ref_key(version, layout, profile, synthetic))}: names entry {name}, "
                             f"which is not in {store.describe(ENTRIES)}; convert again")
        return open_entry(store, name)
    raise CacheError(f"{store.describe(ref_key(version, layout, profile))}: no converted {version} ({layout}, "
                     f"{profile}) in cache {store.describe('')}; run `make convert VERSION={version} LAYOUT={layout} "
                     f"PROFILE={profile}` first")


@dataclass(frozen=True)
class Wanted:
    """Which entry a reload asks for: a version, layout and profile (resolved), the slot it must hold (None: every
    slot), and what may narrow it: an entry name or fingerprint prefix, the source revision, the snapshot folder
    that was converted."""
    version: str
    layout: str
    profile: str
    slot: int | None = None
    entry: str | None = None
    revision: str | None = None
    source: str | Path | None = None

    def fits(self, e: Entry) -> bool:
        m, snapshot = e.manifest, e.manifest.source.get("snapshot")
        same_source = self.source is None or (snapshot is not None and
                                              Path(str(snapshot)).resolve() == Path(self.source).resolve())
        return m.holds_slot(self.slot) and self.revision in (None, m.revision) and same_source

    def kind(self) -> tuple[str, str, str]:
        return self.version, self.layout, self.profile


def choose_entry(store: Store, wanted: Wanted) -> Entry:
    """The entry `load` opens: `wanted.entry` (a name or a fingerprint prefix) when given; else the one the ref
    names, if it fits (revision, slot, source); else the newest published entry of this version, layout and
    profile that does. An entry converted from a release always wins over a synthetic one (whose refs are their
    own). An error lists what there is."""
    unreadable, current, kind = None, None, wanted.kind()
    if wanted.entry is None and any(read_ref(store, *kind, s) for s in (False, True)):
        try:  # a ref that names a missing or broken entry is said, never stepped over
            current = resolve_ref(store, *kind)
        except OldFormatError as e:  # (after an upgrade: the newest entry of this format, if any, else this)
            unreadable = e
        if current is not None and not current.manifest.is_synthetic and wanted.fits(current):
            return current  # the common case: one manifest read, no listing
    published = [e for _, e, state in list_entries(store) if state == "published"]
    if wanted.entry is not None:
        return _named_entry(store, published, wanted)
    same = [e for e in published if (e.manifest.version, e.manifest.layout, e.manifest.profile) == kind]
    match = sorted((e for e in same if wanted.fits(e)),
                   key=lambda e: (not e.manifest.is_synthetic, current is not None and e.name == current.name,
                                  e.manifest.published_unix), reverse=True)
    if match:
        return match[0]
    if unreadable is not None:
        raise unreadable  # what the ref names is of an older format: say so, not "convert first"
    if current is None and not same:
        return resolve_ref(store, *kind)  # the "convert first" error
    slot, revision = wanted.slot, wanted.revision
    want = " and ".join(x for x in (f"slot {slot}" if slot is not None else "every slot",
                                    f"revision {revision}" if revision else "",
                                    f"source {wanted.source}" if wanted.source else "") if x)
    have = "; ".join(f"{e.name}: slots {e.manifest.slots}, revision {e.manifest.revision}" for e in same)
    raise CacheError(f"{store.describe(ENTRIES)}: no published {wanted.version} ({wanted.layout}, {wanted.profile}) "
                     f"entry holds {want} ({have}); convert with --embodiments {slot if slot is not None else 'all'}"
                     f"{f' --revision {revision}' if revision else ''}")


def _named_entry(store: Store, published: list[Entry], wanted: Wanted) -> Entry:
    found = [e for e in published if e.name == wanted.entry or e.manifest.fingerprint.startswith(wanted.entry)]
    if len(found) != 1:
        names = ", ".join(e.name for e in (found or published)) or "none"
        raise CacheError(f"{store.describe(ENTRIES)}: {'no' if not found else 'more than one'} entry matches "
                         f"{wanted.entry!r} ({'candidates' if found else 'entries'}: {names})")
    if found[0].manifest.version != wanted.version:
        raise CacheError(f"{found[0].describe()}: is a {found[0].manifest.version} entry, not {wanted.version}; pass "
                         f"--version {found[0].manifest.version}, or an entry of {wanted.version}")
    return found[0]


def warn_if_synthetic(opened: Entry, acknowledged: bool) -> None:
    """A synthetic entry handed out by the Python API says so, unless the caller said it knows."""
    if opened.manifest.is_synthetic and not acknowledged:
        import warnings

        warnings.warn(SyntheticWeightsWarning(
            f"{opened.name} holds SYNTHETIC weights ({opened.manifest.source.get('synthetic') or opened.manifest.synthetic}),"
            " not a GR00T release; pass synthetic=True to load them without this warning"), stacklevel=3)


LEASES = "leases"  # `leases/<entry>.lock` (the lock) and `leases/<entry>@<pid>-<random>` (who reads it)


def _lock_path(store: LocalStore, name: str) -> Path:
    return store.root / LEASES / f"{name}.lock"


def _locked(store: LocalStore, name: str, mode: int):
    """The entry's lock file, open and flock()ed in `mode`, or None when it is busy (LOCK_NB). Retried when a
    remover unlinked the file while this process waited on it, so that the lock held is always the one the
    path names."""
    while True:
        lock = open(_lock_path(store, name), "a")
        try:
            fcntl.flock(lock, mode)
        except BlockingIOError:
            lock.close()
            return None
        try:
            if os.fstat(lock.fileno()).st_ino == os.stat(_lock_path(store, name)).st_ino:
                return lock
        except FileNotFoundError:
            pass
        lock.close()


@contextlib.contextmanager
def reading(store: Store, name: str):
    """Hold a lease on entry `name` while reading it: a shared lock on `leases/<name>.lock`, which `gc` and `rm`
    must hold exclusively to delete the entry (the kernel drops it with the process, so a dead reader holds
    nothing), and `leases/<name>@<pid>-<random>`, which names the reader in their messages. Once the lock is held
    the entry must still be there: one removed after it was chosen is said, never half read. Local caches only: a
    pid means nothing to another machine, so an object-store entry has no lease."""
    if not isinstance(store, LocalStore):
        yield
        return
    lease = store.root / LEASES / f"{name}@{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        lease.parent.mkdir(parents=True, exist_ok=True)
        lease.touch()
        lock = _locked(store, name, fcntl.LOCK_SH)  # waits while a remover deletes the entry
    except OSError:  # a read-only cache: nothing can remove the entry either
        lease.unlink(missing_ok=True)
        yield
        return
    try:
        if not store.path(manifest_key(name)).is_file():
            raise CacheError(f"{store.describe(entry_key(name))}: was removed (`cache rm` or `cache gc`) while it was "
                             "being opened; load again")
        yield
    finally:
        lock.close()
        lease.unlink(missing_ok=True)


def _delete_unread(store: Store, name: str) -> bool:
    """Delete entry `name` unless a process is reading it; False (and nothing deleted) if one is. Locally the
    entry's lock is taken exclusively first, so no reader can start on it meanwhile, and its lock file goes with
    it: a reader that waited on it then finds the entry gone."""
    if not isinstance(store, LocalStore):
        store.delete(entry_key(name))
        return True
    try:
        _lock_path(store, name).parent.mkdir(parents=True, exist_ok=True)
        lock = _locked(store, name, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        raise CacheError(f"{store.describe(LEASES)}: cannot take the lock of entry {name} ({e.strerror}); check the "
                         "cache folder's permissions") from None
    if lock is None:
        return False
    with lock:
        store.delete(entry_key(name))
        _lock_path(store, name).unlink(missing_ok=True)
    return True


def _removed_unless_read(store: Store, name: str, dry_run: bool) -> bool:
    """gc's removal of one entry: False, and nothing removed, while a live process reads it."""
    if readers(store, name):
        return False
    if dry_run:
        return True
    if TMP_MARK in name:  # a dead process's temporary: nothing reads one
        store.delete(entry_key(name))
        return True
    return _delete_unread(store, name)


def readers(store: Store, name: str) -> list[int]:
    """The live processes holding a lease on entry `name`."""
    if not isinstance(store, LocalStore) or not (store.root / LEASES).is_dir():
        return []
    pids = []
    for lease in (store.root / LEASES).glob(f"{name}@*"):
        try:
            pid = int(lease.name.rsplit("@", 1)[1].split("-", 1)[0])
        except ValueError:
            continue
        if _pid_alive(pid):
            pids.append(pid)
        else:
            lease.unlink(missing_ok=True)
    return pids


def entry_rows(store: Store, only: str | None = None, verify: bool = False, totals: dict | None = None) -> list[dict]:
    """`cache ls` / `cache verify`: one row per entry (state, identity, bytes on disk, refs), the same for every
    store. Bytes shared with another entry by hard links (reuse) are counted once in `unique_bytes`."""
    in_use, seen, now, rows = refs(store), {}, time.time(), []
    for name, entry, state in list_entries(store):
        if only and name != only:
            continue
        if verify and entry is not None:
            problems = entry.verify()
            state = "verified" if not problems else f"CORRUPT ({len(problems)} chunks): {problems[0]}"
        elif state == "incomplete" and TMP_MARK not in name:
            state = "incomplete (no manifest: a push in progress or abandoned)"
        size, unique, files = store.usage(entry_key(name))
        seen.update(files)
        m = entry.manifest if entry else None
        rows.append({"entry": name, "state": state, "version": m and m.version, "layout": m and m.layout,
                     "profile": m and m.profile, "slots": m and m.slots, "revision": m and m.revision,
                     "source": m and ("synthetic" if m.source.get("synthetic") or m.synthetic else m.source.get("snapshot")),
                     "trained_for": m and m.source.get("trained_embodiments"),
                     "bytes": size, "unique_bytes": unique, "shared_bytes": size - unique,
                     "published_unix": m and m.published_unix,
                     "age_s": round(now - m.published_unix) if m else None, "refs": in_use.get(name, [])})
    if totals is not None:  # every stored file once: what the whole cache holds
        totals["disk_bytes"] = sum(seen.values())
    if only and not rows:
        raise _no_such_entry(store, only)
    return rows


def _no_such_entry(store: Store, name: str) -> CacheError:
    known = ", ".join(n for n in store.children(ENTRIES) if TMP_MARK not in n) or "none"
    return CacheError(f"{store.describe(entry_key(name))}: no such entry in cache {store.describe('')} (entries: {known})")


def _unfit(row: dict) -> tuple[str, bool] | None:
    """Why gc removes an entry whatever its age, and whether its refs go too; None for a sound one (or a live
    process's temporary)."""
    name, state = row["entry"], row["state"]
    if TMP_MARK in name:
        owner = tmp_owner(name)
        return ("temporary of a dead process", False) if owner is not None and not _pid_alive(owner) else None
    if state == "broken":
        return "no valid manifest", False
    if state.startswith("cache format"):
        return state.split(" (", 1)[0] + ", which this converter does not read", True
    if state.startswith("CORRUPT"):
        return f"corrupt: {state.split(': ', 1)[1]}", True
    return None


def collect_garbage(store: Store, older_than_days: float | None = None, max_bytes: int | None = None,
                    include_current: bool = False, dry_run: bool = False) -> list[dict]:
    """Remove temporaries of dead processes, broken and corrupt entries (a chunk that fails its checksum); then,
    if asked, published entries older than `older_than_days`, then the oldest until the cache holds at most
    `max_bytes`. An entry a ref points to is never removed by age or size unless `include_current`; a corrupt
    one is removed with its refs (it cannot be loaded anyway). An object-store entry without a manifest may be
    a push in progress: it is listed, never removed. `dry_run` lists without removing."""
    removed: list[dict] = []
    kept: list[dict] = []
    in_use = refs(store)

    def remove(name: str, reason: str, size: int, drop_refs: bool = False) -> bool:
        if not _removed_unless_read(store, name, dry_run):  # a live reader's entry stays (cache/README.md, "Leases")
            kept.append({"entry": name, "reason": f"{reason}, but {_being_read(readers(store, name))}", "bytes": size})
            return False
        if not dry_run:
            for ref in readable(in_use.get(name, [])) if drop_refs else []:
                store.delete(ref_object(ref))
        removed.append({"entry": name, "reason": reason, "bytes": size, "freed_bytes": own.get(name, size),
                        "refs": readable(in_use.get(name, []))})
        return True

    published = []
    totals: dict = {}
    rows = entry_rows(store, verify=True, totals=totals)
    own = {r["entry"]: r["unique_bytes"] for r in rows}
    for row in rows:
        unfit = _unfit(row)
        if unfit is not None:
            remove(row["entry"], unfit[0], row["bytes"], drop_refs=unfit[1])
        elif row["state"] == "verified":
            published.append(row)
    candidates = sorted((r for r in published if include_current or not r["refs"]), key=lambda r: r["published_unix"])
    if older_than_days is not None:
        cutoff = time.time() - older_than_days * 86400
        for row in [r for r in candidates if r["published_unix"] < cutoff]:
            remove(row["entry"], f"older than {older_than_days:g} days", row["bytes"], drop_refs=True)
            candidates.remove(row)
    if max_bytes is not None:
        total = totals["disk_bytes"]
        for row in list(candidates):
            if total <= max_bytes:
                break
            if remove(row["entry"], f"cache over {max_bytes:,} bytes", row["bytes"], drop_refs=True):
                total -= row["unique_bytes"]  # a kept entry (a live reader's) still takes its room
    return removed + [{**k, "kept": True, "freed_bytes": 0, "refs": []} for k in kept]


def _being_read(pids: list[int]) -> str:
    return f"being read by process {pids[0]}" if pids else "being read by another process"


def _busy(store: Store, name: str) -> CacheError:
    return CacheError(f"{store.describe(entry_key(name))}: {_being_read(readers(store, name))} (a live lease in "
                      f"{store.describe(LEASES)}); remove it when that process is done")


def remove_entry(store: Store, name: str, include_current: bool = False, dry_run: bool = False) -> dict:
    """`cache rm NAME`: remove one published (or broken) entry; one a ref points to only with `include_current`,
    and then its refs go too. `dry_run` says what would go and removes nothing."""
    if TMP_MARK in name or name not in store.children(ENTRIES):
        raise _no_such_entry(store, name)
    if readers(store, name):
        raise _busy(store, name)
    in_use = refs(store).get(name, [])
    if in_use and not include_current:
        raise CacheError(f"{store.describe(entry_key(name))}: refs/{', refs/'.join(in_use)} point to this entry (it "
                         "is what `load` opens); pass --include-current to remove it and those refs")
    size, freed, _ = store.usage(entry_key(name))
    if not dry_run:
        if not _delete_unread(store, name):
            raise _busy(store, name)
        for ref in readable(in_use):
            store.delete(ref_object(ref))
    return {"entry": name, "reason": "removed on request", "bytes": size, "freed_bytes": freed, "refs": readable(in_use)}
