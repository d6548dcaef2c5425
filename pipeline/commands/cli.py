"""`python -m pipeline <command>`: synth, inspect, convert, graph, load, cache, port-check, demo.

The command line only: each command's options (one function per command builds its parser), the call into the
module that does the work, and its output, as text (pipeline/commands/printing.py) or as one JSON object. Every command
exits 0 on success and 2 with one sentence on stderr for a known error (a `PipelineError`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

from pipeline import cache
from pipeline.jobs.options import ConvertOptions
from pipeline.commands.devices import opened_device
from pipeline.inputs.trainer_files import TRAINED_RECORDS
from pipeline.commands.inspection import inspect_report
from pipeline.jobs.load import TRANSFERS, load
from pipeline.commands.printing import mb, print_cache_rows, print_convert, print_inspect, print_removed, retries_text
from pipeline.cache import synthetic_hf_cache
from pipeline.inputs.snapshot import default_hf_cache, hf_cache_folder
from tasks.io.file_blocks import source_path
from pipeline.inputs.synth import FORMS, ISAAC_FORMS, new_fine_tune_form, synthesize_or_nothing
from pipeline.model.versions import SCALES, VERSIONS
from tasks.entries.names import is_whole_number
from tasks.errors import CacheError, ConfigError, PipelineError
from tasks.io.network import STALL_ENV, STALL_SECONDS, backoff_base, stall_seconds
from tasks.device.ttnn_edge import configure_ttnn_env, device_present

LAYOUT_HELP = ("tt-n16 (n16's default: what tt-metal's GR00T N1.6 port builds), tt-port (n15's and n17's default: "
               "that port's conventions, family by family), tt-n16-fused (n16, the port revision that fuses DiT q|k|v) "
               "or generic (the original unpadded layout)")
PROFILE_HELP = "port (the layout's per-family dtypes; tt-n16's and tt-port's default), bf16 (generic's default) or bfp8"


class _PrintVersion(argparse.Action):
    """`--version`: the installed version, looked up only when asked (reading the installed distributions' metadata
    costs every start otherwise)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        import pipeline

        print(f"gr00t-tt-weights {pipeline.__version__}", flush=True)
        parser.exit()


# The converter, the graph and the demo are imported by the commands that run them: they bring Dask (about 0.4 s of
# CPU at every start), which `cache ls`, `load` or `--version` never use.


def cmd_synth(a: argparse.Namespace) -> dict:
    t0 = time.perf_counter()
    hf = Path(a.hf_cache) if a.hf_cache else synthetic_hf_cache(a.cache)
    cache.writable_folder(hf, "HF cache")
    snap = synthesize_or_nothing(a.version, hf, a.scale, a.seed)
    if a.form is not None:
        out = Path(a.out or f"build/fine-tunes/{a.version}-{a.form}")
        made = new_fine_tune_form(snap, a.version, a.form, out, a.seed)
        if not a.json:
            print(f"wrote a SYNTHETIC {a.version} fine-tune, {a.form} form, to {made}\n"
                  f"  convert it with: python -m pipeline convert --snapshot {made} --embodiments "
                  f"{'trained' if a.form in ISAAC_FORMS + ('lerobot',) else 'new_embodiment'}")
        return {"snapshot": str(made), "form": a.form, "synthetic": True, "seconds": round(time.perf_counter() - t0, 3)}
    if not a.json:
        print(f"wrote a SYNTHETIC {a.version} ({a.scale} scale, seed {a.seed}) to {snap}\n"
              f"  convert it with: python -m pipeline convert --version {a.version} --synthetic {a.scale}"
              f"{f' --hf-cache {a.hf_cache}' if a.hf_cache else ''}{f' --cache {a.cache}' if a.cache else ''}")
    return {"snapshot": str(snap), "synthetic": True, "seconds": round(time.perf_counter() - t0, 3)}


def cmd_inspect(a: argparse.Namespace) -> dict:
    hf = a.hf_cache or (synthetic_hf_cache(a.cache) if a.synthetic else None)
    report = inspect_report(a.version, a.snapshot, hf, a.revision, a.synthetic, a.model, a.stall_seconds)
    if not a.json:
        print_inspect(report)
    return report


def _convert_options(a: argparse.Namespace, device=None):
    return ConvertOptions(a.version, profile=a.profile, embodiments=a.embodiments, scheduler=a.scheduler,
                          snapshot=a.snapshot, hf_cache=a.hf_cache, cache_root=a.cache, force=a.force,
                          progress=not a.json, check_against_cache=a.check_against_cache, device=device,
                          layout=a.layout, revision=a.revision, synthetic=a.synthetic, model=a.model,
                          sha256=a.sha256, stall_seconds=a.stall_seconds)


def cmd_convert(a: argparse.Namespace) -> dict:
    from pipeline.jobs.convert import convert

    with opened_device(a.device) as dev:
        summary = convert(_convert_options(a, dev))
    if not a.json:
        print_convert(summary)
    return summary.as_json()


def cmd_graph(a: argparse.Namespace) -> dict:
    from pipeline.commands.render import write_graph

    opts = ConvertOptions(a.version, profile=a.profile, embodiments=a.embodiments, snapshot=a.snapshot,
                          hf_cache=a.hf_cache, cache_root=a.cache, layout=a.layout, revision=a.revision,
                          synthetic=a.synthetic, model=a.model, stall_seconds=a.stall_seconds)
    if a.out == "-" and a.json:
        raise ConfigError("--out - already prints the task list as JSON: leave out --json")
    result = write_graph(opts, Path(a.out), sys.stdout)
    if not a.json and a.out != "-":
        extra = f", {result['units']} units, straddling: {', '.join(result['straddling'])}" if "units" in result else ""
        print(f"wrote {result['out']}: {result['tasks']} tasks{extra}")
        if result.get("picture"):
            print(result["picture"])
    return result


def cmd_load(a: argparse.Namespace) -> dict:
    with opened_device(a.device) as dev:
        loaded = load(a.version, a.cache, a.embodiment, into="torch" if dev is None else dev, profile=a.profile,
                      layout=a.layout, entry=a.entry, revision=a.revision, source=a.source,
                      synthetic=True, transfers=a.transfers, stall_seconds=a.stall_seconds)  # (it prints SYNTHETIC itself)
    result = {"entry": loaded.entry, "layout": loaded.layout, "slot": loaded.slot, "source": loaded.source,
              "processor": processor_of(loaded), **loaded.stats}
    if not a.json:
        if loaded.source.get("synthetic"):
            print(f"SYNTHETIC weights: {loaded.source['synthetic']}")
        fetched = (f"; fetched {mb(result['bytes_fetched'])}, {mb(result['bytes_kept_here'])} kept here by an "
                   "earlier load" if "bytes_fetched" in result else "")
        retried = retries_text(result.get("store_retries"))
        if result.get("bytes_not_kept"):
            retried = "; ".join(filter(None, (retried, f"{mb(result['bytes_not_kept'])} could not be kept here for "
                                                        f"the next load ({result['not_kept_because']})")))
        print(f"loaded {result['tensors']} tensors ({mb(result['bytes_read'])}{fetched}) from {loaded.entry} "
              f"in {result['seconds']:.3f} s" + (f"; {retried}" if retried else ""))
        said = result["processor"]
        print(f"processor: {said['trainer']}'s for {said['embodiment']} (slot {said['embodiment_id']}): state "
              f"{_groups(said['state'])}; actions {_groups(said['action'])} over {said['action_horizon']} steps"
              if "trainer" in said else f"processor: {said['none']}")
    return result


def processor_of(loaded) -> dict:
    """What `load` says of the processor the entry keeps for the embodiment loaded (or why there is none)."""
    from pipeline.model.processor import ProcessorError

    try:
        return loaded.processor.describe()
    except ProcessorError as e:
        return {"none": str(e)}


def _groups(dims: dict) -> str:
    return ", ".join(f"{name} {width}" for name, width in dims.items())


def parse_size(text: str) -> int:
    """`20000000`, `500M`, `10G`, `1.5T`, `10GB` (powers of 1000, as `cache ls` prints them; `10GiB` is 1024's),
    read by dask's own `parse_bytes`."""
    from dask.utils import parse_bytes

    try:
        value = parse_bytes(text) if text.strip() else None
    except ValueError:
        value = None
    if value is None:
        raise CacheError(f"size {text!r} is not a number with an optional K, M, G or T suffix (e.g. 10G)")
    if value < 0:
        raise CacheError(f"size {text!r} is negative")
    return value


def cmd_cache(a: argparse.Namespace) -> dict:
    """`cache ls|verify|gc|rm`, the same rules for a local folder and an object store."""
    store = cache.cache_store(a.cache, a.stall_seconds)
    root = store.describe("")
    if a.action in ("gc", "rm"):
        if a.action == "rm":
            removed = [cache.remove_entry(store, a.entry, a.include_current, a.dry_run, a.grace_hours)]
        else:
            removed = cache.collect_garbage(store, a.older_than_days, parse_size(a.max_bytes) if a.max_bytes
                                            else None, a.include_current, a.dry_run, a.grace_hours)
        if not a.json:
            print_removed(removed, a.dry_run)
        return {"root": root, "removed": removed, "dry_run": bool(a.dry_run)}
    totals: dict = {}
    rows = cache.entry_rows(store, getattr(a, "entry", None), verify=a.action == "verify", totals=totals)
    if not a.json:
        print_cache_rows(rows, totals, store.describe("entries"), sources=a.action == "verify")
    if a.action == "verify":
        corrupt = sum(r["state"].startswith("CORRUPT") for r in rows)
        broken = sum(r["state"].startswith("broken") for r in rows)  # no valid manifest
        if corrupt or broken:
            raise PipelineError(f"cache {root}: {corrupt + broken} entry(ies) failed verification"
                                + (f" ({broken} with no valid manifest: `cache gc` removes those)" if broken else ""))
    return {"root": root, "entries": rows}


def cmd_demo(a: argparse.Namespace) -> dict:
    from pipeline.commands.demo import run_demo

    return run_demo(a.cache)


def cmd_port_check(a: argparse.Namespace) -> dict:
    from pipeline import port_n16

    code = port_n16.PortCode.find(a.tt_metal)
    with opened_device(a.device) as dev:
        verdict = port_n16.check_port(code, build_root=cache.build_root(cache.cache_store(a.cache, a.stall_seconds)), device=dev,
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


def _checkpoint_place(text: str):
    """--snapshot: a folder, a file, or a URL (`s3://bucket/prefix`); a URL naming no bucket is said so."""
    try:
        return source_path(text)
    except PipelineError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _hf_cache_place(text: str) -> Path:
    """--hf-cache: a folder (a URL is said so)."""
    try:
        return hf_cache_folder(text)
    except PipelineError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} seconds: pass a number of seconds above 0")
    return value


def _positive(text: str) -> int:
    if not is_whole_number(text) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of 1 or more")
    return int(text)


class _Parser(argparse.ArgumentParser):
    """A usage error is one line too (the usage itself is what --help is for)."""

    def error(self, message: str):
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def parser() -> argparse.ArgumentParser:
    """Every command and its options: one function per command below."""
    p = _Parser(prog="python -m pipeline", description="GR00T checkpoints into Tenstorrent device-ready weights: "
                "synth, inspect, convert, graph, load, cache, port-check, demo. Every command exits 0 on success and "
                "2 with one sentence on stderr for a known error.")
    p.add_argument("-V", "--version", action=_PrintVersion, help="print the installed version and exit")
    sub = p.add_subparsers(dest="command", required=True)
    for add in (_synth_parser, _inspect_parser, _convert_parser, _graph_parser, _load_parser, _cache_parser,
                _port_check_parser, _demo_parser):
        add(sub)
    return p


def _command(sub, name: str, fn, help_: str, version: bool = True, found: bool = False) -> argparse.ArgumentParser:
    """A command with the options every command has: --json, --cache and (unless `version` is False) --version,
    which `found` lets be left out with --snapshot or --model (found from the keys)."""
    sp = sub.add_parser(name, help=help_, description=help_[0].upper() + help_[1:] + ".")
    sp.set_defaults(fn=fn)
    if version:
        sp.add_argument("--version", required=not found,
                        help=f"one of {', '.join(VERSIONS)}" + ("; with --snapshot or --model it may be left out "
                                                               "(found from the checkpoint's keys)" if found else ""))
    _output_args(sp)
    return sp


def _output_args(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    sp.add_argument("--cache", help=f"cache root: a folder, or an s3://bucket/prefix URL (default $GR00T_CACHE, "
                                    f"else {cache.DEFAULT_ROOT})")
    sp.add_argument("--stall-seconds", type=_positive_seconds,
                    help="an object-store request that moves no byte for this long is abandoned and tried again "
                         f"(default ${STALL_ENV}, else {STALL_SECONDS:g}); a cluster's workers take the client's")


def _source_args(sp: argparse.ArgumentParser, verb: str) -> None:
    sp.add_argument("--snapshot", type=_checkpoint_place, help="a checkpoint folder (sharded with its index, or *.safetensors "
                                                  "without one: a fine-tune, a trainer's checkpoint-N, a LeRobot "
                                                  "export) or one .safetensors file; or the same in an object store "
                                                  "(s3://bucket/prefix)")
    sp.add_argument("--model", help="a Hugging Face repo id (a fine-tune's own repo), resolved through the HF "
                                    "cache or huggingface_hub; with --revision")
    sp.add_argument("--hf-cache", type=_hf_cache_place, help=f"Hugging Face hub cache (default {default_hf_cache()}; "
                                                  "with --synthetic, hf/ under the cache root)")
    sp.add_argument("--revision", help="the revision to read: of the release (default: the one pinned in "
                                       "configs/<version>.toml) or of --model (default: main)")
    sp.add_argument("--synthetic", choices=SCALES, help=f"{verb} the project's synthetic stand-in of this scale "
                                                        "(made by `synth`), never the real release")


def _target_args(sp: argparse.ArgumentParser) -> None:
    """What a conversion makes: the layout, the profile and the embodiment slots."""
    sp.add_argument("--layout", help=LAYOUT_HELP)
    sp.add_argument("--profile", help=PROFILE_HELP)
    sp.add_argument("--embodiments", default="all", help="'all', or tags/slot ids separated by commas, tags read with "
                    "the trainer's own map; 'trained': the tags the fine-tune's trainer recorded, from the first of "
                    f"{', '.join(TRAINED_RECORDS)} found in its folder, then in the run folder above a checkpoint-N/")


def _synth_parser(sub) -> None:
    sp = _command(sub, "synth", cmd_synth, "write a synthetic checkpoint into an HF-cache-shaped folder")
    sp.add_argument("--scale", choices=SCALES, default="tiny",
                    help="tiny: every key, small dims; attn: real attention shapes, 1-2 layers per stack; full")
    sp.add_argument("--hf-cache", type=_hf_cache_place, help="default: hf/ under the cache root (never your own HF cache)")
    sp.add_argument("--seed", type=int, default=0, help="seed of the synthetic values (default 0); another seed is "
                                                         "another revision")
    sp.add_argument("--form", choices=FORMS, help="also rewrite it as a fine-tune of this form: reshard, mixed (F32 "
                                                  "action head), half (F16 vision tower), single, lerobot; Isaac-GR00T's "
                                                  "checkpoint, output, best, deepspeed and mapped folders")
    sp.add_argument("--out", help="with --form: the new folder (default build/fine-tunes/<version>-<form>)")


def _inspect_parser(sub) -> None:
    sp = _command(sub, "inspect", cmd_inspect, "shard framing, straddling unit and embodiment tensors of a snapshot, "
                  "and the embodiments a fine-tune was trained for", found=True)
    _source_args(sp, "inspect")


def _convert_parser(sub) -> None:
    sp = _command(sub, "convert", cmd_convert, "convert a snapshot into a cache entry", found=True)
    _source_args(sp, "convert")
    _target_args(sp)
    sp.add_argument("--scheduler", default="threads", help="threads | sync | processes | a running cluster's "
                    "tls://host:port (certificates from dask's configuration) or tcp://host:port")
    sp.add_argument("--force", action="store_true", help="convert even if a published entry exists")
    sp.add_argument("--device", default="none", help="none (default) | auto | a device id: upload as staged")
    sp.add_argument("--check-against-cache", action="store_true",
                    help="convert afresh into a scratch entry and compare it byte for byte with the cached one")
    sp.add_argument("--sha256", action="store_true",
                    help="record every shard's sha256 in the entry (provenance: `sha256sum` of the file matches it); "
                         "an HF snapshot's shards are always checked against the sha256 their blobs are named by, a "
                         "plain folder's against its content identity (its tensors' xxh3-128)")


def _graph_parser(sub) -> None:
    sp = _command(sub, "graph", cmd_graph, "render the conversion graph (SVG/PNG/DOT) or write it as JSON", found=True)
    _source_args(sp, "graph")
    _target_args(sp)
    sp.add_argument("--out", required=True, help="FILE.svg, FILE.png, FILE.dot or FILE.json; '-': the task list as "
                                                 "JSON on stdout")


def _load_parser(sub) -> None:
    sp = _command(sub, "load", cmd_load, "reload converted tensors from the cache and time it")
    sp.add_argument("--layout", help=LAYOUT_HELP)
    sp.add_argument("--profile", help=PROFILE_HELP)
    sp.add_argument("--embodiment", "--embodiments", dest="embodiment",
                    help="one tag or slot id (default: all slots)")
    sp.add_argument("--entry", help="an entry name or fingerprint prefix (default: the last conversion that holds the slot)")
    sp.add_argument("--revision", help="only entries converted from this revision")
    sp.add_argument("--source", type=Path, help="only entries converted from this snapshot folder")
    sp.add_argument("--device", default="none", help="none (default) | auto | a device id")
    sp.add_argument("--transfers", type=_positive, default=TRANSFERS,
                    help=f"chunks fetched at once from an object-store cache (default {TRANSFERS})")


CACHE_ACTIONS = {
    "ls": "a table of every entry: version, layout, profile, slots, source, size, what removing it frees, age, state "
          "and refs",
    "verify": "re-check every checksum of every entry (or of one)",
    "gc": "remove temporaries of dead processes and broken or corrupt entries; then, if asked, old ones or the oldest "
          "beyond a size (never one a ref points to, unless --include-current, nor one a live process is reading)",
    "rm": "remove one entry (one a ref points to, and its refs, only with --include-current)",
}


def _cache_parser(sub) -> None:
    sp = sub.add_parser("cache", help="list, verify or clean the cache", description="List, verify or clean the cache.")
    sp.set_defaults(fn=cmd_cache)
    actions = sp.add_subparsers(dest="action", required=True, metavar="{ls,verify,gc,rm}")
    for name, help_ in CACHE_ACTIONS.items():
        ap = actions.add_parser(name, help=help_, description=help_)
        _output_args(ap)
        if name in ("ls", "verify"):
            ap.add_argument("entry", nargs="?", help="only this entry")
        if name == "rm":
            ap.add_argument("entry", help="the entry to remove (see `cache ls`)")
        if name == "gc":
            ap.add_argument("--older-than-days", type=_non_negative, help="also remove published entries older than this")
            ap.add_argument("--max-bytes", help="then remove the oldest entries until the cache fits (e.g. 10G)")
        if name in ("gc", "rm"):
            ap.add_argument("--grace-hours", type=_non_negative, default=cache.GRACE_HOURS,
                            help="in an object store, an object no manifest names (or an entry without a manifest: a "
                                 "push) is removed only once it was written this long ago: a younger one may belong "
                                 f"to a convert in flight (default {cache.GRACE_HOURS:g})")
            ap.add_argument("--include-current", action="store_true",
                            help="entries a ref points to (what load opens) may go too, and their refs")
            ap.add_argument("--dry-run", action="store_true", help="say what would be removed; remove nothing")


def _port_check_parser(sub) -> None:
    sp = _command(sub, "port-check", cmd_port_check, "build a small synthetic N1.6 with tt-metal's GR00T N1.6 port "
                  "both ways (its own constructor, and from a cache entry) and compare them; the verdict is kept per "
                  "port revision", version=False)
    sp.add_argument("--tt-metal", help="the tt-metal checkout holding models/experimental/gr00t_n1_6 "
                                       "(default $TT_METAL_HOME)")
    sp.add_argument("--device", default="none", help="none (default: host) | auto | a device id")
    sp.add_argument("--force", action="store_true", help="check again even if a verdict is kept")


def _demo_parser(sub) -> None:
    _command(sub, "demo", cmd_demo, "synthesize tiny n17, convert it Tenstorrent-ready (tt-port), convert again (cache "
             "hit), reload; then tiny n16 in the tt-n16 port layout", version=False)


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


def _raised_by_interrupt(error: BaseException) -> bool:
    """Whether `error` was raised while a Ctrl-C was being handled: Dask's synchronous executor, interrupted inside
    `Future.set_result`, sets the exception on the finished future and raises InvalidStateError from the
    KeyboardInterrupt."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


def _reader_left(*streams) -> int:
    """`… | head`: the reader closed the pipe. Say nothing (exit 141, as a shell's SIGPIPE), and point the streams
    at /dev/null so that flushing them at exit cannot raise again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in streams:
        with contextlib.suppress(OSError, ValueError):
            os.dup2(devnull, stream.fileno())
    return 141


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    # ttnn reads its logging settings at import, wherever that happens: quiet from the start (its own settings)
    configure_ttnn_env(os.environ, device_present())
    out = sys.stdout
    try:
        out = _json_channel() if args.json and argv is None else sys.stdout
        with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
            stall_seconds(), backoff_base()  # a malformed setting is refused before anything is read or written
            result = args.fn(args)
        if args.json:
            print(json.dumps(result, indent=1, default=str), file=out, flush=True)
    except BrokenPipeError:  # before `except Exception`, which would take it
        return _reader_left(out, sys.stdout)
    except PipelineError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(INTERRUPTED.get(args.command, "interrupted: nothing was changed"), file=sys.stderr)
        return 130
    except Exception as e:
        if not _raised_by_interrupt(e):
            raise
        print(INTERRUPTED.get(args.command, "interrupted: nothing was changed"), file=sys.stderr)
        return 130
    return 0
