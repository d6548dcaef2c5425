"""Cache entries: named by content, built in a temporary directory beside the final one, published by rename.

The format is written down in cache/README.md; the constants below cite it. An entry's name is a fingerprint of
everything that determines its bytes (source content, recipe and profile, selected slots, format version,
converter code version). `refs/<version>-<layout>-<profile>` names the entry the last conversion produced, so a
later process can load without touching the source checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping

from pipeline.recipe import RECIPES_PATH
from tasks.plan import Plan, Target
from tasks import source
from tasks.checkpoint import Checkpoint
from tasks.errors import CacheError
from tasks.entry import MANIFEST, chunk_file, matches, packed_path, ref_key, slot_of
from tasks.zarr_v3 import array_metadata, chunk_path, write_json_atomic

CACHE_FORMAT = 2               # bump when the on-disk layout changes (cache/README.md, "Versioning")
CONVERTER_VERSION = "2"        # bump when a transform changes the bytes it produces
DEFAULT_ROOT = Path(__file__).resolve().parent.parent / "cache"
TMP_MARK = ".tmp-"


def cache_root(root: Path | str | None = None) -> Path:
    """The local cache: `--cache`, else $GR00T_CACHE when it names a folder, else the project's `cache/` folder.
    (An object-store $GR00T_CACHE is handled by convert/load, which build locally here and push there.)"""
    env = os.environ.get("GR00T_CACHE")
    return Path(root or (env if env and "://" not in env else None) or DEFAULT_ROOT)


def _stat_key(path: Path) -> dict:
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}


def source_sha256(root: Path, ck: Checkpoint) -> dict[str, str]:
    """Content identity per shard: the HF blob name when there is one, else a remembered hash of this exact file
    (path, size, mtime, inode), else hashed now and remembered."""
    out = {}
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
        out[shard] = source.file_sha256(ck.shard_path(shard))
        write_json_atomic(record, {"stat": stat, "sha256": out[shard]})
    return out


def identity(plan: Plan, source: Mapping[str, object], shard_sha: Mapping[str, str], slots: tuple[int, ...]) -> dict:
    """Everything that determines the entry's bytes, and its fingerprint (sha256 of the canonical JSON); plus
    `source` (the snapshot folder, the revision read, and whether it is synthetic), recorded but not hashed beyond
    the revision and the synthetic mark: the same bytes in another folder are the same entry."""
    rules = hashlib.sha256(RECIPES_PATH.read_bytes()).hexdigest()
    doc = {"cache_format": CACHE_FORMAT, "converter": CONVERTER_VERSION, "version": plan.version,
           "revision": source.get("revision"), "synthetic": source.get("synthetic"), "layout": plan.layout, "profile": plan.profile,
           "shards": dict(sorted(shard_sha.items())), "recipes_sha256": rules, "slots": list(slots),
           "targets": [[t.name, list(t.sources), t.transform, list(t.params), t.device_dtype, t.layout]
                       for t in plan.targets]}
    fingerprint = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
    return {"fingerprint": fingerprint, **{k: v for k, v in doc.items() if k != "targets"}, "source": dict(source)}


def entry_name(ident: Mapping[str, object]) -> str:
    return f"{ident['version']}-{ident['layout']}-{ident['profile']}-{str(ident['fingerprint'])[:20]}"


def entries_dir(root: Path) -> Path:
    return root / "entries"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _tmp_owner(tmp: Path) -> int | None:
    try:
        return int(tmp.name.split(TMP_MARK, 1)[1].split("-", 1)[0])
    except (IndexError, ValueError):
        return None


def claim_tmp(root: Path, name: str) -> Path:
    """A fresh temporary directory for `name`, adopting the work of a dead process that was building the same
    entry (resume), and removing other orphans of dead processes."""
    base = entries_dir(root)
    base.mkdir(parents=True, exist_ok=True)
    mine = base / f"{name}{TMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    for orphan in sorted(base.glob(f"*{TMP_MARK}*"), key=lambda p: p.stat().st_mtime, reverse=True):
        owner = _tmp_owner(orphan)
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


def create_arrays(tmp: Path, plan: Plan, slots: tuple[int, ...], ident: Mapping[str, object]) -> None:
    """Write every target's array metadata (idempotent, so a resumed run can repeat it)."""
    for t in plan.targets:
        write_json_atomic(tmp / t.name / "zarr.json", _array_meta(t, slots))


def array_attributes(t: Target, slots: tuple[int, ...]) -> dict:
    """What a target's array records about itself (cache/README.md, "entries/")."""
    return {"dtype": "bfloat16", "sources": list(t.sources), "transform": t.transform,
            "transform_params": list(t.params), "kind": t.kind, "device_dtype": t.device_dtype,
            "device_layout": t.layout, "host_only": t.host, "logical_shape": list(t.shape),
            "embodiment_bank": t.embodiment, "slots": list(slots) if t.embodiment else None, "mirrors": t.mirrors}


def _array_meta(t: Target, slots: tuple[int, ...]) -> dict:
    shape = (t.bank_slots, *t.shape) if t.embodiment else t.shape  # banks keep every slot addressable; chunk per slot
    chunks = (1, *t.shape) if t.embodiment else t.shape
    return array_metadata(shape, chunks, array_attributes(t, slots))


@dataclass(frozen=True)
class Entry:
    path: Path
    manifest: dict

    @property
    def name(self) -> str:
        return self.path.name


def open_entry(path: Path) -> Entry:
    """A published entry: its manifest must exist, parse, and carry the fingerprint its name promises."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except FileNotFoundError:
        raise CacheError(f"{path}: no {MANIFEST}; the entry was never completely published — run `python -m pipeline "
                         "cache gc` and convert again") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise CacheError(f"{path / MANIFEST}: manifest is not valid JSON ({e}); convert again with --force") from e
    fp = str(manifest.get("fingerprint", ""))
    if not fp or not path.name.endswith(fp[:20]):
        raise CacheError(f"{path / MANIFEST}: fingerprint {fp[:20] or 'missing'} does not match the entry name "
                         f"{path.name}: the entry was copied or tampered with; convert again with --force")
    return Entry(path, manifest)


def find_entry(root: Path, name: str) -> Entry | None:
    path = entries_dir(root) / name
    return open_entry(path) if path.is_dir() else None


def verify_entry(entry: Entry) -> list[str]:
    """Every chunk the manifest lists must exist with its size and xxh3; returns the problems (empty: valid)."""
    problems = []
    for name, arr in entry.manifest["arrays"].items():
        for key, rec in arr["chunks"].items():
            slot = slot_of(key)
            path = chunk_file(entry.path, name, len(arr["attributes"]["logical_shape"]), slot)
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                problems.append(f"{path}: chunk listed in the manifest is missing")
                continue
            if not matches(data, rec):
                problems.append(f"{path}: chunk bytes do not match the manifest checksum (tampered or corrupt)")
            if "tensorbin" in rec:
                packed = packed_path(entry.path, name, slot)
                if not packed.is_file() or not matches(packed.read_bytes(), rec["tensorbin"]):
                    problems.append(f"{packed}: packed tensor is missing or does not match the manifest checksum")
    return problems


def set_ref(root: Path, version: str, layout: str, profile: str, name: str) -> None:
    write_json_atomic(root / ref_key(version, layout, profile), {"entry": name, "updated_unix": time.time()})


def resolve_ref(root: Path, version: str, layout: str, profile: str) -> Entry:
    ref = root / ref_key(version, layout, profile)
    try:
        name = json.loads(ref.read_text())["entry"]
    except FileNotFoundError:
        raise CacheError(f"{ref}: no converted {version} ({layout}, {profile}) in cache {root}; run "
                         f"`make convert VERSION={version} LAYOUT={layout} PROFILE={profile}` first") from None
    entry = find_entry(root, name)
    if entry is None:
        raise CacheError(f"{ref}: names entry {name}, which is not in {entries_dir(root)}; convert again")
    return entry


def holds_slot(entry: Entry, slot: int | None) -> bool:
    """Whether every bank of the entry has this slot (None: every slot of every bank)."""
    for arr in entry.manifest["arrays"].values():
        if arr["attributes"]["embodiment_bank"]:
            wanted = range(arr["shape"][0]) if slot is None else (slot,)
            if any(str(s) not in arr["chunks"] for s in wanted):
                return False
    return True


def choose_entry(root: Path, version: str, layout: str, profile: str, entry: str | None = None,
                 revision: str | None = None, slot: int | None = None, source: str | Path | None = None) -> Entry:
    """The entry `load` opens: `entry` (a name or a fingerprint prefix) when given; else the one the ref names, if
    it matches `revision` and holds `slot`; else the newest published entry of this version, layout and profile
    that does. An error lists what there is."""
    published = [e for _, e, state in iter_entries(root) if state == "published"]
    if entry is not None:
        found = [e for e in published if e.name == entry or str(e.manifest.get("fingerprint", "")).startswith(entry)]
        if len(found) != 1:
            names = ", ".join(e.name for e in (found or published)) or "none"
            raise CacheError(f"{entries_dir(root)}: {'no' if not found else 'more than one'} entry matches {entry!r} "
                             f"({'candidates' if found else 'entries'}: {names})")
        return found[0]
    try:
        current = resolve_ref(root, version, layout, profile)
    except CacheError:
        current = None
    def fits(e: Entry) -> bool:
        snapshot = (e.manifest.get("source") or {}).get("snapshot")
        return holds_slot(e, slot) and (revision is None or e.manifest.get("revision") == revision) and \
            (source is None or (snapshot is not None and Path(snapshot).resolve() == Path(source).resolve()))
    if current is not None and fits(current):
        return current
    same = [e for e in published if (e.manifest.get("version"), e.manifest.get("layout", "generic"),
                                     e.manifest.get("profile")) == (version, layout, profile)]
    match = sorted((e for e in same if fits(e)), key=lambda e: e.manifest.get("published_unix", 0), reverse=True)
    if match:
        return match[0]
    if current is None and not same:
        return resolve_ref(root, version, layout, profile)  # the "convert first" error
    want = " and ".join(x for x in (f"slot {slot}" if slot is not None else "every slot",
                                    f"revision {revision}" if revision else "",
                                    f"source {source}" if source else "") if x)
    have = "; ".join(f"{e.name}: slots {e.manifest.get('slots')}, revision {e.manifest.get('revision')}" for e in same)
    raise CacheError(f"{entries_dir(root)}: no published {version} ({layout}, {profile}) entry holds {want} ({have}); "
                     f"convert with --embodiments {slot if slot is not None else 'all'}"
                     f"{f' --revision {revision}' if revision else ''}")


def iter_entries(root: Path) -> Iterator[tuple[Path, Entry | None, str]]:
    """Every directory under entries/: (path, entry or None, state: published | incomplete | broken)."""
    base = entries_dir(root)
    for path in sorted(base.iterdir()) if base.is_dir() else []:
        if TMP_MARK in path.name:
            yield path, None, "incomplete"
            continue
        try:
            yield path, open_entry(path), "published"
        except CacheError:
            yield path, None, "broken"


def _tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def referenced(root: Path) -> dict[str, list[str]]:
    """Entry name -> the refs that point to it (what `load` opens: in use)."""
    out: dict[str, list[str]] = {}
    for ref in sorted((root / "refs").glob("*.json")) if (root / "refs").is_dir() else []:
        try:
            out.setdefault(json.loads(ref.read_text())["entry"], []).append(ref.stem)
        except (OSError, ValueError, KeyError):
            pass
    return out


def parse_size(text: str) -> int:
    """`20000000`, `500M`, `10G`, `1.5T` (powers of 1000, as `cache ls` prints them)."""
    units = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    t = text.strip().upper().removesuffix("B")
    unit = t[-1] if t and t[-1] in units else ""
    try:
        value = float(t[:len(t) - len(unit)])
    except ValueError:
        raise CacheError(f"size {text!r} is not a number with an optional K, M, G or T suffix (e.g. 10G)") from None
    if value < 0:
        raise CacheError(f"size {text!r} is negative")
    return int(value * units[unit])


def collect_garbage(root: Path, older_than_days: float | None = None, max_bytes: int | None = None,
                    include_current: bool = False, dry_run: bool = False) -> list[dict]:
    """Remove temporaries of dead processes, broken and corrupt entries (a chunk that fails its checksum); then,
    if asked, published entries older than `older_than_days`, then the oldest until the cache holds at most
    `max_bytes`. An entry a ref points to is never removed by age or size unless `include_current`; a corrupt
    one is removed with its refs (it cannot be loaded anyway). `dry_run` lists without removing."""
    removed: list[dict] = []
    in_use = referenced(root)

    def remove(path: Path, reason: str) -> None:
        size = _tree_bytes(path)
        if not dry_run:
            shutil.rmtree(path, ignore_errors=True)
        removed.append({"entry": path.name, "reason": reason, "bytes": size, "refs": in_use.get(path.name, [])})

    published = []
    for path, entry, state in iter_entries(root):
        owner = _tmp_owner(path) if state == "incomplete" else None
        if state == "incomplete" and owner is not None and not _pid_alive(owner):
            remove(path, "temporary of a dead process")
        elif state == "broken":
            remove(path, "no valid manifest")
        elif state == "published":
            problems = verify_entry(entry)
            if problems:
                remove(path, f"corrupt: {problems[0]}")
                if not dry_run:
                    for ref in in_use.get(path.name, []):
                        (root / "refs" / f"{ref}.json").unlink(missing_ok=True)
            else:
                published.append(path)
    candidates = [p for p in published if include_current or p.name not in in_use]
    candidates.sort(key=lambda p: p.stat().st_mtime)  # oldest first
    if older_than_days is not None:
        cutoff = time.time() - older_than_days * 86400
        for path in [p for p in candidates if p.stat().st_mtime < cutoff]:
            remove(path, f"older than {older_than_days:g} days")
            candidates.remove(path)
            published.remove(path)
    if max_bytes is not None:
        sizes = {p: _tree_bytes(p) for p in published}
        total = sum(sizes.values())
        for path in list(candidates):
            if total <= max_bytes:
                break
            remove(path, f"cache over {max_bytes:,} bytes")
            total -= sizes[path]
    return removed


def remove_entry(root: Path, name: str, include_current: bool = False) -> dict:
    """`cache rm NAME`: remove one published (or broken) entry; one a ref points to only with `include_current`,
    and then its refs go too."""
    path = entries_dir(root) / name
    if not path.is_dir() or TMP_MARK in name:
        known = ", ".join(p.name for p, _, _ in iter_entries(root) if TMP_MARK not in p.name) or "none"
        raise CacheError(f"{path}: no such entry in cache {root} (entries: {known})")
    refs = referenced(root).get(name, [])
    if refs and not include_current:
        raise CacheError(f"{path}: refs/{', refs/'.join(refs)} point to this entry (it is what `load` opens); "
                         "pass --include-current to remove it and those refs")
    size = _tree_bytes(path)
    shutil.rmtree(path)
    for ref in refs:
        (root / "refs" / f"{ref}.json").unlink(missing_ok=True)
    return {"entry": name, "reason": "removed on request", "bytes": size, "refs": refs}
