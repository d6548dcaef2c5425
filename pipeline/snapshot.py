"""Find a version's pinned snapshot: `--snapshot DIR`, else the Hugging Face cache (offline-aware, never downloads)."""

from __future__ import annotations

from pathlib import Path

from huggingface_hub import constants, try_to_load_from_cache

from pipeline.versions import VersionConfig
from tasks.checkpoint import INDEX_NAME
from tasks.errors import CheckpointError


def default_hf_cache() -> Path:
    """HF_HUB_CACHE (or HF_HOME/hub, or ~/.cache/huggingface/hub), as huggingface_hub resolves it."""
    return Path(constants.HF_HUB_CACHE)


def repo_folder(cfg: VersionConfig, hf_cache: Path) -> Path:
    """`models--org--name` under the cache, as huggingface_hub names it."""
    return Path(hf_cache) / ("models--" + cfg.repo_id.replace("/", "--"))


# Where `synth` writes by default (and `make demo` synthesizes): looked at after the user's own HF cache, so that
# `make convert` works right after `make demo`.
PROJECT_HF_CACHE = Path(__file__).resolve().parent.parent / "cache" / "hf"


def resolve_snapshot(cfg: VersionConfig, snapshot: Path | None = None, hf_cache: Path | None = None) -> Path:
    """The snapshot folder holding `model.safetensors.index.json` at the config's pinned revision."""
    if snapshot is not None:
        if not (Path(snapshot) / INDEX_NAME).is_file():
            raise CheckpointError(Path(snapshot) / INDEX_NAME, "--snapshot folder has no index file: pass the folder "
                                                                "that holds the shards and their index")
        return Path(snapshot)
    candidates = [Path(hf_cache)] if hf_cache is not None else [default_hf_cache(), PROJECT_HF_CACHE]
    for cache_dir in candidates:
        found = try_to_load_from_cache(cfg.repo_id, INDEX_NAME, cache_dir=str(cache_dir), revision=cfg.revision)
        if isinstance(found, str):
            return Path(found).parent
    cache_dir = candidates[0]
    raise CheckpointError(
        repo_folder(cfg, cache_dir), f"{cfg.repo_id} at revision {cfg.revision} is not in the Hugging Face cache. "
        f"Download it with `hf download {cfg.repo_id} --revision {cfg.revision} --cache-dir {cache_dir}`, "
        f"or make a synthetic stand-in with `python -m pipeline synth --version {cfg.version} --hf-cache {cache_dir}`, "
        "or pass --snapshot DIR")
