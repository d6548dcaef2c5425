"""Which entry a convert finds or a reload opens: by name, by the ref the last conversion wrote, else the newest
published entry that fits (`Wanted`: version, layout, profile, slot, revision, source). A release always wins over
a synthetic stand-in, which says so when handed out."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.cache.homes import home_of
from tasks.entries.entry import Entry, OldFormatError, list_entries, open_entry
from tasks.entries.names import ENTRIES, ref_key
from tasks.errors import CacheError
from tasks.entries.refs import read_ref
from tasks.entries.store import Store


def find_entry(store: Store, name: str) -> Entry | None:
    """The published entry `name`, or None. In an object store an entry without its manifest is a push not
    finished: not there yet (converting pushes it again). A folder's is broken, and says so."""
    if name not in store.children(ENTRIES) or not home_of(store).is_published(name):
        return None
    return open_entry(store, name, home_of(store).unpublished_remedy)


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
        return open_entry(store, name, home_of(store).unpublished_remedy)
    raise CacheError(f"{store.describe(ref_key(version, layout, profile))}: no converted {version} ({layout}, "
                     f"{profile}) in cache {store.describe('')}; run `make convert VERSION={version} LAYOUT={layout} "
                     f"PROFILE={profile}` first")


@dataclass(frozen=True, kw_only=True)
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
    tag: str | None = None  # asked by tag: an entry that recorded the tag's slot (its trainer's map) is read by it

    def slot_in(self, e: Entry) -> int | None:
        """The slot asked for, in `e`: a tag read with the map its convert used (the trainer's: LeRobot gives a tag
        outside its map slot 0), else with the built-in table (an entry converted before the map was recorded)."""
        table = e.manifest.source.get("embodiment_table") or {}
        if not self.tag or not isinstance(table.get("ids"), dict):
            return self.slot
        return table["ids"].get(self.tag, table.get("unknown_slot"))

    def fits(self, e: Entry) -> bool:
        m, snapshot = e.manifest, e.manifest.source.get("snapshot")
        same_source = self.source is None or (snapshot is not None and
                                              Path(str(snapshot)).resolve() == Path(self.source).resolve())
        slot = self.slot_in(e)
        known = slot is not None or self.tag is None  # a tag no table knows fits only an entry that recorded it
        return known and m.holds_slot(slot) and self.revision in (None, m.revision) and same_source

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
    published = [e for _, e, state in list_entries(store, current) if state == "published"]
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


