"""The contract of entry selection (pipeline/cache/selection.py), without a convert: which entry a reload opens,
given entries and refs written by hand (tests/handmade.py).

The promises: the ref's entry when it fits, else the newest published one that does; a release always before a
synthetic stand-in, which says so when handed out; a name or fingerprint prefix picks exactly one entry of the
version asked for; a ref naming a missing, broken or old-format entry is said, never stepped over; and when
nothing fits, the error lists what there is and the convert that would make it."""

from __future__ import annotations

import hashlib
import json
import warnings

import pytest

from pipeline.cache import SyntheticWeightsWarning, Wanted, choose_entry, find_entry, warn_if_synthetic
from tasks.entries.entry import OldFormatError
from tasks.errors import CacheError
from tasks.entries.object_stores import FsspecStore
from tasks.entries.store import LocalStore
from tests.handmade import entry_of, ref_to

N16 = dict(version="n16", layout="tt-n16", profile="port")


def _choose(root, **wanted) -> str:
    return choose_entry(LocalStore(root), Wanted(**{**N16, **wanted})).name


def test_the_ref_when_it_fits_else_the_newest_entry_that_does(tmp_path):
    both = entry_of(tmp_path, "slots 4 and 7", slots=(4, 7), age_days=2)
    four = entry_of(tmp_path, "slot 4, newer", slots=(4,), age_days=1)
    newest_four = entry_of(tmp_path, "slot 4, newest", slots=(4,))
    ref_to(tmp_path, four)
    assert _choose(tmp_path, slot=4) == four  # the last conversion, though not the newest
    assert _choose(tmp_path, slot=7) == both  # the ref's lacks slot 7
    (tmp_path / "refs").joinpath("n16-tt-n16-port.json").unlink()
    assert _choose(tmp_path, slot=4) == newest_four
    with pytest.raises(CacheError, match=f"no published n16 \\(tt-n16, port\\) entry holds slot 5 \\(.*{both}: slots "
                                         "\\[4, 7\\].*\\); convert with --embodiments 5"):
        _choose(tmp_path, slot=5)
    with pytest.raises(CacheError, match="entry holds every slot .*; convert with --embodiments all"):
        _choose(tmp_path, slot=None)


def test_a_release_always_wins_over_a_synthetic_stand_in_which_says_what_it_is(tmp_path):
    release = entry_of(tmp_path, "release", age_days=5)
    fake = entry_of(tmp_path, "synthetic", synthetic="synthetic n16 (tiny scale)")
    ref_to(tmp_path, fake, synthetic=True)  # the newest conversion, and the ref of its own kind
    assert _choose(tmp_path, slot=4) == release
    ref_to(tmp_path, fake)  # even a release's ref that names a synthetic entry does not hand it out first
    assert _choose(tmp_path, slot=4) == release
    store = LocalStore(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_synthetic(find_entry(store, release), acknowledged=False)  # a release: not a word
        warn_if_synthetic(find_entry(store, fake), acknowledged=True)  # the caller said it knows
    with pytest.warns(SyntheticWeightsWarning, match=f"{fake} holds SYNTHETIC weights \\(synthetic n16"):
        warn_if_synthetic(find_entry(store, fake), acknowledged=False)


def test_a_name_or_fingerprint_prefix_picks_exactly_one_entry_of_the_version(tmp_path):
    a = entry_of(tmp_path, "a")
    b = entry_of(tmp_path, "b")
    n17 = entry_of(tmp_path, "n17", version="n17", layout="tt-port")
    prefix = hashlib.sha256(b"a").hexdigest()[:6]
    assert _choose(tmp_path, entry=a) == a and _choose(tmp_path, entry=prefix) == a
    with pytest.raises(CacheError, match="more than one entry matches '' \\(candidates: ") as err:
        _choose(tmp_path, entry="")  # every fingerprint starts so
    assert a in str(err.value) and b in str(err.value)
    with pytest.raises(CacheError, match="no entry matches 'nothere' \\(entries: "):
        _choose(tmp_path, entry="nothere")
    with pytest.raises(CacheError, match=f"{n17}: is a n17 entry, not n16; pass --version n17"):
        _choose(tmp_path, entry=n17)


def test_a_ref_naming_a_missing_or_broken_entry_is_said_and_never_stepped_over(tmp_path):
    """Opening another entry that also holds the slot would hand out another conversion's weights unasked."""
    entry_of(tmp_path, "older, fits", age_days=1)
    last = entry_of(tmp_path, "the last conversion")
    ref_to(tmp_path, last)
    (tmp_path / "entries" / last / "MANIFEST.json").unlink()
    with pytest.raises(CacheError, match=f"{last}: no MANIFEST.json; the entry was never completely published"):
        _choose(tmp_path, slot=4)
    gone = "n16-tt-n16-port-" + "9" * 20
    (tmp_path / "refs" / "n16-tt-n16-port.json").write_text(json.dumps({"entry": gone}))
    with pytest.raises(CacheError, match=f"n16-tt-n16-port.json: names entry {gone}, which is not in .*entries; "
                                         "convert again"):
        _choose(tmp_path, slot=4)


def test_a_ref_to_an_older_format_is_said_unless_an_entry_of_this_format_fits(tmp_path):
    old = entry_of(tmp_path, "format 2", cache_format=2)
    ref_to(tmp_path, old)
    with pytest.raises(OldFormatError, match=f"{old}: written in cache format 2, which this converter does not read"):
        _choose(tmp_path, slot=4)
    current = entry_of(tmp_path, "format now", age_days=1)
    assert _choose(tmp_path, slot=4) == current


def test_nothing_converted_says_which_convert_to_run(tmp_path):
    entry_of(tmp_path, "another kind", layout="generic", profile="bf16")
    with pytest.raises(CacheError, match="refs/n16-tt-n16-port.json: no converted n16 \\(tt-n16, port\\) in cache "
                                         ".*; run `make convert VERSION=n16 LAYOUT=tt-n16 PROFILE=port` first"):
        _choose(tmp_path, slot=4)


def test_revision_and_source_narrow_the_choice(tmp_path):
    snapshot = tmp_path / "snapshots" / "mine"
    snapshot.mkdir(parents=True)
    pinned = entry_of(tmp_path, "at abc", revision="abc", age_days=2)
    mine = entry_of(tmp_path, "my fine-tune", source={"snapshot": str(snapshot)}, age_days=1)
    newest = entry_of(tmp_path, "newest")
    assert _choose(tmp_path, slot=4) == newest
    assert _choose(tmp_path, slot=4, revision="abc") == pinned
    assert _choose(tmp_path, slot=4, source=snapshot / ".." / "mine") == mine  # the same folder, however named
    with pytest.raises(CacheError, match="holds slot 4 and revision def .*; convert with --embodiments 4 --revision def"):
        _choose(tmp_path, slot=4, revision="def")


def test_an_object_store_entry_without_its_manifest_is_not_there_yet(tmp_path):
    """Where there is no rename the manifest goes last: without it, a push in progress (or one that died)."""
    name = entry_of(tmp_path / "local", "pushed")
    store = FsspecStore(f"memory://{tmp_path.name}")
    store.put(f"entries/{name}/t/c.0.0", (tmp_path / "local" / "entries" / name / "t" / "c.0.0").read_bytes())
    assert find_entry(store, name) is None
    manifest = json.loads((tmp_path / "local" / "entries" / name / "MANIFEST.json").read_text())
    store.put(f"entries/{name}/MANIFEST.json", json.dumps(manifest).encode())
    assert find_entry(store, name).name == name
