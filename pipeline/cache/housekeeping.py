"""What `cache ls`, `cache gc` and `cache rm` do: list entries with their state, sizes and refs; remove what no ref
names and no live process reads, by age or to fit a size; remove one entry by name (never the current one unless
asked, never one being read)."""

from __future__ import annotations

import time

from pipeline.cache.homes import EntryHome, home_of
from pipeline.cache.leases import LEASES
from pipeline.cache.roots import pid_alive
from tasks.entries.entry import list_entries
from tasks.entries.names import ENTRIES, is_temporary, entry_key, ref_object, tmp_owner
from tasks.errors import CacheError
from tasks.entries.objects import GRACE_HOURS
from tasks.entries.refs import readable, refs
from tasks.entries.store import Store


def entry_rows(store: Store, only: str | None = None, verify: bool = False, totals: dict | None = None) -> list[dict]:
    """`cache ls` / `cache verify`: one row per entry (state, identity, bytes on disk, refs), the same for every
    store. Bytes shared with another entry (hard links in a folder, the same objects in an object store) are not
    in `unique_bytes`, and counted once in the totals."""
    in_use, seen, now, rows, home = refs(store), {}, time.time(), [], home_of(store)
    listed = list(list_entries(store, unpublished=home.unpublished_state))
    usage = home.usage_of([e for _, e, _ in listed if e is not None])
    for name, entry, state in (row for row in listed if not only or row[0] == only):
        if verify and entry is not None:
            problems = entry.verify()
            state = "verified" if not problems else f"CORRUPT ({len(problems)} chunks): {problems[0]}"
        size, unique, files = usage(name)
        seen.update(files)
        m = entry.manifest if entry else None
        rows.append({"entry": name, "state": state, "version": m and m.version, "layout": m and m.layout,
                     "profile": m and m.profile, "slots": m and m.slots, "bank_slots": m and m.bank_slots,
                     "revision": m and m.revision,
                     "source": m and ("synthetic" if m.source.get("synthetic") or m.synthetic else m.source.get("snapshot")),
                     "trained_for": m and m.source.get("trained_embodiments"),
                     "trained_from": m and m.source.get("trained_from"),
                     "embodiment_map": m and m.source.get("embodiment_map"),
                     "processor": m and m.source.get("processor"),
                     "shards_checked_against": m and m.shards_checked_against,
                     "shards_sha256": m and dict(m.shards_sha256),
                     "bytes": size, "unique_bytes": unique, "shared_bytes": size - unique,
                     "published_unix": m and m.published_unix,
                     "age_s": round(now - m.published_unix) if m else None, "refs": in_use.get(name, [])})
    if totals is not None:  # every stored file once: what the whole cache holds
        totals["disk_bytes"] = sum(seen.values())
    if only and not rows:
        raise _no_such_entry(store, only)
    return rows


def _no_such_entry(store: Store, name: str) -> CacheError:
    known = ", ".join(n for n in store.children(ENTRIES) if not is_temporary(n)) or "none"
    return CacheError(f"{store.describe(entry_key(name))}: no such entry in cache {store.describe('')} (entries: {known})")




def _unfit(store: Store, row: dict, grace_hours: float) -> tuple[str, bool] | None:
    """Why gc removes an entry whatever its age, and whether its refs go too; None for a sound one (or a live
    process's temporary, or an object-store push written to within the grace period)."""
    name, state = row["entry"], row["state"]
    if is_temporary(name):
        owner = tmp_owner(name)
        return ("temporary of a dead process", False) if owner is not None and not pid_alive(owner) else None
    if state.startswith("incomplete"):  # no manifest where there is no rename: a push in flight, or abandoned
        written = store.last_written(entry_key(name))
        idle_hours = (time.time() - written) / 3600 if written is not None else float("inf")
        return (f"no manifest and nothing written for {idle_hours:.1f} hours (grace period {grace_hours:g} "
                "hours): an abandoned push", False) if idle_hours > grace_hours else None
    if state == "broken":
        return "no valid manifest", False
    if state.startswith("cache format"):
        return state.split(" (", 1)[0] + ", which this converter does not read", True
    if state.startswith("CORRUPT"):
        return f"corrupt: {state.split(': ', 1)[1]}", True
    return None


def collect_garbage(store: Store, older_than_days: float | None = None, max_bytes: int | None = None,
                    include_current: bool = False, dry_run: bool = False,
                    grace_hours: float = GRACE_HOURS) -> list[dict]:
    """Remove temporaries of dead processes, broken and corrupt entries (a chunk that fails its checksum), and
    object-store entries without a manifest that nothing has written to for `grace_hours` (abandoned pushes: one
    written to more recently may be in flight, and stays); then, if asked, published entries older than
    `older_than_days`, then the oldest until the cache holds at most `max_bytes`. An entry a ref points to is never
    removed by age or size unless `include_current`; a corrupt one is removed with its refs (it cannot be loaded
    anyway). The port models kept for entries that are gone go too. `dry_run` lists without removing."""
    removed: list[dict] = []
    kept: list[dict] = []
    in_use, home = refs(store), home_of(store)

    def remove(name: str, reason: str, size: int, drop_refs: bool = False) -> bool:
        if not _removed_unless_read(home, name, dry_run):  # a live reader's entry stays (cache/README.md, "Leases")
            kept.append({"entry": name, "reason": f"{reason}, but {_being_read(home.readers(name))}", "bytes": size})
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
        unfit = _unfit(store, row, grace_hours)
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
    unused_before = None if older_than_days is None else time.time() - older_than_days * 86400
    removed += home.tidy(grace_hours, dry_run, {r["entry"] for r in removed}, unused_before, older_than_days)
    return removed + [{**k, "kept": True, "freed_bytes": 0, "refs": []} for k in kept]


def _removed_unless_read(home: EntryHome, name: str, dry_run: bool) -> bool:
    """gc's removal of one entry: False, and nothing removed, while a live process reads it."""
    if home.readers(name):
        return False
    if dry_run:
        return True
    if is_temporary(name):  # a dead process's temporary: nothing reads one
        home.store.delete(entry_key(name))
        return True
    return home.delete_unread(name)


def _being_read(pids: list[int]) -> str:
    return f"being read by process {pids[0]}" if pids else "being read by another process"


def _busy(store: Store, name: str) -> CacheError:
    return CacheError(f"{store.describe(entry_key(name))}: {_being_read(home_of(store).readers(name))} (a live lease in "
                      f"{store.describe(LEASES)}); remove it when that process is done")


def remove_entry(store: Store, name: str, include_current: bool = False, dry_run: bool = False,
                 grace_hours: float = GRACE_HOURS) -> dict:
    """`cache rm NAME`: remove one published (or broken) entry; one a ref points to only with `include_current`,
    and then its refs go too. In an object store, the objects it named that no other manifest names go with it,
    those written within `grace_hours` at the next `cache gc` after that. `dry_run` says what would go and removes
    nothing."""
    if is_temporary(name) or name not in store.children(ENTRIES):
        raise _no_such_entry(store, name)
    home = home_of(store)
    if home.readers(name):
        raise _busy(store, name)
    in_use = refs(store).get(name, [])
    if in_use and not include_current:
        raise CacheError(f"{store.describe(entry_key(name))}: refs/{', refs/'.join(in_use)} point to this entry (it "
                         "is what `load` opens); pass --include-current to remove it and those refs")
    size, freed, entry = home.usage_of_one(name)
    manifest_bytes = sum(store.sizes(entry_key(name)).values())
    if not dry_run:
        if not home.delete_unread(name):
            raise _busy(store, name)
        for ref in readable(in_use):
            store.delete(ref_object(ref))
    reason = "removed on request"
    went_with_it = home.freed_by_removing(entry, grace_hours, dry_run)
    if went_with_it is not None:  # its objects: those no other manifest names, past the grace period
        freed, young = manifest_bytes + went_with_it[0], went_with_it[1]
        if young:
            reason += (f"; {young} of its objects no other entry names were written within the grace period "
                       f"({grace_hours:g} hours) and stay until a `cache gc` after it")
    return {"entry": name, "reason": reason, "bytes": size, "freed_bytes": freed, "refs": readable(in_use)}

