"""The contract of `cache ls`, `cache gc` and `cache rm` (pipeline/cache/housekeeping.py), without a convert: each
case writes its entries and refs by hand (tests/handmade.py), runs one policy, and checks the folder afterwards.

The promises: nothing a ref points to goes by age or size unless asked; an unreadable ref protects every entry it
could name and is never deleted; corrupt, broken, old-format entries and dead processes' temporaries go whatever
their age; a dry run removes nothing; an entry's own bytes are what removing it frees; a live reader keeps its
entry, and gc then goes on to the next one until the cache fits."""

from __future__ import annotations

import os

import pytest

from pipeline.cache import collect_garbage, entry_rows, reading, remove_entry
from tasks.errors import CacheError
from tasks.entries.store import LocalStore
from tests.handmade import entry_of, file_bytes, ref_to


def _names(root) -> list[str]:
    return sorted(p.name for p in (root / "entries").iterdir())


def _removed(result: list[dict]) -> dict[str, str]:
    return {r["entry"]: r["reason"] for r in result if not r.get("kept")}


@pytest.fixture
def old_and_current(tmp_path):
    """Two sound n16 entries: `old` (published 10 days ago) and `current` (now), which the ref names."""
    old = entry_of(tmp_path, "old", age_days=10)
    current = entry_of(tmp_path, "current")
    ref_to(tmp_path, current)
    return tmp_path, old, current


def test_the_port_model_kept_for_an_entry_goes_with_it_and_only_then(old_and_current):
    """With its entry by gc or rm; one whose entry is already gone, by the next gc; never by a dry run."""
    root, old, current = old_and_current
    for name in (old, current):  # what pipeline/port_n16/kept.py writes there, by hand
        (root / "port-models" / name).mkdir(parents=True)
        (root / "port-models" / name / "rev-key.json").write_text("{}")
    store = LocalStore(root)
    collect_garbage(store, older_than_days=0, dry_run=True)
    assert sorted(p.name for p in (root / "port-models").iterdir()) == [current, old]
    collect_garbage(store, older_than_days=0)
    assert [p.name for p in (root / "port-models").iterdir()] == [current]
    remove_entry(store, current, include_current=True)
    assert list((root / "port-models").iterdir()) == []
    (root / "port-models" / "gone-entry").mkdir()  # kept by a start while its entry was being removed
    collect_garbage(store, dry_run=True)
    assert [p.name for p in (root / "port-models").iterdir()] == ["gone-entry"]
    collect_garbage(store)
    assert list((root / "port-models").iterdir()) == []


def test_rm_refuses_the_current_entry_and_an_unknown_name_lists_what_there_is(old_and_current):
    root, old, current = old_and_current
    store = LocalStore(root)
    with pytest.raises(CacheError, match=f"refs/{current.rsplit('-', 1)[0]} point to this entry .*--include-current"):
        remove_entry(store, current)
    with pytest.raises(CacheError, match=f"nothere: no such entry in cache {root} \\(entries: {', '.join(sorted([old, current]))}\\)"):
        remove_entry(store, "nothere")
    with pytest.raises(CacheError, match="nothere: no such entry"):  # `cache verify nothere`
        entry_rows(store, only="nothere", verify=True)
    assert remove_entry(store, old)["entry"] == old and _names(root) == [current]
    assert remove_entry(store, current, include_current=True)["refs"] == [current.rsplit("-", 1)[0]]
    assert _names(root) == [] and list((root / "refs").iterdir()) == []


def test_an_unreadable_ref_keeps_every_entry_it_could_name(old_and_current):
    """A torn or hand-edited ref might name either entry of its kind: gc keeps both, rm asks for --include-current,
    and the ref itself is never deleted or rewritten."""
    root, old, current = old_and_current
    ref = root / "refs" / f"{current.rsplit('-', 1)[0]}.json"
    ref.write_text('{"entry": "n16-tt-n')
    other_kind = entry_of(root, "generic", layout="generic", age_days=10)  # not of the ref's kind: unprotected
    store = LocalStore(root)
    assert {r["entry"]: r["refs"] for r in entry_rows(store)}[old] == ["n16-tt-n16-port (unreadable)"]
    assert _removed(collect_garbage(store, older_than_days=0)) == {other_kind: "older than 0 days"}
    with pytest.raises(CacheError, match="n16-tt-n16-port \\(unreadable\\) point to this entry"):
        remove_entry(store, old)
    assert remove_entry(store, old, include_current=True)["refs"] == []
    assert ref.read_text() == '{"entry": "n16-tt-n' and _names(root) == [current]


def test_corrupt_broken_old_format_and_dead_temporaries_go_whatever_their_age(old_and_current):
    root, old, current = old_and_current
    (root / "entries" / current / "b" / "c.4.0.0").write_bytes(b"\xff" * 8)  # corrupt: the ref goes with it
    broken = root / "entries" / ("n16-tt-n16-port-" + "12" * 10)
    broken.mkdir()  # a final name without a manifest
    old_format = entry_of(root, "format 2", cache_format=2)
    dead = root / "entries" / f"{old}.tmp-999999999-deadbeef"  # no such process
    live = root / "entries" / f"{old}.tmp-{os.getpid()}-cafebabe"
    dead.mkdir(), live.mkdir()
    removed = _removed(collect_garbage(LocalStore(root)))
    assert removed == {current: f"corrupt: {root}/entries/{current}/b/c.4.0.0: chunk bytes do not match the manifest "
                                "checksum (tampered or corrupt)",
                       broken.name: "no valid manifest", dead.name: "temporary of a dead process",
                       old_format: "cache format 2, which this converter does not read"}
    assert _names(root) == sorted([old, live.name]) and list((root / "refs").iterdir()) == []


def test_own_bytes_are_what_removing_frees_whatever_the_order(tmp_path):
    first = entry_of(tmp_path, "first", slots=(4,))
    second = entry_of(tmp_path, "second", slots=(4, 7), link_from=first)  # shares all but slot 7 by hard link
    store = LocalStore(tmp_path)
    totals: dict = {}
    rows = {r["entry"]: r for r in entry_rows(store, totals=totals)}
    assert totals["disk_bytes"] == file_bytes(tmp_path / "entries")
    assert 0 < rows[second]["unique_bytes"] < rows[second]["bytes"]
    before = file_bytes(tmp_path / "entries")
    freed = remove_entry(store, second, include_current=True)["freed_bytes"]
    assert before - file_bytes(tmp_path / "entries") == rows[second]["unique_bytes"] == freed
    assert entry_rows(store)[0]["unique_bytes"] == rows[first]["bytes"]  # alone now: all of it its own


def test_max_bytes_goes_on_past_an_entry_a_live_reader_keeps(tmp_path):
    """The oldest entry is being read, so gc keeps it; the cache is still over the limit, so the next oldest goes
    (its bytes, not the kept one's, count toward the limit)."""
    names = [entry_of(tmp_path, f"e{i}", age_days=3 - i) for i in range(3)]
    store = LocalStore(tmp_path)
    own = {r["entry"]: r["unique_bytes"] for r in entry_rows(store)}
    limit = sum(own.values()) - own[names[0]] // 2  # one entry must go
    with reading(store, names[0]):
        result = collect_garbage(store, max_bytes=limit, include_current=True)
    assert [r["entry"] for r in result if r.get("kept")] == [names[0]]
    assert list(_removed(result)) == [names[1]] and _names(tmp_path) == sorted([names[0], names[2]])


def test_gc_never_deletes_an_object_it_cannot_date(tmp_path):
    """A backend that lists an object without its time (an fsspec store whose listing has no LastModified, mtime,
    created or last_modified) may be listing a convert's object in flight: gc leaves it, whatever the grace period;
    the same object, dated long ago, goes."""
    import os

    from pipeline.cache.pool import sweep
    from tasks.entries.store import LocalStore

    class Undated(LocalStore):
        def written(self, prefix: str) -> dict[str, float]:
            return {}

    (tmp_path / "objects").mkdir()
    orphan = tmp_path / "objects" / ("ab" * 32)
    orphan.write_bytes(b"named by no manifest")
    os.utime(orphan, (1, 1))  # 1970: past any grace period
    assert sweep(Undated(tmp_path), grace_hours=0, dry_run=False) == (None, 1) and orphan.exists()
    row, _ = sweep(LocalStore(tmp_path), grace_hours=1, dry_run=False)
    assert row is not None and not orphan.exists()
