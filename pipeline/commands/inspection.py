"""`inspect`: what a checkpoint folder holds (its shards' framing, the unit a shard boundary cuts, the embodiment
tensors and the tags that name their slots) as one plain dict; the CLI prints it (pipeline/commands/printing.py) or hands
it on as JSON."""

from __future__ import annotations

from pathlib import Path

from pipeline.inputs.folder import read_folder
from pipeline.inputs.snapshot import resolve_snapshot
from pipeline.model.state_dict import straddling_unit
from pipeline.model.versions import load_config


def inspect_report(version: str, snapshot: Path | None, hf_cache: Path | None, revision: str | None = None,
                   synthetic: str | None = None, model: str | None = None) -> dict:
    cfg = load_config(version)
    folder = read_folder(resolve_snapshot(cfg, snapshot, hf_cache, revision, synthetic, model), version)
    with folder.checkpoint as ck:
        unit = straddling_unit(version)
        straddle = {s: [k[len(unit) + 1:] for k in ck.keys_with_prefix(unit + ".") if ck.shard_of(k) == s]
                    for s in ck.shards_for_prefix(unit + ".")}
        return {"version": version, "snapshot": str(ck.dir), "synthetic": ck.synthetic, "tensors": len(ck), "total_bytes": ck.total_bytes,
                "index_total_size": ck.metadata.get("total_size"), "shards": ck.byte_accounting(),
                "straddling_unit": unit, "straddle": straddle,
                "embodiment_tensors": {k: list(ck.shape(k)) for k in cfg.embodiment_keys},
                "embodiment_tags": dict(folder.tag_map.ids), "embodiment_map": folder.tag_map.source}
