"""Leases, in a cache folder: a process reading an entry holds its lock shared (`leases/<entry>.lock`) and says who
it is (`leases/<entry>@<pid>-<random>`); deleting takes the lock exclusively, so no entry is removed under a reader.
A folder's home uses them (pipeline/cache/homes.py `FolderHome`); an object store has none, since a pid means
nothing to another machine."""

from __future__ import annotations

import contextlib
import fcntl
import os
import uuid
from pathlib import Path

from pipeline.cache.roots import pid_alive
from tasks.entries.names import LEASES, PORT_MODELS, entry_key, manifest_key
from tasks.errors import CacheError
from tasks.entries.store import LocalStore


def _lock_path(store: LocalStore, name: str) -> Path:
    return store.path(LEASES) / f"{name}.lock"


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
def reading(store: LocalStore, name: str):
    """Hold a lease on entry `name` while reading it: a shared lock on `leases/<name>.lock`, which `gc` and `rm`
    must hold exclusively to delete the entry (the kernel drops it with the process, so a dead reader holds
    nothing), and `leases/<name>@<pid>-<random>`, which names the reader in their messages. Once the lock is held
    the entry must still be there: one removed after it was chosen is said, never half read."""
    lease = store.path(LEASES) / f"{name}@{os.getpid()}-{uuid.uuid4().hex[:8]}"
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


def delete_unread(store: LocalStore, name: str) -> bool:
    """Delete entry `name` unless a process is reading it; False (and nothing deleted) if one is. Locally the
    entry's lock is taken exclusively first, so no reader can start on it meanwhile, and its lock file goes with
    it: a reader that waited on it then finds the entry gone."""
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
        store.delete(f"{PORT_MODELS}/{name}")  # the port's model kept for it (pipeline/port_n16/kept.py)
        _lock_path(store, name).unlink(missing_ok=True)
    return True


def readers(store: LocalStore, name: str) -> list[int]:
    """The live processes holding a lease on entry `name`."""
    if not store.path(LEASES).is_dir():
        return []
    pids = []
    for lease in store.path(LEASES).glob(f"{name}@*"):
        try:
            pid = int(lease.name.rsplit("@", 1)[1].split("-", 1)[0])
        except ValueError:
            continue
        if pid_alive(pid):
            pids.append(pid)
        else:
            lease.unlink(missing_ok=True)
    return pids


