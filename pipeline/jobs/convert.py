"""The convert job: snapshot -> plan -> fingerprint -> (cache hit | graph run -> publish) -> summary."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import resource
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import KW_ONLY, dataclass, field, replace
from pathlib import Path
from typing import Mapping

from pipeline import cache
from pipeline.inputs.embodiments import Embodiments
from pipeline.inputs.folder import Folder, read_folder
from pipeline.jobs.graph import PUBLISH, GraphInputs, build_graph
from pipeline.jobs.load import load
from pipeline.model.recipe import build_plan, recipes_sha256
from pipeline.jobs.reuse import Reuse, plan_reuse
from pipeline.jobs.run import IN_PROCESS, check_scheduler, run
from pipeline.jobs.summary import ConvertSummary
from pipeline.inputs.snapshot import resolve_snapshot, snapshot_revision
from pipeline.model.versions import load_config
from tasks.checkpoint import Checkpoint
from tasks.entries.chunks import create_arrays
from tasks.entries.entry import Entry
from tasks.entries.manifest import Identity, array_documents
from tasks.entries.names import FRESH_FOR, entry_key, scratch_name
from tasks.entries.objects import Present, present_objects
from tasks.entries.progress import already_staged, record_progress, staged_records
from tasks.entries.publish import push
from tasks.entries.refs import write_ref
from tasks.errors import CacheError, ConfigError
from tasks.plan import Plan, work_units
from tasks.source import VerifiedShard
from tasks.entries.store import LocalStore
from tasks.file_blocks import is_remote, open_binary
from tasks.bulk_write import writes_finished


@dataclass(frozen=True)
class ConvertOptions:
    version: str | None  # None: found from the checkpoint's keys (with --snapshot or --model)
    _: KW_ONLY
    profile: str | None = None  # default: the layout's (recipes.toml [layouts.<layout>] default_profile)
    embodiments: Embodiments | str | int = "all"  # parsed once, here: an Embodiments from then on
    scheduler: str = "threads"
    snapshot: Path | None = None
    hf_cache: Path | None = None
    cache_root: Path | None = None
    force: bool = False
    workers: int | None = None
    progress: bool = True
    check_bf16: bool = False  # round-trip bf16 targets through ttnn too (exact by construction; slow)
    check_against_cache: bool = False  # convert afresh and compare byte for byte with the published entry
    reuse: bool = True  # link arrays whose content another published entry already holds (fine-tunes)
    device: object = None  # an open ttnn device or mesh: targets are uploaded as they are staged
    layout: str | None = None  # default: the version's (configs/<version>.toml default_layout)
    revision: str | None = None  # the release's revision to read (default: the pinned one)
    synthetic: str | None = None  # a scale: convert the project's synthetic stand-in instead of the release
    model: str | None = None  # a hub repo id (a fine-tune's own repo): resolved through huggingface_hub
    sha256: bool = False  # record every shard's sha256 (provenance); taken anyway where an HF blob name expects one

    def __post_init__(self) -> None:
        object.__setattr__(self, "embodiments", Embodiments.parse(self.embodiments))


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def writable_folder(root: Path, what: str) -> None:
    """Refuse, before anything is read, a cache (or HF cache) folder that is a file or cannot be written."""
    if root.exists() and not root.is_dir():
        raise CacheError(f"{root}: the {what} is a file, not a folder; pass a folder (it is made if missing)")
    probe = root / f".write-probe-{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe.touch()
        probe.unlink()
    except OSError as e:
        raise CacheError(f"{root}: cannot write to this {what} folder ({e.strerror}); pass one you can write "
                         f"({'--cache DIR or $GR00T_CACHE' if what == 'cache' else '--hf-cache DIR'})") from None


@dataclass(frozen=True, kw_only=True)
class Prepared:
    """Everything up to the fingerprint: the open snapshot, the plan, the slots, the entry's identity, and the
    local cache the entry is built in."""
    checkpoint: Checkpoint
    plan: Plan
    slots: tuple[int, ...]
    identity: Identity       # what the entry's bytes are a function of, and its fingerprint
    root: Path
    identified: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # shard -> tensor xxh3, taken to name it
    notes: tuple[str, ...] = ()  # what the folder holds that the user should hear of (files left alone, …)

    @property
    def name(self) -> str:
        return self.identity.name


@dataclass(frozen=True, kw_only=True)
class Built:
    """What running the graph gave: publish's result, stage timings, the graph, the chunks a killed run had
    already staged (and the reuse links among them), and what was reused."""
    result: dict
    timings: dict
    graph: dict
    done: dict
    reused: Reuse


def open_folder(opts: ConvertOptions) -> Folder:
    """The checkpoint `opts` names, with everything its folder says about itself (pipeline/inputs/folder.py)."""
    hf = opts.hf_cache or (cache.synthetic_hf_cache(opts.cache_root) if opts.synthetic else None)
    cfg = load_config(opts.version) if opts.version else None
    return read_folder(resolve_snapshot(cfg, opts.snapshot, hf, opts.revision, opts.synthetic, opts.model), opts.version)


def prepare(opts: ConvertOptions, root: Path | None = None) -> Prepared:
    """Open and check the snapshot, plan the targets, name the entry. `root` is the local cache the entry is
    built in (default: the one `opts.cache_root` builds in)."""
    root = root or cache.build_root(cache.cache_store(opts.cache_root))
    folder = open_folder(opts)
    ck, version = folder.checkpoint, folder.version
    shapes = {k: ck.shape(k) for k in ck.keys()}
    plan = build_plan(version, shapes, opts.profile, opts.layout, {k: ck.dtype(k) for k in ck.keys()})
    slots = folder.slots(opts.embodiments)
    source = {"snapshot": str(ck.dir), "revision": snapshot_revision(ck.dir), "synthetic": ck.synthetic,
              "model": opts.model, **folder.source_record()}
    identities, identified = cache.source_identity(root, ck)
    ident = Identity.of(plan, source=source, shard_sha=identities, slots=slots, source_shapes=shapes,
                        recipes_sha256=recipes_sha256())
    return Prepared(checkpoint=ck, plan=plan, slots=slots, identity=ident, root=root, identified=identified,
                    notes=tuple(folder.notes(opts.embodiments)))


def convert(opts: ConvertOptions) -> ConvertSummary:
    """Convert (or reuse) one entry; returns what it did (pipeline/jobs/summary.py). The entry is built in a
    local folder and published there by rename; a cache that cannot rename (an object store) then gets it pushed,
    manifest last — the one place the two kinds of cache differ."""
    check_scheduler(opts.scheduler)  # what can be refused is refused before anything is read or claimed
    if opts.device is not None and opts.scheduler not in IN_PROCESS:
        raise ConfigError(f"--device needs the threads or sync scheduler (an open device cannot move to "
                          f"{opts.scheduler} workers)")
    t0 = time.perf_counter()
    store = cache.cache_store(opts.cache_root)
    root = cache.build_root(store)
    writable_folder(root, "cache")
    prep = prepare(opts, root)
    with prep.checkpoint:
        return _convert(opts, prep, store, t0)


def _convert(opts: ConvertOptions, prep: Prepared, store, t0: float) -> ConvertSummary:
    """`convert` once the checkpoint is open and the entry named: a cache hit, a check against the cache, or a
    build (into the local folder, or by the workers into an object store)."""
    ck, plan, slots, ident, root, name = prep.checkpoint, prep.plan, prep.slots, prep.identity, prep.root, prep.name
    asked = ConvertSummary(version=plan.version, version_found=opts.version is None, layout=plan.layout,
                           profile=plan.profile, fingerprint=ident.fingerprint,
                           cache_path=store.describe(entry_key(name)), slots=list(slots), targets=len(plan.targets),
                           skipped=dict(plan.skipped), source=ident.source, notes=list(prep.notes),
                           shards_checked_against=ident.shards_checked_against)
    existing = cache.find_entry(store, name) if not opts.force else None
    if opts.check_against_cache:
        if existing is None:
            raise CacheError(f"{asked.cache_path}: nothing is cached for this conversion, so there is nothing to "
                             "check against; run the convert without --check-against-cache first")
        return replace(asked, **check_against(existing, opts, prep), seconds=time.perf_counter() - t0)
    if existing is not None:
        write_ref(store, plan.version, plan.layout, plan.profile, name, bool(ident.synthetic))
        sha256, said = _recorded_sha256(existing, ck, opts.sha256)
        uploaded = None
        if opts.device is not None:  # nothing to convert: upload straight from the cache
            slot = slots[0] if len(slots) == 1 else None
            uploaded = load(plan.version, store, slot, into=opts.device, profile=plan.profile, layout=plan.layout,
                            entry=name, synthetic=True).tensors
        return replace(asked, cache_hit=True, tasks=0, bytes_read=0, bytes_written=0, shards_sha256=sha256,
                       notes=asked.notes + said, device_tensors=uploaded, seconds=time.perf_counter() - t0,
                       peak_rss_bytes=peak_rss_bytes())
    final = cache.entries_dir(root) / name
    pushed, local_build = None, None
    if not store.can_rename and opts.device is None:  # the workers put the entry into the store themselves
        built = _build_in_store(opts, prep, store)
        pushed = built.result["pushed_bytes"]
    else:
        built = _build(opts, prep, name, final)
        if not store.can_rename:  # a device is open here: built beside it, then pushed
            local_build, pushed = str(final), push(cache.entry_at(final), store, opts.progress)
    result, done, reused = built.result, built.done, built.reused
    write_ref(store, plan.version, plan.layout, plan.profile, name, bool(ident.synthetic))
    return replace(asked, cache_hit=False, resumed_chunks=len(done) - len(reused.records),
                   reused_chunks=len(reused.records), reused_bytes=reused.linked_bytes,
                   identified_shards=sorted(reused.identified), tasks=len(built.graph),
                   bytes_read=_source_bytes_read(plan, ck, slots, done),
                   bytes_written=result["file_bytes"] - sum(r.record.file_bytes for r in done.values()),
                   stage_seconds=built.timings["stage_seconds"], stage_tasks=built.timings["stage_tasks"],
                   peak_rss_bytes=peak_rss_bytes(), published_here=result["published_here"],
                   device_tensors=result["device_tensors"], shards_sha256=result["shards_sha256"],
                   numerics=sorted(result["numerics"], key=lambda n: (n["pcc"], -n["max_abs_err"])),
                   pushed_bytes=pushed, local_build=local_build, seconds=time.perf_counter() - t0)


def _recorded_sha256(existing: Entry, ck: Checkpoint, wanted: bool) -> tuple[dict[str, str], list[str]]:
    """On a cache hit: the shards' sha256 as the entry records them; with --sha256 and none recorded (the entry was
    converted without it), taken now with hashlib, and a note that the entry itself does not hold them."""
    recorded = dict(existing.manifest.shards_sha256)
    if not wanted or set(recorded) >= set(ck.headers):
        return recorded, []
    taken = {}
    for shard in sorted(ck.headers):
        with open_binary(ck.shard_path(shard)) as f:
            taken[shard] = hashlib.file_digest(f, "sha256").hexdigest()
    return taken, [f"sha256 taken now: {existing.describe()} was converted without --sha256 and does not record "
                   "them; convert with --force --sha256 to record them in the entry"]


def _shared(ck: Checkpoint, entry: Path | None = None) -> dict[str, str]:
    """The folders a cluster's workers must see, and what to do when they cannot (a checkpoint in an object store
    is read from there by every worker)."""
    shared = {} if is_remote(ck.dir) else {
        str(ck.dir): "put the checkpoint where every worker can read it at the same path (a shared filesystem) or "
                     "in the object store (--snapshot s3://bucket/prefix), or convert with --scheduler threads"}
    if entry is not None:
        shared[str(entry)] = ("a cache folder is this machine's own: pass an object-store cache (--cache "
                              "s3://bucket/prefix), which the workers write to themselves, or a cache folder on a "
                              "filesystem they share")
    return shared


def _checked_when_identified(prep: Prepared, sha256: bool) -> dict[str, VerifiedShard]:
    """Shards whose content identity this run took from their bytes moments ago: checked by that pass (a second
    one would compare the same bytes with themselves), unless their sha256 is asked for (--sha256)."""
    ck = prep.checkpoint
    return {} if sha256 else {s: VerifiedShard(ck.headers[s], None, hashes) for s, hashes in prep.identified.items()}


def _build_in_store(opts: ConvertOptions, prep: Prepared, store) -> Built:
    """Run the graph with every stage task putting its objects into the object store from the worker that runs
    it, and the publish task putting the manifest last: the client plans and names, the workers write. What a
    published entry of the store already holds is named by the new manifest, not converted, sent or copied; bytes
    the store holds already (a killed run's, or another entry's) are not sent again."""
    ck, plan, slots, ident = prep.checkpoint, prep.plan, prep.slots, prep.identity
    present = present_objects(store)
    fresh_after = time.time() - FRESH_FOR
    arrays = array_documents(plan, slots)
    reused = _reuse(opts, prep, store, entry_key(prep.name), arrays, present, fresh_after)
    inputs = GraphInputs(plan=plan, checkpoint=ck, slots=slots, expected_identity=dict(ident.shards),
                         done=reused.records, identity=ident, arrays=arrays, check_bf16=opts.check_bf16,
                         prehashed=_prehashed(prep, reused, reused.records, opts.sha256), record_sha256=opts.sha256,
                         store_url=store.describe(""), present=present, fresh_after=fresh_after)
    graph = build_graph(inputs)
    result, timings = run(graph, PUBLISH, opts.scheduler, opts.workers, opts.progress, _shared(ck))
    result["pushed_bytes"] = sum(n for k, n in result["objects"].items() if k not in present) + result["document_bytes"]
    return Built(result=result, timings=timings, graph=graph, done=dict(reused.records), reused=reused)


def _reuse(opts: ConvertOptions, prep: Prepared, store, into: str, arrays: Mapping[str, dict],
           present: Present | None = None, fresh_after: float = 0.0) -> Reuse:
    """What published entries of `store` already hold, given to the entry being built under `into` (none with
    --force, which means "rebuild from the source", or without reuse)."""
    if not opts.reuse or opts.force:
        return Reuse()
    attrs = {name: doc["attributes"] for name, doc in arrays.items()}
    return plan_reuse(store, prep.plan, prep.slots, prep.checkpoint, dict(prep.identity.shards), into=into,
                      array_attrs=attrs, identified=prep.identified, present=present, fresh_after=fresh_after)


def _prehashed(prep: Prepared, reused: Reuse, done: Mapping, sha256: bool) -> dict[str, VerifiedShard]:
    """Shards the graph need not hash again. A shard known by its identity alone (an earlier entry's) is trusted
    like a cache hit, unless something is read from it (or its sha256 is asked for and unknown); one identified in
    this run is checked by that pass. Every other shard is checked by the graph's verify task, beside the
    conversion."""
    ck, plan, slots = prep.checkpoint, prep.plan, prep.slots
    read_from = {ck.shard_of(k) for t, slot in work_units(plan.targets, slots)
                 if (t.name, slot) not in done for k in t.sources}
    prehashed = {s: v for s, v in reused.verified.items()
                 if (s not in reused.identified or s not in read_from) and (v.sha256 or not sha256)}
    return prehashed | _checked_when_identified(prep, sha256)


def _build(opts: ConvertOptions, prep: Prepared, name: str, final: Path) -> Built:
    """Run the graph into a temporary directory (adopting a killed run's work) and publish it as `final`."""
    ck, plan, slots, ident, root = prep.checkpoint, prep.plan, prep.slots, prep.identity, prep.root
    tmp = cache.claim_tmp(root, name)
    try:
        arrays = array_documents(plan, slots)
        store = LocalStore(root)
        reused = _reuse(opts, prep, store, tmp.relative_to(root).as_posix(), arrays)
        create_arrays(tmp, arrays, like=[store.path(entry_key(e)) for e in reused.holders])
        expected = dict(ident.shards)  # each shard's HF blob sha256, or its content identity
        for staged in reused.records.values():
            record_progress(tmp, staged)
        done = _still_staged(tmp, plan, slots, reused.records)
        prehashed = _prehashed(prep, reused, done, opts.sha256)
        inputs = GraphInputs(plan=plan, checkpoint=ck, slots=slots, entry_tmp=tmp, entry_final=final,
                             expected_identity=expected, done=done, identity=ident, arrays=arrays,
                             check_bf16=opts.check_bf16, prehashed=prehashed, device=opts.device, replace=opts.force,
                             record_sha256=opts.sha256, write_behind=opts.scheduler in IN_PROCESS)
        graph = build_graph(inputs)
        result, timings = run(graph, PUBLISH, opts.scheduler, opts.workers, opts.progress, _shared(ck, tmp))
    except BaseException as e:
        # A kill -9 never gets here and Ctrl-C is let through, so their directory stays for the next run to
        # resume; an error must not leave a half-built directory behind (nor a write handed off make it again).
        with contextlib.suppress(Exception):  # the error being raised is `e`; a handed-off write's is a symptom
            writes_finished(tmp)
        if not isinstance(e, KeyboardInterrupt):
            shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise CacheError(f"{e.filename or tmp}: no space left on the device while staging {name}; nothing was "
                             f"published and the temporary files were removed — free space or pass --cache DIR on "
                             f"a larger disk") from e
        raise
    return Built(result=result, timings=timings, graph=graph, done=done, reused=reused)


def _still_staged(tmp: Path, plan: Plan, slots: tuple[int, ...], linked: Mapping) -> dict:
    """The progress records whose files still hold their bytes: a killed run's, checked side by side, and the
    links just made (`linked`), taken as they are. A link is the published entry's own file, not a copy: reading
    it here would check that entry, which every load of either entry does anyway, and it cost a fine-tune's
    convert 10.8 s for 5.3 GB (1.2 s when the page cache still held them)."""
    records = staged_records(tmp)
    candidates = [(len(t.shape), records[(t.name, slot)]) for t, slot in work_units(plan.targets, slots)
                  if (t.name, slot) in records and (t.name, slot) not in linked]
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        kept = list(pool.map(lambda c: already_staged(tmp, c[1], c[0]), candidates))
    return {(r.name, r.slot): r for (_, r), ok in zip(candidates, kept) if ok} | dict(linked)


def check_against(existing: Entry, opts: ConvertOptions, prep: Prepared) -> dict:
    """Convert afresh into a scratch entry and compare every chunk with the cached one, so a cache can never hide
    a broken conversion. The scratch entry is deleted either way."""
    scratch = scratch_name(existing.name, os.getpid())
    folder = cache.entries_dir(prep.root) / scratch
    try:
        _build(replace(opts, reuse=False), prep, scratch, folder)
        fresh = cache.entry_at(folder).manifest.arrays
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    cached = existing.manifest.arrays
    differ = sorted(n for n in fresh.keys() | cached.keys() if fresh.get(n) != cached.get(n))
    problems = existing.verify()
    if differ or problems:
        raise CacheError(f"{existing.describe()}: the cached entry differs from a fresh conversion in {len(differ)} "
                         f"array(s){' (first ' + differ[0] + ')' if differ else ''} and has {len(problems)} bad "
                         "chunk(s); delete it or convert with --force")
    return {"cache_hit": True, "checked_against_fresh_conversion": True, "arrays_compared": len(fresh), "tasks": 0,
            "bytes_read": 0, "bytes_written": 0, "peak_rss_bytes": peak_rss_bytes()}  # ConvertSummary's fields


def _source_bytes_read(plan: Plan, ck: Checkpoint, slots: tuple[int, ...], done: dict) -> int:
    """Bytes the read/slot tasks fetched (verify's hashing pass is counted separately in its stage time)."""
    total = 0
    for t, slot in work_units(plan.targets, slots):
        if (t.name, slot) not in done:
            for key in t.sources:
                nbytes = ck.info(key).nbytes
                total += nbytes // ck.shape(key)[0] if slot is not None else nbytes
    return total
