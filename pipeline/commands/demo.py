"""`demo`: the product in five steps on tiny synthetic checkpoints (nothing real is read or written): synthesize
N1.7, convert it into tt-port, convert again (a cache hit), reload one embodiment as ttnn host tensors; then N1.6 in
the tt-n16 layout its port builds. The tensors shown are chosen from what was loaded, one per model part."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from pipeline.jobs.convert import ConvertOptions, convert
from pipeline.commands.inspection import inspect_report
from pipeline.jobs.load import load
from pipeline.commands.printing import mb, print_convert, print_inspect, print_targets
from pipeline.cache import synthetic_hf_cache
from pipeline.inputs.synth import synthesize
from tasks.device.ttnn_edge import ttnn_module


def examples(tensors: dict) -> tuple[str, ...]:
    """One tensor of each model part (under each top-level prefix, the first matmul weight: 2-D and not [1, H],
    named `weight` or a bank's `W`), and the first host table (kept on the host, as the port keeps it): what a
    reader of the demo needs to see of the whole, whatever the layout names its targets."""
    parts: dict[str, list[str]] = {}
    for name in tensors:
        parts.setdefault(name.split(".", 1)[0], []).append(name)
    device = {n for n, t in tensors.items() if hasattr(t, "padded_shape")}  # a ttnn tensor; the rest are host tables
    matmul = lambda n: n in device and n.rsplit(".", 1)[-1] in ("weight", "W") and len(tensors[n].shape) == 2 \
        and min(tensors[n].shape) > 1  # noqa: E731 (a norm is stored [1, H])
    chosen = [next((n for n in names if matmul(n)), names[0]) for names in parts.values()]
    host = next((n for n in tensors if n not in device), None)
    return tuple(dict.fromkeys([*chosen, *([host] if host else [])]))  # in order, each once


def run_demo(cache_root: Path | str | None) -> dict:  # what `demo --json` prints: the first convert's record
    demo_hf = synthetic_hf_cache(cache_root)
    print(f"1. synthesizing a tiny GR00T N1.7 into {demo_hf} (real key names, order, counts and shards; small "
          "dims; marked synthetic, under a repo id of its own)")
    synthesize("n17", demo_hf, "tiny")
    print_inspect(inspect_report("n17", None, demo_hf, synthetic="tiny"))
    print("\n2. converting it into tt-port, n17's default: the conventions of tt-metal's GR00T N1.6 port, family by "
          "family (Dask graph: index -> read/slot -> transform -> convert -> stage -> unit -> publish; verify hashes "
          "each shard alongside and gates its units)")
    opts = ConvertOptions("n17", hf_cache=demo_hf, synthetic="tiny", cache_root=cache_root)
    summary = convert(opts)
    print_convert(summary)
    print("\n3. converting again: the cache entry is reused")
    print_convert(convert(replace(opts, progress=False)))
    ttnn_module()  # imported before the load (its line times the reload, not ttnn's first import), quietly

    loaded = load("n17", cache_root, embodiment="new_embodiment", into="ttnn", synthetic=True)
    print(f"\n4. reloaded {loaded.stats['tensors']} tensors for embodiment new_embodiment (slot {loaded.slot}) "
          f"from the cache in {loaded.stats['seconds']:.3f} s, {mb(loaded.stats['bytes_read'])} read, as the "
          "ttnn host tensors a device takes (one of each part):")
    print_targets(loaded.tensors, examples(loaded.tensors))
    print("\n5. a tiny N1.6 in the tt-n16 layout (n16's default): the tensors tt-metal's GR00T N1.6 port builds")
    synthesize("n16", demo_hf, "tiny")
    port = convert(ConvertOptions("n16", embodiments="gr1", hf_cache=demo_hf, synthetic="tiny",
                                  cache_root=cache_root, progress=False))
    print_convert(port)
    host = load("n16", cache_root, "gr1", into="ttnn", synthetic=True)
    print_targets(host.tensors, examples(host.tensors))
    return summary.as_json()

