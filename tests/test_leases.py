"""The contract of leases (pipeline/cache/leases.py), without a convert: a reader holds its entry's lock shared
and names itself; deleting takes the lock exclusively, so an entry is never removed under a reader, however the
two interleave; a dead reader holds nothing; an entry removed before its reader got the lock is said, never half
read. Entries are written by hand (tests/handmade.py)."""

from __future__ import annotations

import os

import pytest

from pipeline.cache import leases
from pipeline.cache import collect_garbage, home_of, readers, reading, remove_entry
from tasks.errors import CacheError
from tasks.entries.object_stores import FsspecStore
from tasks.entries.store import LocalStore
from tests.handmade import entry_of, holding


@pytest.fixture
def one_entry(tmp_path):
    return LocalStore(tmp_path), entry_of(tmp_path, "one")


def test_a_reader_names_itself_while_it_reads_and_not_after(one_entry):
    store, name = one_entry
    with reading(store, name):
        assert readers(store, name) == [os.getpid()]
        assert [p.name.split("@")[0] for p in (store.root / "leases").glob("*@*")] == [name]
        assert not leases.delete_unread(store, name)  # this process reads it (the lock is per open file)
    assert readers(store, name) == [] and not list((store.root / "leases").glob("*@*"))
    assert leases.delete_unread(store, name) and not (store.root / "entries" / name).exists()


def test_a_dead_readers_lease_holds_nothing(one_entry):
    store, name = one_entry
    stale = store.root / "leases" / f"{name}@999999999-deadbeef"  # no such process
    stale.parent.mkdir()
    stale.touch()
    assert readers(store, name) == [] and not stale.exists()  # pruned when looked at
    assert remove_entry(store, name)["entry"] == name


def test_a_reader_that_starts_after_the_check_for_readers_still_keeps_its_entry(one_entry, monkeypatch):
    """gc and rm look for readers, then delete. A reader that starts in between (here: the look finds none) still
    keeps its entry: deleting takes the entry's lock, which every reader holds while it reads."""
    store, name = one_entry
    holder = holding(store.root, name)
    try:
        monkeypatch.setattr(leases, "readers", lambda store, name: [])  # gc's and rm's look, through the home
        kept = collect_garbage(store, older_than_days=0, include_current=True)
        assert kept[0]["kept"] and "being read by another process" in kept[0]["reason"]
        with pytest.raises(CacheError, match="being read by another process"):
            remove_entry(store, name, include_current=True)
        assert (store.root / "entries" / name / "MANIFEST.json").is_file()
    finally:
        holder.kill()
        holder.wait()
    assert remove_entry(store, name)["entry"] == name  # the kernel dropped its lock with the process


def test_an_entry_removed_before_its_reader_got_the_lock_is_said(one_entry):
    store, name = one_entry
    remove_entry(store, name)  # `cache rm` ran between load's choice of the entry and its lease
    with pytest.raises(CacheError, match=f"{name}: was removed \\(`cache rm` or `cache gc`\\) while it was being "
                                         "opened; load again"):
        with reading(store, name):
            pytest.fail("read a removed entry")
    assert not list((store.root / "leases").glob("*@*"))  # and its lease is gone


def test_an_object_store_has_no_leases(tmp_path):
    """A pid means nothing on another machine: reading holds nothing, and deleting deletes."""
    local = tmp_path / "local"
    name = entry_of(local, "remote")
    store = FsspecStore(f"memory://{tmp_path.name}")
    for path in sorted(p for p in (local / "entries" / name).rglob("*") if p.is_file()):
        store.put(str(path.relative_to(local)), path.read_bytes())
    with reading(store, name):
        assert readers(store, name) == []
        assert home_of(store).delete_unread(name)
    assert store.children("entries") == []
