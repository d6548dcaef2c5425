"""Commands behave as documented, end to end: gc over real conversions, ls, load, --force, --json, packaging, bench
options. (The policies behind gc, rm and load have contract suites: test_housekeeping.py, test_leases.py,
test_selection.py; Ctrl-C is in test_trust.py.)"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from pipeline import cache as cache_mod
from pipeline.cache import entries_dir
from pipeline.jobs.convert import ConvertOptions, convert
from pipeline.jobs.load import load
from tasks.device.ttnn_edge import QUIET_ENV
from tests.conftest import run_cli

from tests.conftest import ROOT


def test_gc_by_size_and_age_never_removes_what_a_ref_points_to(two_entries):
    root, old, current = two_entries
    proc = run_cli("cache", "gc", "--older-than-days", "20", "--cache", str(root), "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["removed"] == []  # neither is that old
    proc = run_cli("cache", "gc", "--max-bytes", "1", "--dry-run", "--cache", str(root), "--json")
    assert proc.returncode == 0 and [r["entry"] for r in json.loads(proc.stdout)["removed"]] == [old]
    assert (entries_dir(root) / old).is_dir()  # a dry run removes nothing
    proc = run_cli("cache", "gc", "--older-than-days", "0", "--cache", str(root))
    assert proc.returncode == 0 and f"removed {old} (older than 0 days" in proc.stdout
    assert sorted(p.name for p in entries_dir(root).iterdir()) == [current]
    assert load("n17", root, 0).tensors  # the current entry still loads
    proc = run_cli("cache", "gc", "--max-bytes", "10G", "--include-current", "--cache", str(root), "--json")
    assert json.loads(proc.stdout)["removed"] == []  # 10G is a size, and the cache fits
    proc = run_cli("cache", "gc", "--max-bytes", "0", "--include-current", "--cache", str(root))
    assert f"removed {current}" in proc.stdout and not list(entries_dir(root).iterdir())
    assert not list((root / "refs").iterdir())  # its ref went with it


def test_cache_ls_is_a_table_with_layout_slots_source_and_refs(two_entries):
    root, old, current = two_entries
    proc = run_cli("cache", "ls", "--cache", str(root))
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:8] == ["entry", "version", "layout", "profile", "slots", "revision", "source", "size"]
    row = next(line for line in lines if line.startswith(current))
    assert " tt-port " in row and " synthetic " in row and row.endswith("<- n17-tt-port-port.synthetic")
    assert lines[-1].startswith("2 entries, ")
    rows = json.loads(run_cli("cache", "ls", "--cache", str(root), "--json").stdout)["entries"]
    assert {r["entry"]: r["refs"] for r in rows} == {old: [], current: ["n17-tt-port-port.synthetic"]}
    assert {r["entry"]: (r["slots"], r["bank_slots"]) for r in rows} == {old: ([10], 32), current: ([0], 32)}


def test_force_with_a_bad_scheduler_leaves_the_published_entry_alone(two_entries, hf_cache):
    root, _, current = two_entries
    proc = run_cli("convert", "--version", "n17", "--embodiments", "0", "--synthetic", "micro", "--hf-cache", str(hf_cache),
                "--cache", str(root), "--force", "--scheduler", "dask")
    assert proc.returncode == 2 and "unknown scheduler 'dask'" in proc.stderr
    assert load("n17", root, 0).entry == current
    again = convert(ConvertOptions("n17", embodiments="0", hf_cache=hf_cache, synthetic="micro", cache_root=root,
                                   force=True, progress=False))
    assert Path(again["cache_path"]).name == current and not again["cache_hit"]
    assert not [p for p in entries_dir(root).iterdir() if ".tmp-" in p.name]  # the replaced one is gone
    assert cache_mod.entry_at(entries_dir(root) / current).verify() == []


def test_json_output_is_only_json_and_a_closed_pipe_is_quiet(hf_cache, tmp_path):
    # as a user's shell starts it: without the logging settings this session has (ttnn's start-up DEBUG line)
    user_env = {k: v for k, v in os.environ.items() if k not in QUIET_ENV}
    proc = run_cli("demo", "--json", "--cache", str(tmp_path / "demo-cache"), env=user_env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "DEBUG" not in proc.stdout + proc.stderr  # the demo speaks only its own lines
    assert json.loads(proc.stdout)["cache_path"].startswith(str(tmp_path / "demo-cache"))  # --cache is honoured
    assert "synthesizing a tiny GR00T N1.7" in proc.stderr
    shown = [line.split()[0] for line in proc.stderr.split("\n4. ", 1)[1].split("\n5. ")[0].splitlines()[1:] if line]
    assert {"action_encoder.W1.W", "language.layers.0.mlp.down_proj.weight", "vision.blocks.0.attn.proj.weight"} <= \
        set(shown) and shown[-1] == "language.embed_tokens.weight"  # a matmul of each part; the host table last
    shell = subprocess.run(f"{sys.executable} -m pipeline convert --version n17 --synthetic micro --hf-cache {hf_cache} "
                           f"--cache {tmp_path / 'c'} --json | head -c 1", shell=True, cwd=ROOT, capture_output=True,
                           text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert shell.stdout == "{" and "Traceback" not in shell.stderr and "BrokenPipe" not in shell.stderr


def test_graph_without_graphviz_writes_dot_and_says_what_to_install(hf_cache, tmp_path):
    """No `dot` on PATH (nothing installs system packages): the picture asked for is DOT text, and one line says
    what gives the picture."""
    proc = run_cli("graph", "--version", "n17", "--synthetic", "micro", "--hf-cache", str(hf_cache), "--out",
                   str(tmp_path / "g.svg"), env={**os.environ, "PATH": str(tmp_path / "no-programs")})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "g.dot").read_text().startswith("digraph") and not (tmp_path / "g.svg").exists()
    assert "install Graphviz" in proc.stdout and f"dot -Tsvg {tmp_path / 'g.dot'}" in proc.stdout


def test_a_reader_that_leaves_early_gets_silence_and_141(hf_cache):
    """An output far past the pipe's 64 KiB buffer (the graph's task list: ~850 KB), piped into `head -c 1`: the
    write fails with BrokenPipeError mid-output; the CLI says nothing and exits 141, as a shell's SIGPIPE."""
    shell = subprocess.run(f"{sys.executable} -m pipeline graph --version n17 --synthetic tiny --hf-cache {hf_cache} "
                           "--out - | head -c 1; echo \" ${PIPESTATUS[0]}\"", shell=True, executable="/bin/bash", cwd=ROOT,
                           capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert shell.stdout == "{ 141\n" and shell.stderr == "", shell.stderr[-2000:]
    whole = run_cli("graph", "--version", "n17", "--synthetic", "tiny", "--hf-cache", str(hf_cache), "--out", "-")
    assert len(whole.stdout) > 64 << 10 and json.loads(whole.stdout)


def test_check_against_cache_needs_an_entry_and_says_what_it_did(hf_cache, tmp_path):
    args = ("convert", "--version", "n17", "--embodiments", "10", "--synthetic", "micro", "--hf-cache", str(hf_cache),
            "--cache", str(tmp_path))
    proc = run_cli(*args, "--check-against-cache")
    assert proc.returncode == 2 and "nothing is cached for this conversion" in proc.stderr
    assert run_cli(*args).returncode == 0
    proc = run_cli(*args, "--check-against-cache")
    assert proc.returncode == 0 and "checked: the cached entry equals a fresh conversion" in proc.stdout


def test_convert_json_and_the_text_report_print_one_record(hf_cache, tmp_path):
    from dataclasses import fields

    from pipeline.commands.printing import mb
    from pipeline.jobs.summary import ConvertSummary

    args = ("convert", "--version", "n17", "--embodiments", "10", "--synthetic", "micro", "--hf-cache", str(hf_cache))
    text = run_cli(*args, "--cache", str(tmp_path / "a")).stdout
    built = json.loads(run_cli(*args, "--cache", str(tmp_path / "b"), "--json").stdout)
    record = {f.name for f in fields(ConvertSummary)}
    assert set(built) - record == {"numerics_worst"} and not {"numerics", "device_tensors"} & set(built)
    assert built["cache_hit"] is False and built["tasks"] > 0 and built["reused_chunks"] == 0
    assert f"read {mb(built['bytes_read'])}, written {mb(built['bytes_written'])}" in text  # the same build, twice
    hit = json.loads(run_cli(*args, "--cache", str(tmp_path / "b"), "--json").stdout)
    assert hit["cache_hit"] and hit["cache_path"] == built["cache_path"] and hit["fingerprint"] == built["fingerprint"]
    assert not {"stage_seconds", "reused_chunks", "published_here", "pushed_bytes"} & set(hit)  # a build's only


def test_commands_that_convert_nothing_start_without_dask(tmp_path):
    """`cache ls`, `load` and `synth` never import Dask or distributed (about 0.4 s of CPU at every start)."""
    commands = [["cache", "ls", "--cache", str(tmp_path), "--json"],
                ["load", "--version", "n17", "--embodiment", "10", "--cache", str(tmp_path), "--json"],
                ["synth", "--version", "n16", "--scale", "micro", "--hf-cache", str(tmp_path / "hf"), "--json"]]
    probe = (f"import sys\nfrom pipeline.commands.cli import main\nfor argv in {commands!r}:\n    main(argv)\n"
             "print(sorted(m for m in ('dask', 'distributed') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout[-500:]


def test_version_flag_and_a_wheel_that_works_from_any_directory(tmp_path):
    proc = run_cli("--version")  # what pip recorded, read only when asked
    assert proc.returncode == 0 and proc.stdout == f"gr00t-tt-weights {importlib.metadata.version('gr00t-tt-weights')}\n"
    src = tmp_path / "src"  # build from a copy: setuptools leaves build/ behind
    for part in ("pipeline", "tasks", "configs"):
        shutil.copytree(ROOT / part, src / part, ignore=shutil.ignore_patterns("__pycache__"))
    for part in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / part, src / part)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
                            str(tmp_path / "dist"), str(src)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-2000:]
    assert "absent from the `packages` configuration" not in build.stdout + build.stderr  # (make demo printed it)
    wheel = next((tmp_path / "dist").glob("*.whl"))
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        entry_points = z.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "gr00t_tt_configs/n16.toml" in names and "gr00t_tt_configs/tt/wormhole_N150.yaml" in names
    tree = {path.relative_to(ROOT).as_posix() for room in ("pipeline", "tasks") for path in (ROOT / room).rglob("*.py")}
    missing = tree - set(names)  # every module of every room: a package left out of pyproject.toml is missing whole
    assert not missing and "tasks/numerics/kernels.c" in names, sorted(missing)
    assert "gr00t-tt = pipeline.__main__:run" in entry_points
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, capture_output=True)
    probe = subprocess.run([sys.executable, "-c", "from pipeline.model.versions import VERSIONS; from tasks.config_files import CONFIG_DIR; "
                            "from tasks.device.ttnn_edge import MOCK_DESCRIPTOR; print(VERSIONS, CONFIG_DIR, MOCK_DESCRIPTOR.is_file())"],
                           cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(site)})
    assert probe.stdout.startswith("('n15', 'n16', 'n17')") and str(site) in probe.stdout, probe.stderr[-1500:]
    assert probe.stdout.strip().endswith("True")
    # its default cache is the user's cache folder, never site-packages, and --help says which
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k not in ("GR00T_CACHE", "XDG_CACHE_HOME")}
    env.update(PYTHONPATH=str(site), HOME=str(home))
    synth = subprocess.run([sys.executable, "-m", "pipeline", "synth", "--version", "n16", "--json"], cwd=tmp_path,
                           capture_output=True, text=True, env=env)
    assert synth.returncode == 0, synth.stderr[-1500:]
    assert json.loads(synth.stdout)["snapshot"].startswith(str(home / ".cache" / "gr00t-tt" / "hf"))
    assert not (site / "cache").exists()
    helped = subprocess.run([sys.executable, "-m", "pipeline", "synth", "--help"], cwd=tmp_path, capture_output=True,
                            text=True, env={**env, "COLUMNS": "300"})  # (argparse breaks a long path across lines)
    assert f"else {home / '.cache' / 'gr00t-tt'}" in " ".join(helped.stdout.split())


def test_load_finds_the_entry_holding_the_slot_and_takes_an_entry_or_revision(two_entries):
    from tasks.errors import CacheError, ConfigError

    root, old, current = two_entries  # old holds slot 10, current (the ref) slot 0
    assert load("n17", root, "new_embodiment").entry == old  # slot 10: not in the last conversion, but cached
    assert load("n17", root, 0).entry == current
    fingerprint = json.loads((entries_dir(root) / old / "MANIFEST.json").read_text())["fingerprint"]
    assert load("n17", root, 10, entry=fingerprint[:12]).entry == old
    with pytest.raises(CacheError, match="slot 0 was not converted into this entry"):
        load("n17", root, 0, entry=old)
    with pytest.raises(CacheError, match="no entry matches 'nothere'"):
        load("n17", root, 0, entry="nothere")
    with pytest.raises(CacheError, match="no published n17 \\(tt-port, port\\) entry holds slot 0 and revision 0000"):
        load("n17", root, 0, revision="0" * 40)
    with pytest.raises(CacheError, match="holds every slot"):
        load("n17", root, "all")  # never slot 0 in disguise
    with pytest.raises(ConfigError, match="load takes one embodiment"):
        load("n17", root, "10,0")
    with pytest.raises(ConfigError, match=r"load\(into='numpy'\): expected one of torch, ttnn, or an open device"):
        load("n17", root, 0, into="numpy")
    with pytest.raises(CacheError, match="device tensors hold one embodiment slot"):
        load("n17", root, "all", into="ttnn", entry=old)
    proc = run_cli("load", "--version", "n17", "--embodiment", "10", "--entry", old, "--cache", str(root), "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["entry"] == old


def test_load_by_source_snapshot_and_an_unknown_profile_is_one_line(two_entries, micro_snapshots):
    root, old, current = two_entries
    assert load("n17", root, 10, source=micro_snapshots["n17"]).entry == old
    from tasks.errors import CacheError

    with pytest.raises(CacheError, match="source /nowhere"):
        load("n17", root, 10, source="/nowhere")
    proc = run_cli("load", "--version", "n17", "--profile", "fp32", "--cache", str(root))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "unknown profile 'fp32' for layout tt-port: expected one of port, bf16, bfp8" in proc.stderr
    assert "PROFILE=fp32" not in proc.stderr


def test_progress_off_a_terminal_is_periodic_lines_on_stderr(capsys):
    import dask

    from pipeline.jobs.run import LogProgress

    graph = {("a", i): (time.sleep, 0.01) for i in range(5)}
    with LogProgress(every=0.0):
        dask.get(graph, list(graph))
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("progress: 1/5 tasks (20 %)") and err[-1].startswith("progress: 5/5 tasks done in ")


def test_graph_with_an_unknown_suffix_and_a_bad_scheduler_on_a_cache_hit_are_one_line_errors(hf_cache, tmp_path):
    proc = run_cli("graph", "--version", "n17", "--synthetic", "tiny", "--hf-cache", str(hf_cache), "--out", str(tmp_path / "x.txt"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--out must end in .svg, .png" in proc.stderr
    args = ("convert", "--version", "n17", "--embodiments", "10", "--synthetic", "micro", "--hf-cache", str(hf_cache),
            "--cache", str(tmp_path))
    assert run_cli(*args).returncode == 0
    proc = run_cli(*args, "--scheduler", "dask")  # a cache hit still refuses what it could not run
    assert proc.returncode == 2 and "unknown scheduler 'dask'" in proc.stderr


def test_synth_says_what_it_wrote_and_convert_counts_targets_and_chunks_apart(tmp_path, hf_cache):
    proc = run_cli("synth", "--version", "n17", "--cache", str(tmp_path / "c"))
    assert proc.returncode == 0 and proc.stdout.startswith("wrote a SYNTHETIC n17 (tiny scale, seed 0) to ")
    assert str(tmp_path / "c" / "hf") in proc.stdout  # under the cache root, never the user's HF cache
    proc = run_cli("convert", "--version", "n17", "--synthetic", "tiny", "--profile", "bf16", "--cache", str(tmp_path / "c"))
    assert proc.returncode == 0, proc.stderr  # (bf16: every value exact, so the numerics line is one count)
    assert "chunks resumed" not in proc.stdout  # said only when something was resumed
    assert "all 1464 chunks (1030 targets, banks one chunk per slot)" in proc.stdout  # 1030 - 14 + 14 * 32


def test_the_processes_scheduler_prints_its_dashboard_on_stderr(hf_cache, tmp_path):
    proc = run_cli("convert", "--version", "n17", "--embodiments", "10", "--synthetic", "micro", "--hf-cache", str(hf_cache),
                "--cache", str(tmp_path), "--scheduler", "processes")
    assert proc.returncode == 0, proc.stderr[-1500:]
    assert "dask dashboard: http://" in proc.stderr and "converted in" in proc.stdout  # (--json runs without one)


def test_the_bench_plain_loop_makes_the_graphs_entry(snapshots, tmp_path):
    """The Dask-overhead baseline runs the product's own graph without a Dask scheduler: from an F32/BF16 fine-tune
    (reads that round, as the graph's do), its entry holds the graph's chunks, byte for byte."""
    from bench.children import CHILDREN
    from pipeline.cache import entry_at
    from pipeline.inputs.synth import fine_tune_form

    snapshot = fine_tune_form(snapshots["n16"], "n16", "mixed", tmp_path / "mixed")
    looped = CHILDREN["plain_loop"]({"version": "n16", "snapshot": str(snapshot), "cache": str(tmp_path / "loop")})
    done = convert(ConvertOptions("n16", snapshot=snapshot, layout="generic", cache_root=tmp_path / "graph",
                                  progress=False))
    loop = entry_at(Path(looped["cache_path"])).manifest
    graph = entry_at(Path(done["cache_path"])).manifest
    assert loop.fingerprint == graph.fingerprint and len(graph.arrays) > 100
    assert loop.arrays == graph.arrays  # every chunk's size and xxh3, every array's content id


def test_a_bench_smoke_run_never_writes_over_the_committed_results():
    from bench.report import _out
    from bench.harness import BENCH, DATA

    assert _out("full") == BENCH and _out("tiny") == DATA / "results-tiny"


def test_bench_cold_is_refused_where_the_page_cache_cannot_be_dropped(tmp_path, monkeypatch, capsys):
    """A warm run must never be reported as cold: where drop_caches cannot be written, --cold is one sentence."""
    import bench.__main__ as bench_main
    from bench import harness

    monkeypatch.setattr(harness, "DROP_CACHES", tmp_path)  # a folder: writing it fails as a read-only /proc would
    monkeypatch.setattr(bench_main, "run_finetune", lambda *a: 0)  # were --cold let through: no bench run here
    assert bench_main.main(["--cold", "--only", "finetune", "--runs", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"--cold needs to write {tmp_path}") and len(err.splitlines()) == 1


def test_bench_port_tree_without_the_port_is_one_sentence_before_anything_runs(tmp_path, monkeypatch, capsys):
    """`--port-tree` picks the port the handoff rows run; a tree without it is said at once, nothing converted."""
    import bench.__main__ as bench_main
    from bench import report

    monkeypatch.setattr(report, "_synthetic_snapshot", lambda *a: pytest.fail("the bench went on"))
    assert bench_main.main(["--only", "handoff", "--port-tree", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {tmp_path}: no GR00T N1.6 port there") and len(err.splitlines()) == 1


def test_a_bench_child_that_fails_is_one_sentence_with_its_last_error_line(tmp_path, monkeypatch, capsys):
    """A child's traceback stays in its log; the bench says which child, its last error line and what to do."""
    import bench.__main__ as bench_main
    from bench import harness, report

    monkeypatch.setattr(harness, "BENCH", tmp_path)  # the child's stderr log goes here, not over bench/'s
    monkeypatch.setattr(report, "run_finetune", lambda *a: harness.run_child("no-such-child", {}))
    monkeypatch.setattr(bench_main, "run_finetune", report.run_finetune)
    assert bench_main.main(["--only", "finetune", "--runs", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"error: bench child no-such-child failed (exit 1): KeyError: 'no-such-child'; its whole stderr "
                   f"is in {tmp_path / 'last-child-stderr.log'}")
    assert "Traceback" in (tmp_path / "last-child-stderr.log").read_text()


def test_each_bench_row_has_its_own_childs_peak_rss():
    """A child started by a large parent reports its own peak, not the parent's (which Linux carries into wait4's
    ru_maxrss): the bench's rows once all showed the 2.79 GB of the synth that ran before them. (Kept small: the
    suite's workers share 24 GB with its temporaries on tmpfs.)"""
    import numpy as np

    from bench import harness

    import resource

    held = np.ones(500 << 20, np.uint8)  # this process: 0.5 GB more resident while the children start
    parent = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    small = harness.run_child("allocate", {"mb": 20})
    large = harness.run_child("allocate", {"mb": 250})
    assert held.sum() == 500 << 20 and parent > 500e6
    assert small["rusage_maxrss_bytes"] >= 0.9 * parent  # what the rows used to show: the parent's peak
    assert 20e6 < small["peak_rss_bytes"] < min(200e6, parent / 2)
    assert large["peak_rss_bytes"] - small["peak_rss_bytes"] > 200e6


@pytest.mark.parametrize("name, value, default", [("GR00T_STALL_SECONDS", "abc", "30"),
                                                   ("GR00T_BACKOFF_SECONDS", "-1", "0.1")])
def test_a_malformed_network_setting_is_one_sentence(tmp_path, name, value, default):
    """Never silently the default: a user who set it meant something."""
    proc = run_cli("cache", "ls", "--cache", str(tmp_path), env={**os.environ, name: value})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr
    assert lines[0].startswith(f"error: {name}={value!r} is not ") and lines[0].endswith(f"unset it for {default}")
