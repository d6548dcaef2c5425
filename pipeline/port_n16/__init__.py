"""The hand-off to tt-metal's GR00T N1.6 port: its own `Gr00tN16ModelTTNN`, built from a cache entry.

The port's constructors take HF torch dicts and preprocess every weight themselves (`w.t()`, head padding,
fusing, `ttnn.from_torch`). Our tt-n16 tensors are their output already, so here the port's own constructors run,
unchanged, on traced weights (no bytes, no device), and each `ttnn.from_torch` the port calls on one is answered
with the entry's `.tensorbin` of that target through `ttnn.load_tensor` (`device=` on a device). Weights it keeps
on the host (embed_tokens, q_norm, k_norm as float32) become the entry's host tensors.

One room per job:
- `code.py`: finding the port's tree, importing its modules from it, its revision;
- `trace.py`: running its constructors on traced weights, every `from_torch` listed (`intercepted`);
- `match.py`: each listed tensor held to a target of the entry, and the layout revisions that serve a port;
- `kept.py`: the traced model kept per entry and port revision as data (no pickle), rebuilt by later starts;
- `build.py`: the entry's files loaded, every byte checked, and put in place of the placeholders;
- `compare.py`: two built models compared attribute by attribute, and the port's own way of building one;
- `verdict.py`: every port revision held once to the port's own constructor, the verdict kept under the cache.
"""

from __future__ import annotations

import time
from pathlib import Path

from pipeline import cache
from pipeline.inputs.embodiments import Embodiments
from pipeline.port_n16.build import PortModel, list_model, load_model
from pipeline.port_n16.code import TT_METAL_ENV, PortCode, PortError
from pipeline.port_n16.compare import build_with_port, differences
from pipeline.port_n16.match import serving_layout
from pipeline.port_n16.trace import port_config
from pipeline.port_n16.verdict import check_port, require_passing, shapes_of

__all__ = ["PortCode", "PortError", "PortModel", "TT_METAL_ENV", "build_model", "build_with_port", "check_port",
           "differences", "port_config", "serving_layout", "shapes_of"]


def build_model(cache_root=None, tt_metal: str | Path | None = None, device=None, *,
                embodiments: Embodiments | str | int | None = None, entry: str | None = None, profile: str | None = None,
                config=None, check: bool = True, threads: int = 4, synthetic: bool = False) -> PortModel:
    """The port's `Gr00tN16ModelTTNN` from a cache entry, on `device` (None: ttnn host tensors). Reads no
    safetensors and calls `from_torch` on no weight: every device tensor is ttnn's `load_tensor` of the entry's
    `.tensorbin`. `embodiments`: every slot the entry holds (default, as the port builds them), or a list of
    tags/ids. `entry`: one entry by name (default: the last conversion in the layout revision that serves this
    port). `config`: the port's Gr00tN16Config (default: derived from the entry, see `port_config`). `check`: hold
    this port revision to the port's own constructor once first (`check_port`). A synthetic entry warns
    (SyntheticWeightsWarning) unless `synthetic=True`."""
    started = time.perf_counter()
    embodiments = Embodiments.parse(embodiments)  # once, here; list_model and load_model take it as it is
    code = PortCode.find(tt_metal)
    store = cache.cache_store(cache_root)
    listed = list_model(code, store, entry=entry, profile=profile, embodiments=embodiments, config=config,
                        device=device, started=started)
    cache.warn_if_synthetic(listed.entry, synthetic)
    if check:
        require_passing(code, listed.entry.manifest.layout, cache.build_root(store))
    return load_model(listed, embodiments=embodiments, device=device, threads=threads)
