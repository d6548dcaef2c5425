"""The processor an entry keeps, for the embodiment loaded: which trainer's files it kept, and which reader makes
its processor of them (Isaac-GR00T's: pipeline/model/processor.py; LeRobot's: pipeline/model/lerobot_processor.py).
"""

from __future__ import annotations

from typing import Mapping

from pipeline.model.lerobot_processor import from_lerobot_files
from pipeline.model.processor import Processor, ProcessorError, embodiments_in, from_files


def for_entry(entry: str, source: Mapping[str, object], files: Mapping[str, bytes], slot: int | None,
              tag: str | None) -> Processor:
    """The processor of the embodiment an entry was loaded for (`tag` as asked, else the tag of `slot` in the map
    the convert used, preferring the tags the trainer recorded), from the files the entry keeps."""
    kept = source.get("processor") if isinstance(source.get("processor"), dict) else None
    if not files or kept is None:
        snapshot = source.get("snapshot") or "the fine-tune's folder"
        raise ProcessorError(f"entry {entry} keeps no processor (converted before processors were kept, or from a "
                             f"folder without the trainer's statistics); convert it again: python -m pipeline convert "
                             f"--snapshot {snapshot} --embodiments trained")
    trainer = str(kept.get("trainer"))
    where = f"entry {entry} ({kept.get('from')})"
    if trainer == "LeRobot":
        return from_lerobot_files(files, tag, slot, where)
    if not trainer.startswith("Isaac-GR00T") or trainer == "Isaac-GR00T N1.5":
        raise ProcessorError(f"entry {entry} keeps {trainer}'s processor files ({', '.join(sorted(files))}), whose "
                             "arithmetic this version does not run yet; read them with Loaded.processor_files")
    tag = tag or _tag_of(source, embodiments_in(files), slot, where)
    if slot is None:  # every slot loaded: the tag's own, by the map the convert used
        table = source.get("embodiment_table") or {}
        slot = (table.get("ids") or {}).get(tag) if isinstance(table, dict) else None
    return from_files(files, tag, slot, where, trainer)


def _tag_of(source: Mapping[str, object], tags: list[str], slot: int | None, where: str) -> str:
    table = source.get("embodiment_table") or {}
    ids = table.get("ids", {}) if isinstance(table, dict) else {}
    candidates = [t for t in tags if slot is None or ids.get(t) == slot]
    trained = [t for t in candidates if t in (source.get("trained_embodiments") or ())]
    if len(trained) == 1 or len(candidates) == 1:
        return (trained or candidates)[0]
    raise ProcessorError(f"{where}: {'no' if not candidates else 'more than one'} embodiment of the trainer's "
                         f"statistics ({', '.join(tags) or 'none'}) is slot {slot}; load by tag: "
                         "load(..., embodiment=<tag>)")
