"""`inspect`: what a checkpoint folder holds (its shards' framing, the unit a shard boundary cuts, the embodiment
tensors and the tags that name their slots, and for a fine-tune the tags its trainer recorded and their slots) as one
plain dict; the CLI prints it (pipeline/commands/printing.py) or hands it on as JSON."""

from __future__ import annotations

from pathlib import Path

from pipeline.inputs.embodiments import Embodiments
from pipeline.inputs.folder import read_folder
from pipeline.inputs.processor_files import read_processor_files
from pipeline.inputs.snapshot import resolve_snapshot
from pipeline.jobs.prepare import checkpoint_store_failures_said
from pipeline.model.state_dict import straddling_unit
from pipeline.model.versions import load_config
from tasks.errors import PipelineError


def inspect_report(version: str | None, snapshot: Path | None, hf_cache: Path | None, revision: str | None = None,
                   synthetic: str | None = None, model: str | None = None, stall: float | None = None) -> dict:
    """`version` None: found from the checkpoint's keys, as the convert finds it. A fine-tune's trained tags are
    read with its trainer's own map, as `convert --embodiments trained` reads them."""
    with checkpoint_store_failures_said(snapshot):  # a checkpoint in a bucket out of reach: one sentence, as for a convert
        folder = read_folder(resolve_snapshot(load_config(version) if version else None, snapshot, hf_cache,
                                              revision, synthetic, model, stall), version)
    version, trained = folder.version, Embodiments.parse("trained") if folder.trained else Embodiments()
    notes = folder.notes(trained)
    try:
        slots = list(folder.slots(trained)) if folder.trained else None
    except PipelineError as e:  # what the convert would refuse, said here among what the folder holds
        slots, notes = None, [*notes, f"--embodiments trained would be refused: {e}"]
    with folder.checkpoint as ck:
        unit = straddling_unit(version)
        straddle = {s: [k[len(unit) + 1:] for k in ck.keys_with_prefix(unit + ".") if ck.shard_of(k) == s]
                    for s in ck.shards_for_prefix(unit + ".")}
        return {"version": version, "version_found": folder.version_found, "snapshot": str(ck.dir),
                "synthetic": ck.synthetic, "tensors": len(ck), "total_bytes": ck.total_bytes,
                "index_total_size": ck.metadata.get("total_size"), "shards": ck.byte_accounting(),
                "straddling_unit": unit, "straddle": straddle,
                "embodiment_tensors": {k: list(ck.shape(k)) for k in folder.config.embodiment_keys},
                "embodiment_tags": dict(folder.tag_map.ids), "embodiment_map": folder.tag_map.source,
                "trained_embodiments": list(folder.trained.value) if folder.trained else None,
                "trained_from": folder.trained.source if folder.trained else None,
                "trained_slots": slots, "notes": notes, "processor": processor_summary(ck.dir)}


def processor_summary(folder) -> dict | None:
    """The trainer's processor files found beside the weights (whose, where, which, for which embodiments), or
    None: what a convert would keep in the entry."""
    try:
        kept = read_processor_files(folder)
    except PipelineError as e:  # what the convert would refuse, said as what the folder holds
        return {"refused": str(e)}
    return None if kept is None else kept.record()
