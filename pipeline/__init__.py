"""GR00T checkpoints into Tenstorrent device-ready weights.

The stable API is what this package exports, and only that (CHANGELOG.md says when it changes, and a name that moves
keeps working, with a DeprecationWarning, for one minor version):

    from pipeline import convert, load, build_model
    done = convert("n17", snapshot="path/to/checkpoint", embodiments="new_embodiment")
    weights = load("n17", embodiment="new_embodiment")

- `convert(version, **options)` or `convert(ConvertOptions(...))` -> `ConvertSummary`;
- `load(version, cache_root=None, embodiment=None, *, into="torch", ...)` -> `Loaded`;
- `build_model(...)` -> tt-metal's GR00T N1.6 port's own model, built from a cache entry;
- the errors, all `PipelineError`s: `ConfigError`, `CheckpointError`, `RecipeError`, `CacheError`, `NetworkError`,
  `ProcessorError`;
- `__version__`.

Everything else is internal and may move. The rooms beneath, each using only those listed after it:

- `commands/`: what a person sees (the CLI, its reports, the demo);
- `port_n16/`: tt-metal's GR00T N1.6 port built from a cache entry, and held to the port's own model;
- `jobs/`: convert, load, reuse, the graph and the scheduler that runs it;
- `inputs/`: the checkpoint a command names and what its folder says about itself;
- `cache/` and `model/`: the cache's policies over the entry format (tasks/entries/), and each GR00T version's
  state dict and target plan.
"""

from __future__ import annotations

import importlib
import sys

from pipeline import deprecated

# name -> the module it lives in: imported on first use, so that `import pipeline` stays light (the converter
# brings Dask, torch and ttnn with it)
_EXPORTS = {
    "convert": "pipeline.jobs.convert", "ConvertOptions": "pipeline.jobs.options",
    "ConvertSummary": "pipeline.jobs.summary", "load": "pipeline.jobs.load", "Loaded": "pipeline.jobs.load",
    "build_model": "pipeline.port_n16", "PipelineError": "tasks.errors", "ConfigError": "tasks.errors",
    "CheckpointError": "tasks.errors", "RecipeError": "tasks.errors", "CacheError": "tasks.errors",
    "NetworkError": "tasks.io.network", "ProcessorError": "pipeline.model.processor",
}
__all__ = ["__version__", *_EXPORTS]


def _installed_version() -> str:
    import importlib.metadata  # on first use: it scans every installed distribution, a cost at every start

    try:
        return importlib.metadata.version("gr00t-tt-weights")
    except importlib.metadata.PackageNotFoundError:  # a source tree on the path, not installed
        return "0+unknown"


def __getattr__(name: str):
    if name == "__version__":
        globals()[name] = version = _installed_version()
        return version
    if name not in _EXPORTS:
        raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


# `from pipeline.load import load` and the other spellings of 0.1.0: pipeline/deprecated.py
deprecated.answer_old_paths(sys.modules[__name__])
