"""`python -m pipeline <command>`: synth, inspect, convert, graph, load, cache, demo.

Every command exits 0 on success and 2 with one sentence on stderr for a known error (a `PipelineError`).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib.metadata
import json
import os
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path

from pipeline import cache
from pipeline.convert import ConvertOptions, convert, writable_folder
from pipeline.state_dict import straddling_unit
from pipeline.load import load
from pipeline.render import write_graph
from pipeline.snapshot import default_hf_cache, resolve_snapshot, synthetic_hf_cache
from pipeline.synth import FORMS, ISAAC_FORMS, fine_tune_form, synthesize
from pipeline.versions import SCALES, VERSIONS, load_config
from tasks import device as tt
from pipeline.folder import read_folder
from tasks.errors import CacheError, PipelineError

LAYOUT_HELP = ("tt-n16 (n16's default: what tt-metal's GR00T N1.6 port builds), tt-port (n15's and n17's default: "
               "that port's conventions, family by family), tt-n16-fused (n16, the port revision that fuses DiT q|k|v) "
               "or generic (the original unpadded layout)")
PROFILE_HELP = "port (the layout's per-family dtypes; tt-n16's and tt-port's default), bf16 (generic's default) or bfp8"


def _package_version() -> str:
    try:
        return importlib.metadata.version("gr00t-tt-weights")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def cmd_synth(a: argparse.Namespace) -> dict:
    t0 = time.perf_counter()
    hf = Path(a.hf_cache) if a.hf_cache else synthetic_hf_cache(a.cache)
    writable_folder(hf, "HF cache")
    before = set(hf.iterdir())
    try:
        snap = synthesize(a.version, hf, a.scale, a.seed)
    except OSError as e:
        for made in set(hf.iterdir()) - before:  # nothing half-written: the repo folders this run began go
            shutil.rmtree(made, ignore_errors=True)
        reason = "no space left on the device" if e.errno in (errno.ENOSPC, errno.EDQUOT) else e.strerror
        raise PipelineError(f"{e.filename or hf}: {reason} while synthesizing {a.version} ({a.scale}); nothing was "
                            "kept — free space or pass --hf-cache DIR on a larger disk") from None
    if a.form is not None:
        return _synth_form(a, snap, t0)
    if not a.json:
        print(f"wrote a SYNTHETIC {a.version} ({a.scale} scale, seed {a.seed}) to {snap}\n"
              f"  convert it with: python -m pipeline convert --version {a.version} --synthetic {a.scale}"
              f"{f' --hf-cache {a.hf_cache}' if a.hf_cache else ''}{f' --cache {a.cache}' if a.cache else ''}")
    return {"snapshot": str(snap), "synthetic": True, "seconds": round(time.perf_counter() - t0, 3)}


def _synth_form(a: argparse.Namespace, snap: Path, t0: float) -> dict:
    """`synth --form F --out DIR`: the synthetic snapshot rewritten as a fine-tune of that form, into a new folder."""
    out = Path(a.out or f"build/fine-tunes/{a.version}-{a.form}")
    if out.exists() and any(out.iterdir()):
        raise PipelineError(f"{out}: already exists and is not empty; pass --out with a new folder (nothing is "
                            "overwritten)")
    try:
        made = fine_tune_form(snap, a.version, a.form, out, a.seed)
    except ValueError as e:  # a form this version's trainer never writes
        shutil.rmtree(out, ignore_errors=True)
        raise PipelineError(f"synth --form {a.form}: {e}") from None
    except OSError as e:
        shutil.rmtree(out, ignore_errors=True)
        raise PipelineError(f"{e.filename or out}: {e.strerror} while writing the {a.form} form; nothing was kept") from None
    if not a.json:
        print(f"wrote a SYNTHETIC {a.version} fine-tune, {a.form} form, to {made}\n"
              f"  convert it with: python -m pipeline convert --snapshot {made} --embodiments "
              f"{'trained' if a.form in ISAAC_FORMS + ('lerobot',) else 'new_embodiment'}")
    return {"snapshot": str(made), "form": a.form, "synthetic": True, "seconds": round(time.perf_counter() - t0, 3)}


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
                "embodiment_tags": dict(folder.embodiment_ids.value), "embodiment_map": folder.embodiment_ids.source}


def print_inspect(r: dict) -> None:
    print(f"{r['version']}: {r['tensors']} tensors, {_mb(r['total_bytes'])} of data in {len(r['shards'])} shards\n  {r['snapshot']}")
    if r["synthetic"]:
        print(f"  SYNTHETIC: {r['synthetic']}")
    print(f"\n  {'shard':36} {'header B':>10} {'tensors':>8} {'data B':>15} {'file B':>15}")
    for name, s in r["shards"].items():
        print(f"  {name:36} {s['header_bytes']:>10,} {s['tensors']:>8} {s['data_bytes']:>15,} {s['file_size']:>15,}")
    print(f"\n  straddling unit {r['straddling_unit']}:")
    for shard, keys in r["straddle"].items():
        print(f"    {shard}: {', '.join(keys)}")
    print("\n  embodiment tensors (slot = leading dim, used as x @ W[e] + b[e]):")
    for k, shape in r["embodiment_tensors"].items():
        print(f"    {k:48} {shape}")
    print("  tags: " + ", ".join(f"{t}={i}" for t, i in r["embodiment_tags"].items()))


def cmd_inspect(a: argparse.Namespace) -> dict:
    hf = a.hf_cache or (synthetic_hf_cache(a.cache) if a.synthetic else None)
    report = inspect_report(a.version, a.snapshot, hf, a.revision, a.synthetic, a.model)
    if not a.json:
        print_inspect(report)
    return report


def _convert_options(a: argparse.Namespace, device=None):
    return ConvertOptions(a.version, profile=a.profile, embodiments=a.embodiments, scheduler=a.scheduler,
                          snapshot=a.snapshot, hf_cache=a.hf_cache, cache_root=a.cache, force=a.force,
                          progress=not a.json, check_against_cache=a.check_against_cache, device=device,
                          layout=a.layout, revision=a.revision, synthetic=a.synthetic, model=a.model)


@contextlib.contextmanager
def opened_device(choice: str):
    """`none`: host only; `auto`: every device present (a mesh; silicon or a simulator), else host only, saying
    which on stderr; an id: that device or an error. The device is closed on every exit path."""
    if choice == "auto":
        print(f"--device auto: {tt.describe_devices() if tt.device_present() else 'no device: host only'}",
              file=sys.stderr)
    if choice == "none" or (choice == "auto" and not tt.device_present()):
        yield None
        return
    if not tt.device_present():
        raise PipelineError(f"--device {choice}: no Tenstorrent device on this machine (/dev/tenstorrent is absent "
                            f"and {tt.SIMULATOR_ENV} is not set); use --device none or auto")
    if choice != "auto" and not choice.isdigit():
        raise PipelineError(f"--device {choice!r} is not none, auto or a device id (0, 1, ...)")
    try:
        dev = tt.open_device(None if choice == "auto" else int(choice))
    except RuntimeError as e:  # tt-metal's TT_THROW: the first line after "info:" is its reason
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        reason = lines[lines.index("info:") + 1] if "info:" in lines[:-1] else lines[0] if lines else "unknown error"
        raise PipelineError(f"--device {choice}: the Tenstorrent device could not be opened ({reason[:200]}); check "
                            "the driver (tt-smi) or the simulator set-up, or use --device none") from None
    try:
        print(f"--device {choice}: opened {tt.describe_opened(dev)}", file=sys.stderr)
        yield dev
    finally:
        tt.close_device(dev)


def print_convert(s: dict) -> None:
    done = ("checked: the cached entry equals a fresh conversion, " + f"{s['arrays_compared']} arrays compared,"
            if s.get("checked_against_fresh_conversion") else
            "cache hit, nothing converted" if s["cache_hit"] else "converted")
    found = " (found from its keys)" if s.get("version_found") else ""
    print(f"\n{s['version']}{found} ({s['layout']}, {s['profile']}): {done} in {s['seconds']:.2f} s")
    src = s.get("source", {})
    print(f"  source        {src.get('model') or src.get('snapshot')} (revision {src.get('revision') or 'unknown'})")
    if src.get("synthetic"):
        print(f"  SYNTHETIC     {src['synthetic']}")
    if src.get("key_prefix"):
        print(f"  key prefix    {src['key_prefix']!r} stripped from every key")
    for key, twin in (src.get("tied") or {}).items():
        print(f"  tied          {key} read from {twin} (the checkpoint dropped it; tied by {src.get('tied_by')})")
    if src.get("trained_embodiments"):
        print(f"  trained for   {', '.join(src['trained_embodiments'])} ({src.get('trained_from')})")
    if src.get("embodiment_map"):
        print(f"  embodiments   tags mapped by {src['embodiment_map']}: slots {', '.join(map(str, s['slots']))}")
    for note in s.get("notes", []):
        print(f"  note          {note}")
    print(f"  cache entry   {s['cache_path']}")
    print(f"  targets       {s['targets']} (+{len(s['skipped'])} source keys skipped by recipe), slots {len(s['slots'])}")
    if s["cache_hit"]:
        return
    resumed, reused = s.get("resumed_chunks", 0), s.get("reused_chunks", 0)
    extra = ", ".join(x for x in (f"{resumed} chunks resumed from a killed run" if resumed else "",
                                  f"{reused} chunks linked from other entries" if reused else "") if x)
    print(f"  tasks         {s['tasks']}" + (f" ({extra})" if extra else ""))
    print(f"  bytes         read {_mb(s['bytes_read'])}, written {_mb(s['bytes_written'])}")
    print(f"  peak RSS      {_mb(s['peak_rss_bytes'])}")
    print("  stage seconds (summed over tasks): " + ", ".join(
        f"{k} {v:.2f} ({s['stage_tasks'].get(k, 0)})" for k, v in s["stage_seconds"].items()))
    worst = [n for n in s["numerics"][:5] if n["pcc"] < 1.0 or n["max_abs_err"] > 0]
    if not worst:
        print(f"  numerics      all {len(s['numerics'])} chunks ({s['targets']} targets, banks one chunk per slot) "
              "exact against the bf16 source")
        return
    print("  numerics, worst first (device dtype vs bf16 source):")
    for n in worst:
        slot = "" if n["slot"] is None else f"[{n['slot']}]"
        print(f"    {n['name'] + slot:64} pcc {n['pcc']:.6f}  max|err| {n['max_abs_err']:.3g}")


def cmd_convert(a: argparse.Namespace) -> dict:
    with opened_device(a.device) as dev:
        summary = convert(_convert_options(a, dev))
    summary.pop("device_tensors", None)
    if not a.json:
        print_convert(summary)
    else:
        summary = {k: v for k, v in summary.items() if k != "numerics"} | {"numerics_worst": summary.get("numerics", [])[:10]}
    return summary


def cmd_graph(a: argparse.Namespace) -> dict:
    opts = ConvertOptions(a.version, profile=a.profile, embodiments=a.embodiments, snapshot=a.snapshot,
                          hf_cache=a.hf_cache, cache_root=a.cache, layout=a.layout, revision=a.revision,
                          synthetic=a.synthetic, model=a.model)
    result = write_graph(opts, Path(a.out))
    if not a.json:
        extra = f", {result['units']} units, straddling: {', '.join(result['straddling'])}" if "units" in result else ""
        print(f"wrote {result['out']}: {result['tasks']} tasks{extra}")
    return result


def cmd_load(a: argparse.Namespace) -> dict:
    with opened_device(a.device) as dev:
        loaded = load(a.version, a.cache, a.embodiment, into="torch" if dev is None else dev, profile=a.profile,
                      layout=a.layout, entry=a.entry, revision=a.revision, source=a.source,
                      synthetic=True)  # (it prints SYNTHETIC itself)
    result = {"entry": loaded.entry, "layout": loaded.layout, "slot": loaded.slot, "source": loaded.source, **loaded.stats}
    if not a.json:
        if loaded.source.get("synthetic"):
            print(f"SYNTHETIC weights: {loaded.source['synthetic']}")
        print(f"loaded {result['tensors']} tensors ({_mb(result['bytes_read'])}) from {loaded.entry} "
              f"in {result['seconds']:.3f} s")
    return result


def parse_size(text: str) -> int:
    """`20000000`, `500M`, `10G`, `1.5T` (powers of 1000, as `cache ls` prints them)."""
    units = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    t = text.strip().upper().removesuffix("B")
    unit = t[-1] if t and t[-1] in units else ""
    try:
        value = float(t[:len(t) - len(unit)])
    except ValueError:
        raise CacheError(f"size {text!r} is not a number with an optional K, M, G or T suffix (e.g. 10G)") from None
    if value < 0:
        raise CacheError(f"size {text!r} is negative")
    return int(value * units[unit])


def _size(n: float) -> str:
    unit = "B"
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            break
        n /= 1000
    return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"


def _age(seconds: float) -> str:
    for unit, span in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= span:
            return f"{seconds / span:.0f} {unit}"
    return f"{seconds:.0f} s"


def _slots(slots, bank_slots: int) -> str:
    if not slots:
        return "-"
    return f"all {bank_slots}" if slots == list(range(bank_slots)) else ",".join(map(str, slots))


def cmd_cache(a: argparse.Namespace) -> dict:
    """`cache ls|verify|gc|rm`, the same rules for a local folder and an object store."""
    store = cache.cache_store(a.cache)
    root = store.describe("")
    if a.action in ("gc", "rm"):
        if a.action == "rm":
            removed = [cache.remove_entry(store, a.entry, a.include_current, a.dry_run)]
        else:
            removed = cache.collect_garbage(store, a.older_than_days, parse_size(a.max_bytes) if a.max_bytes
                                            else None, a.include_current, a.dry_run)
        if not a.json:
            verb = "would remove" if a.dry_run else "removed"
            print("\n".join(f"{verb} {r['entry']} ({r['reason']}, {_size(r['bytes'])}; "
                            f"{'would free' if a.dry_run else 'freed'} {_size(r['freed_bytes'])})"
                            + (f"; refs {', '.join(r['refs'])} dropped" if r["refs"] and not a.dry_run else "")
                            for r in removed) or "nothing to remove")
        return {"root": root, "removed": removed, "dry_run": bool(a.dry_run)}
    totals: dict = {}
    rows = cache.entry_rows(store, getattr(a, "entry", None), verify=a.action == "verify", totals=totals)
    if not a.json:
        if rows:
            head = f"{'entry':46} {'version':7} {'layout':8} {'profile':7} {'slots':8} {'revision':10} {'source':10} " \
                   f"{'size':>10} {'own':>10} {'age':>7}  state / refs"
            print(head)
            for r in rows:
                src = "synthetic" if r["source"] == "synthetic" else ("snapshot" if r["source"] else "-")
                tail = r["state"] + (f"  <- {', '.join(r['refs'])}" if r["refs"] else "") + \
                    (f"  (trained for {', '.join(r['trained_for'])}" + (f", read from {r['trained_from']}"
                                                                         if r.get("trained_from") else "") + ")"
                     if r.get("trained_for") else "")
                age = _age(r["age_s"]) if r["age_s"] is not None else "-"
                print(f"{r['entry']:46} {r['version'] or '-':7} {r['layout'] or '-':8} {r['profile'] or '-':7} "
                      f"{_slots(r['slots'], r['bank_slots']):8} {(r['revision'] or '-')[:10]:10} {src:10} {_size(r['bytes']):>10} "
                      f"{_size(r['unique_bytes']):>10} {age:>7}  {tail}")
            print(f"{len(rows)} entries, {_size(totals['disk_bytes'])} on disk (shared bytes counted once); "
                  "'own' is what removing the entry frees")
        else:
            print(f"no entries in {store.describe('entries')}")
    if a.action == "verify" and any(r["state"].startswith("CORRUPT") for r in rows):
        raise PipelineError(f"cache {root}: {sum(r['state'].startswith('CORRUPT') for r in rows)} entry(ies) failed verification")
    return {"root": root, "entries": rows}


def _print_targets(tensors: dict, names: tuple[str, ...]) -> None:
    for name in names:
        t = tensors[name]
        if hasattr(t, "padded_shape"):  # a ttnn tensor; host-only targets are torch float32
            print(f"  {name:52} {str(t.dtype):22} {str(t.layout):14} shape {list(t.shape)} padded {list(t.padded_shape)}")
        else:
            print(f"  {name:52} host {t.dtype} {list(t.shape)} (never uploaded, as the port keeps it)")


def cmd_demo(a: argparse.Namespace) -> dict:
    demo_hf = synthetic_hf_cache(a.cache)
    print(f"1. synthesizing a tiny GR00T N1.7 into {demo_hf} (real key names, order, counts and shards; small "
          "dims; marked synthetic, under a repo id of its own)")
    synthesize("n17", demo_hf, "tiny")
    print_inspect(inspect_report("n17", None, demo_hf, synthetic="tiny"))
    print("\n2. converting it into tt-port, n17's default: the conventions of tt-metal's GR00T N1.6 port, family by "
          "family (Dask graph: index -> read/slot -> transform -> convert -> stage -> unit -> publish; verify hashes "
          "each shard alongside and gates its units)")
    opts = ConvertOptions("n17", hf_cache=demo_hf, synthetic="tiny", cache_root=a.cache)
    summary = convert(opts)
    print_convert(summary)
    print("\n3. converting again: the cache entry is reused")
    print_convert(convert(replace(opts, progress=False)))
    loaded = load("n17", a.cache, embodiment="new_embodiment", into="ttnn", synthetic=True)
    print(f"\n4. reloaded {loaded.stats['tensors']} tensors for embodiment new_embodiment (slot {loaded.slot}) "
          f"from the cache in {loaded.stats['seconds']:.3f} s, {_mb(loaded.stats['bytes_read'])} read, as the "
          "ttnn host tensors a device takes:")
    _print_targets(loaded.tensors, ("vision.blocks.0.attn.qkv.weight", "language.layers.0.self_attn.q_proj.weight",
                                    "dit.transformer_blocks.0.attn1.to_q_padded.weight", "action_encoder.W2.W",
                                    "language.embed_tokens.weight"))
    print("\n5. a tiny N1.6 in the tt-n16 layout (n16's default): the tensors tt-metal's GR00T N1.6 port builds")
    synthesize("n16", demo_hf, "tiny")
    port = convert(ConvertOptions("n16", embodiments="gr1", hf_cache=demo_hf, synthetic="tiny",
                                  cache_root=a.cache, progress=False))
    print_convert(port)
    host = load("n16", a.cache, "gr1", into="ttnn", synthetic=True)
    _print_targets(host.tensors, ("vision.encoder.layers.0.self_attn.qkv_padded.weight",
                                  "language.model.layers.0.self_attn.q_proj.weight", "language.model.embed_tokens.weight"))
    return summary


def cmd_port_check(a: argparse.Namespace) -> dict:
    from pipeline import port_n16

    code = port_n16.PortCode.find(a.tt_metal)
    with opened_device(a.device) as dev:
        verdict = port_n16.check_port(code, build_root=cache.build_root(cache.cache_store(a.cache)), device=dev,
                                      force=a.force, log=lambda line: print(line, file=sys.stderr))
    if not a.json:
        where = "on the device" if verdict["on_device"] else "on the host"
        if verdict["ok"]:
            print(f"port revision {verdict['revision']} at {verdict['root']}: OK, the model built from a "
                  f"{verdict['layout']} entry equals the port's own constructor's ({verdict['device_files']} device "
                  f"tensors and every other attribute, {verdict['scale']} scale, {where})")
        else:
            print(f"port revision {verdict['revision']} at {verdict['root']}: DIFFERS from the port's own "
                  f"constructor ({where}):\n  " + "\n  ".join(verdict["differences"]))
    if not verdict["ok"]:
        raise PipelineError(f"port revision {verdict['revision']} at {verdict['root']} does not build the same model "
                            f"from a {verdict['layout']} entry: {verdict['differences'][0]}")
    return verdict


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of days") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} days is negative: pass 0 or more")
    return value


class _Parser(argparse.ArgumentParser):
    """A usage error is one line too (the usage itself is what --help is for)."""

    def error(self, message: str):
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def parser() -> argparse.ArgumentParser:
    """Every command and option (long because it is the table of them, read top to bottom; no logic)."""
    p = _Parser(prog="python -m pipeline", description=__doc__)
    p.add_argument("-V", "--version", action="version", version=f"gr00t-tt-weights {_package_version()}")
    sub = p.add_subparsers(dest="command", required=True)

    def add(name: str, fn, help_: str, version: bool = True, found: bool = False) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_, description=help_[0].upper() + help_[1:] + ".")
        sp.set_defaults(fn=fn)
        if version:  # `found`: may be left out with --snapshot or --model (found from the keys)
            sp.add_argument("--version", required=not found,
                            help=f"one of {', '.join(VERSIONS)}" + ("; with --snapshot or --model it may be left out "
                                                                   "(found from the checkpoint's keys)" if found else ""))
        sp.add_argument("--json", action="store_true", help="print one JSON object instead of text")
        sp.add_argument("--cache", help=f"cache root: a folder, or an s3://bucket/prefix URL (default $GR00T_CACHE, "
                                        f"else {cache.DEFAULT_ROOT})")
        return sp

    def source_args(sp: argparse.ArgumentParser, verb: str) -> None:
        sp.add_argument("--snapshot", type=Path, help="a checkpoint folder (sharded with its index, or *.safetensors "
                                                      "without one: a fine-tune, a trainer's checkpoint-N, a LeRobot "
                                                      "export) or one .safetensors file")
        sp.add_argument("--model", help="a Hugging Face repo id (a fine-tune's own repo), resolved through the HF "
                                        "cache or huggingface_hub; with --revision")
        sp.add_argument("--hf-cache", type=Path, help=f"Hugging Face hub cache (default {default_hf_cache()}; "
                                                      "with --synthetic, hf/ under the cache root)")
        sp.add_argument("--revision", help="the revision to read: of the release (default: the one pinned in "
                                           "configs/<version>.toml) or of --model (default: main)")
        sp.add_argument("--synthetic", choices=SCALES, help=f"{verb} the project's synthetic stand-in of this scale "
                                                            "(made by `synth`), never the real release")

    sp = add("synth", cmd_synth, "write a synthetic checkpoint into an HF-cache-shaped folder")
    sp.add_argument("--scale", choices=SCALES, default="tiny",
                    help="tiny: every key, small dims; attn: real attention shapes, 1-2 layers per stack; full")
    sp.add_argument("--hf-cache", type=Path, help="default: hf/ under the cache root (never your own HF cache)")
    sp.add_argument("--seed", type=int, default=0, help="seed of the synthetic values (default 0); another seed is "
                                                         "another revision")
    sp.add_argument("--form", choices=FORMS, help="also rewrite it as a fine-tune of this form: reshard, mixed (F32 "
                                                  "action head), half (F16 vision tower), single, lerobot; Isaac-GR00T's "
                                                  "checkpoint, output, best, deepspeed and mapped folders")
    sp.add_argument("--out", help="with --form: the new folder (default build/fine-tunes/<version>-<form>)")
    sp = add("inspect", cmd_inspect, "shard framing, straddling unit and embodiment tensors of a snapshot")
    source_args(sp, "inspect")
    for name, fn, help_ in (("convert", cmd_convert, "convert a snapshot into a cache entry"),
                            ("graph", cmd_graph, "render the conversion graph (SVG/PNG/DOT) or write it as JSON")):
        sp = add(name, fn, help_, found=True)
        source_args(sp, name)
        sp.add_argument("--layout", help=LAYOUT_HELP)
        sp.add_argument("--profile", help=PROFILE_HELP)
        sp.add_argument("--embodiments", default="all", help="'all', or tags/slot ids separated by commas; 'trained': "
                                                             "the tags of the fine-tune's experiment_cfg/metadata.json")
        if name == "convert":
            sp.add_argument("--scheduler", default="threads", help="threads | sync | processes | tcp://host:port")
            sp.add_argument("--force", action="store_true", help="convert even if a published entry exists")
            sp.add_argument("--device", default="none", help="none (default) | auto | a device id: upload as staged")
            sp.add_argument("--check-against-cache", action="store_true",
                            help="convert afresh into a scratch entry and compare it byte for byte with the cached one")
        else:
            sp.add_argument("--out", required=True, help="FILE.svg, FILE.png, FILE.dot or FILE.json")
    sp = add("load", cmd_load, "reload converted tensors from the cache and time it")
    sp.add_argument("--layout", help=LAYOUT_HELP)
    sp.add_argument("--profile", help=PROFILE_HELP)
    sp.add_argument("--embodiment", "--embodiments", dest="embodiment",
                    help="one tag or slot id (default: all slots)")
    sp.add_argument("--entry", help="an entry name or fingerprint prefix (default: the last conversion that holds the slot)")
    sp.add_argument("--revision", help="only entries converted from this revision")
    sp.add_argument("--source", type=Path, help="only entries converted from this snapshot folder")
    sp.add_argument("--device", default="none", help="none (default) | auto | a device id")
    sp = sub.add_parser("cache", help="list, verify or clean the cache", description="List, verify or clean the cache.")
    sp.set_defaults(fn=cmd_cache)
    actions = sp.add_subparsers(dest="action", required=True, metavar="{ls,verify,gc,rm}")
    for name, help_ in (("ls", "a table of every entry: version, layout, profile, slots, source, size, what removing "
                               "it frees, age, state and refs"),
                        ("verify", "re-check every checksum of every entry (or of one)"),
                        ("gc", "remove temporaries of dead processes and broken or corrupt entries; then, if asked, "
                               "old ones or the oldest beyond a size (never one a ref points to, unless "
                               "--include-current, nor one a live process is reading)"),
                        ("rm", "remove one entry (one a ref points to, and its refs, only with --include-current)")):
        ap = actions.add_parser(name, help=help_, description=help_)
        ap.add_argument("--json", action="store_true", help="print one JSON object instead of text")
        ap.add_argument("--cache", help=f"cache root: a folder, or an s3://bucket/prefix URL (default $GR00T_CACHE, "
                                        f"else {cache.DEFAULT_ROOT})")
        if name in ("ls", "verify"):
            ap.add_argument("entry", nargs="?", help="only this entry")
        if name == "rm":
            ap.add_argument("entry", help="the entry to remove (see `cache ls`)")
        if name == "gc":
            ap.add_argument("--older-than-days", type=_non_negative, help="also remove published entries older than this")
            ap.add_argument("--max-bytes", help="then remove the oldest entries until the cache fits (e.g. 10G)")
        if name in ("gc", "rm"):
            ap.add_argument("--include-current", action="store_true",
                            help="entries a ref points to (what load opens) may go too, and their refs")
            ap.add_argument("--dry-run", action="store_true", help="say what would be removed; remove nothing")
    sp = add("port-check", cmd_port_check, "build a small synthetic N1.6 with tt-metal's GR00T N1.6 port both ways "
             "(its own constructor, and from a cache entry) and compare them; the verdict is kept per port revision",
             version=False)
    sp.add_argument("--tt-metal", help="the tt-metal checkout holding models/experimental/gr00t_n1_6 "
                                       "(default $TT_METAL_HOME)")
    sp.add_argument("--device", default="none", help="none (default: host) | auto | a device id")
    sp.add_argument("--force", action="store_true", help="check again even if a verdict is kept")
    add("demo", cmd_demo, "synthesize tiny n17, convert it Tenstorrent-ready (tt-port), convert again (cache hit), "
                          "reload; then tiny n16 in the tt-n16 port layout", version=False)
    return p


INTERRUPTED = {  # what Ctrl-C leaves behind, per command
    "convert": "interrupted: nothing was published; the next run of the same command resumes the work kept in the "
               "cache's entries/*.tmp-* folder",
    "synth": "interrupted: the synthetic snapshot may be incomplete; run synth again (it rewrites it)",
    "cache": "interrupted: an entry being removed may be half gone; run `cache gc` to finish the job",
}


def _json_channel():
    """With --json, stdout carries the JSON alone. In a process of its own the CLI points file descriptor 1 at
    stderr until the process ends, so that nothing else reaches it, our lines or a C library's (tt-metal's
    simulator reports at exit); the JSON goes to the real stdout, kept aside."""
    sys.stdout.flush()
    real = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    return real


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        out = _json_channel() if args.json and argv is None else sys.stdout
        with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
            result = args.fn(args)
        if args.json:
            print(json.dumps(result, indent=1, default=str), file=out, flush=True)
    except PipelineError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(INTERRUPTED.get(args.command, "interrupted: nothing was changed"), file=sys.stderr)
        return 130
    except BrokenPipeError:  # `… --json | head`: the reader left; say nothing
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    return 0
