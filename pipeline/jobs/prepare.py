"""Before any work: the checkpoint found (pipeline/inputs/snapshot.py) and read once (pipeline/inputs/folder.py),
its targets planned (pipeline/model/recipe.py), and its entry named by what it is made from. Nothing is converted
or written here but the source-identity memo (pipeline/cache/sources.py)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from pipeline import cache
from pipeline.inputs.folder import read_folder
from pipeline.inputs.processor_files import ProcessorFiles, embodiments_of, read_processor_files
from pipeline.inputs.snapshot import hf_cache_folder, resolve_snapshot
from pipeline.jobs.options import ConvertOptions
from pipeline.model.recipe import build_plan, recipes_sha256
from pipeline.model.versions import load_config
from tasks.source.checkpoint import Checkpoint
from tasks.entries.manifest import Identity
from tasks.entries.object_stores import object_store_failure
from tasks.errors import CheckpointError
from tasks.io.file_blocks import is_remote, is_url
from tasks.plan import Plan


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
    processor: Mapping[str, bytes] = field(default_factory=dict, repr=False)  # the trainer's files, kept in the entry
    processor_said: str = ""  # what the convert says of them

    @property
    def name(self) -> str:
        return self.identity.name


def prepare(opts: ConvertOptions, root: Path | None = None) -> Prepared:
    """Find and read the checkpoint, plan the targets, name the entry. `root` is the local cache the entry is
    built in (default: the one `opts.cache_root` builds in)."""
    root = root or cache.build_root(cache.cache_store(opts.cache_root, opts.stall_seconds))
    hf = hf_cache_folder(opts.hf_cache) if opts.hf_cache else (
        cache.synthetic_hf_cache(opts.cache_root) if opts.synthetic else None)
    with checkpoint_store_failures_said(opts.snapshot):
        where = resolve_snapshot(load_config(opts.version) if opts.version else None, opts.snapshot, hf,
                                 opts.revision, opts.synthetic, opts.model, opts.stall_seconds)
        folder = read_folder(where, opts.version)
    with checkpoint_store_failures_said(opts.snapshot):
        kept = read_processor_files(folder.checkpoint.dir)
    source = folder.source_record(opts.model) | ({"processor": kept.record()} if kept else {})
    slots, notes = folder.slots(opts.embodiments), folder.notes(opts.embodiments)
    ck = folder.checkpoint
    shapes = {k: ck.shape(k) for k in ck.keys()}
    plan = build_plan(folder.version, shapes, opts.profile, opts.layout, {k: ck.dtype(k) for k in ck.keys()})
    with checkpoint_store_failures_said(opts.snapshot):
        identities, identified = cache.source_identity(root, ck)
    ident = Identity.of(plan, source=source, shard_sha=identities, slots=slots, source_shapes=shapes,
                        recipes_sha256=recipes_sha256(), processor=kept.files if kept else None)
    return Prepared(checkpoint=ck, plan=plan, slots=slots, identity=ident, root=root, identified=identified,
                    notes=tuple(notes), processor=dict(kept.files) if kept else {},
                    processor_said=processor_line(kept, folder.checkpoint.dir))


def processor_line(kept: ProcessorFiles | None, folder: Path) -> str:
    """What a convert says of the trainer's processor: kept (whose, from where, for which embodiments), or none
    found, so that a user knows whether the entry can act without the source folder."""
    if kept is None:
        return f"none in {folder} (no trainer's statistics beside the weights): the entry keeps the weights only"
    tags = embodiments_of(kept)
    return (f"{kept.trainer}'s, kept in the entry from {kept.where} ({', '.join(sorted(kept.files))}; statistics "
            f"for {', '.join(tags) or 'no embodiment'})")


@contextlib.contextmanager
def checkpoint_store_failures_said(snapshot: object):
    """A checkpoint in an object store that refuses, or cannot be reached: one sentence naming its URL."""
    try:
        yield
    except Exception as e:
        remote = is_remote(snapshot) or is_url(snapshot)  # a UPath from the command line, or a URL from Python
        said = object_store_failure(e, instead="copy the checkpoint to a local folder") if remote else None
        if said is None:
            raise
        raise CheckpointError(snapshot, said) from None
