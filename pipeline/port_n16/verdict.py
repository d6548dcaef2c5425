"""The self-check: every port revision is held once to the port's own constructor on a small synthetic checkpoint,
and the verdict kept under the cache root, keyed by the port's code, the layout, our recipes and the format."""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from pathlib import Path

from pipeline import cache
from pipeline.port_n16.code import VERSION, PortCode, PortError
from pipeline.port_n16.build import list_model, load_model
from pipeline.port_n16.compare import build_with_port, differences
from pipeline.port_n16.match import serving_layout
from pipeline.port_n16.trace import port_config
from pipeline.model.recipe import recipes_sha256
from tasks.entries.names import CACHE_FORMAT, CONVERTER_VERSION, PORT_CHECKS


CHECK_SCALE = "attn"  # real attention shapes: the port's cross-attention test sees non-square to_k there


def _verdict_path(root: Path, code: PortCode, layout: str) -> Path:
    key = hashlib.sha256(f"{code.revision}\0{layout}\0{recipes_sha256()}\0{CACHE_FORMAT}\0"
                         f"{CONVERTER_VERSION}".encode()).hexdigest()[:20]
    return root / PORT_CHECKS / f"{code.revision}-{layout}-{key}.json"


def check_port(code: PortCode, layout: str | None = None, build_root: Path | None = None, device=None,
               force: bool = False, log=None) -> dict:
    """Build a small synthetic N1.6 both ways, with the port's own constructor and from an entry of `layout`
    (default: the first layout revision that serves this port), compare everything, and keep the verdict."""
    root = build_root or cache.cache_root(None)
    layout = layout or serving_layout(code)
    record = _verdict_path(root, code, layout)
    if record.is_file() and not force and device is None:
        return json.loads(record.read_text())
    if log:
        log(f"port-check: port revision {code.revision} at {code.root} against a synthetic "
            f"N1.6 at {CHECK_SCALE} scale in {layout} (once per port revision)")
    from pipeline.jobs.convert import ConvertOptions, convert  # dask and more: imported only when a verdict is made
    from pipeline.inputs.synth import synthesize

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="port-check-") as tmp:
        hf = Path(tmp) / "hf"
        snapshot = synthesize(VERSION, hf, CHECK_SCALE)
        convert(ConvertOptions(VERSION, profile="port", embodiments="all", hf_cache=hf, synthetic=CHECK_SCALE, cache_root=Path(tmp) / "cache",
                               layout=layout, progress=False, reuse=False))
        listed = list_model(code, cache.cache_store(Path(tmp) / "cache"), device=device)
        ours = load_model(listed, device=device)
        theirs = build_with_port(code, snapshot, port_config(code, shapes_of(snapshot)), device)
        found = differences(ours.model, theirs)
    verdict = {"ok": not found, "revision": code.revision, "root": str(code.root), "layout": layout,
               "scale": CHECK_SCALE, "differences": found, "device_files": ours.stats["device_files"],
               "seconds": round(time.perf_counter() - t0, 2), "on_device": device is not None}
    if device is None:
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps(verdict, indent=1))
    return verdict


def require_passing(code: PortCode, layout: str, build_root: Path) -> None:
    """Refuse a port revision whose (kept or fresh) verdict found a difference from the port's own constructor."""
    verdict = check_port(code, layout, build_root=build_root)
    if not verdict["ok"]:
        raise PortError(f"{code.root} (port revision {code.revision}) failed its self-check against the port's "
                        f"own constructor: {verdict['differences'][0]}")


def shapes_of(snapshot: Path) -> dict[str, list[int]]:
    from tasks.source.checkpoint import Checkpoint

    with Checkpoint(snapshot) as ck:
        return {k: list(ck.shape(k)) for k in ck.keys()}


