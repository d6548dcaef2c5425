"""What one convert is asked to do: `ConvertOptions`, parsed once by the command line or built by a caller, and read
by every step of the job (pipeline/jobs/convert.py)."""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass
from pathlib import Path

from pipeline.inputs.embodiments import Embodiments


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
    stall_seconds: float | None = None  # an object store's stall limit, --stall-seconds (None: $GR00T_STALL_SECONDS, else 30)

    def __post_init__(self) -> None:
        object.__setattr__(self, "embodiments", Embodiments.parse(self.embodiments))
