"""Trust: no command deletes what it should not (a dry run least of all), fake weights never take the place of real
ones, an entry is what was asked for, sizes are true, and every failure is one sentence with a non-zero exit and
nothing half-written (the table at the end: command, sentence, exit code)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest

from pipeline import cache
from pipeline.jobs.convert import ConvertOptions, convert
from pipeline.jobs.load import load
from tasks.errors import CacheError
from tests.required import needs
from tests.handmade import holding
from tests.progress import wait_until_staged
from tests.conftest import run_cli

from tests.conftest import ROOT


def test_a_dry_run_removes_nothing(two_entries):
    """(Also what it says it would do: each entry and why, and the refs that would go with the current one.)"""
    root, older, current = two_entries
    before = sorted(p.name for p in (root / "entries").iterdir()), sorted(p.name for p in (root / "refs").iterdir())
    for args in (["rm", older, "--dry-run"], ["rm", "--include-current", current, "--dry-run"],
                 ["gc", "--older-than-days", "0", "--include-current", "--dry-run"]):
        proc = run_cli("cache", *args, "--cache", str(root))
        assert proc.returncode == 0 and "would remove" in proc.stdout and "would free" in proc.stdout, (args, proc)
    said = json.loads(run_cli("cache", "gc", "--older-than-days", "0", "--include-current", "--dry-run", "--json",
                              "--cache", str(root)).stdout)["removed"]
    assert {r["entry"]: r["reason"] for r in said} == {older: "older than 0 days", current: "older than 0 days"}
    said = json.loads(run_cli("cache", "rm", current, "--include-current", "--dry-run", "--json", "--cache",
                              str(root)).stdout)["removed"]
    assert said[0]["refs"] == ["n17-tt-port-port.synthetic"]
    assert (sorted(p.name for p in (root / "entries").iterdir()), sorted(p.name for p in (root / "refs").iterdir())) == before
    proc = run_cli("cache", "rm", "--include-current", "--cache", str(root), current)  # options before the name
    assert proc.returncode == 0 and f"removed {current}" in proc.stdout
    assert sorted(p.name for p in (root / "entries").iterdir()) == [older]


def _real_format_copy(snapshot: Path, dst: Path) -> Path:
    """The synthetic snapshot rewritten without its synthetic marks: what a real release looks like to us."""
    from safetensors.torch import load_file, save_file

    dst.mkdir(parents=True)
    index = json.loads((snapshot / "model.safetensors.index.json").read_text())
    index["metadata"].pop("gr00t_tt_synthetic")
    (dst / "model.safetensors.index.json").write_text(json.dumps(index))
    for shard in sorted(set(index["weight_map"].values())):
        save_file(load_file(str(snapshot / shard)), str(dst / shard), metadata={"format": "pt"})
    return dst


def test_synthetic_weights_never_take_the_real_ones_place(snapshots, hf_cache, tmp_path):
    root = tmp_path / "cache"
    real = _real_format_copy(snapshots["n16"], tmp_path / "release")
    first = convert(ConvertOptions("n16", embodiments="gr1", snapshot=real, cache_root=root, progress=False))
    assert not first["source"]["synthetic"]
    fake = convert(ConvertOptions("n16", embodiments="gr1", hf_cache=hf_cache, synthetic="tiny", cache_root=root,
                                  progress=False))
    assert "synthetic n16 (tiny scale" in fake["source"]["synthetic"] and fake["fingerprint"] != first["fingerprint"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the real entry comes without a word
        loaded = load("n16", root, embodiment="gr1")
    assert loaded.entry == Path(first["cache_path"]).name and loaded.synthetic is None
    # with only the synthetic entry left, the default load says what it hands out
    cache.remove_entry(cache.cache_store(root), loaded.entry, include_current=True)
    with pytest.warns(cache.SyntheticWeightsWarning, match="SYNTHETIC weights"):
        fake_loaded = load("n16", root, embodiment="gr1")
    assert "not NVIDIA weights" in fake_loaded.synthetic
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load("n16", root, embodiment="gr1", synthetic=True)  # the caller said it knows


def test_an_entry_of_another_version_layout_or_profile_is_refused(hf_cache, tmp_path):
    root = tmp_path / "cache"
    n16 = Path(convert(ConvertOptions("n16", embodiments="gr1", hf_cache=hf_cache, synthetic="tiny", cache_root=root,
                                      progress=False))["cache_path"]).name
    with pytest.raises(CacheError, match=f"{n16}: is a n16 entry, not n17; pass --version n16"):
        load("n17", root, embodiment=10, entry=n16)
    with pytest.raises(CacheError, match="is a tt-n16 entry, not layout generic"):
        load("n16", root, embodiment="gr1", entry=n16, layout="generic")
    with pytest.raises(CacheError, match="is a port entry, not profile bfp8"):
        load("n16", root, embodiment="gr1", entry=n16, profile="bfp8")
    proc = run_cli("load", "--version", "n17", "--entry", n16, "--embodiments", "10", "--cache", str(root))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "is a n16 entry, not n17" in proc.stderr


def test_a_live_reader_keeps_its_entry_from_gc_and_rm(two_entries):
    root, older, current = two_entries
    holder = holding(root, older)
    try:
        proc = run_cli("cache", "gc", "--older-than-days", "0", "--include-current", "--cache", str(root), "--json")
        removed = {r["entry"]: r for r in json.loads(proc.stdout)["removed"]}
        assert removed[older].get("kept") and f"being read by process {holder.pid}" in removed[older]["reason"]
        assert (root / "entries" / older).is_dir() and not (root / "entries" / current).exists()
        proc = run_cli("cache", "rm", older, "--include-current", "--cache", str(root))
        assert proc.returncode == 2 and f"being read by process {holder.pid}" in proc.stderr
    finally:
        holder.kill()
        holder.wait()
    assert run_cli("cache", "rm", older, "--include-current", "--cache", str(root)).returncode == 0  # lease gone with it


def test_all_means_every_slot_the_checkpoint_has(tmp_path):
    from pipeline.inputs.synth import synthesize

    synthesize("n16", tmp_path / "hf", "attn")
    summary = convert(ConvertOptions("n16", hf_cache=tmp_path / "hf", synthetic="attn", cache_root=tmp_path / "c",
                                     progress=False))
    assert summary["slots"] == [0, 1]


def test_graph_units_in_numeric_order(hf_cache, tmp_path):
    from pipeline.commands.render import unit_summary
    from pipeline.commands.render import graph_for

    graph, _ = graph_for(ConvertOptions("n16", hf_cache=hf_cache, synthetic="tiny", cache_root=tmp_path, progress=False))
    blocks = [u for u in unit_summary(graph) if ".transformer_blocks." in u and "model." in u]
    numbers = [int(u.rsplit(".", 1)[1]) for u in blocks]
    assert numbers == sorted(numbers) and numbers[:3] == [0, 1, 2]


def test_help_texts_say_what_each_command_does():
    cache_help = {a: run_cli("cache", a, "--help").stdout for a in ("ls", "gc", "rm")}
    assert len(set(cache_help.values())) == 3
    assert "remove nothing" in cache_help["rm"] and "--dry-run" in cache_help["rm"]
    assert "Convert a snapshot into a cache entry." in run_cli("convert", "--help").stdout
    assert "inspect the project's synthetic" in " ".join(run_cli("inspect", "--help").stdout.split())
    assert "seed of the synthetic values" in " ".join(run_cli("synth", "--help").stdout.split())


TABLE: list[tuple[str, str, int]] = []


def _one_sentence(proc: subprocess.CompletedProcess, expected: str, code: int = 2) -> str:
    err = proc.stderr.strip()
    assert proc.returncode == code, (proc.returncode, err[-1500:])
    assert "Traceback" not in proc.stderr and expected in err and len(err.splitlines()) == 1, err[-1500:]
    return err


def test_failures_are_one_sentence_and_leave_nothing_half_written(hf_cache, snapshots, tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    src = ["--hf-cache", str(hf_cache), "--synthetic", "tiny"]
    cases = [
        ("convert --cache <a file>", ["convert", "--version", "n16", *src, "--cache", str(a_file)],
         "the cache is a file, not a folder"),
        ("convert --cache <unwritable folder>", ["convert", "--version", "n16", *src, "--cache", "/proc/gr00t-cache"],
         "/proc/gr00t-cache: cannot write to this cache folder"),
        ("convert --scheduler tcp://127.0.0.1:1", ["convert", "--version", "n16", *src, "--cache", str(tmp_path / "c"),
                                                   "--scheduler", "tcp://127.0.0.1:1"],
         "--scheduler tcp://127.0.0.1:1: no Dask scheduler answers there (Connection refused)"),
        ("convert --version n15 --snapshot <an n16>", ["convert", "--version", "n15", "--snapshot", str(snapshots["n16"]),
                                                       "--cache", str(tmp_path / "c")],
         "not a GR00T n15 checkpoint: 1106 tensors"),
        ("convert --synthetic tiny --revision abc123", ["convert", "--version", "n16", *src, "--revision", "abc123",
                                                        "--cache", str(tmp_path / "c")],
         "--revision abc123 does not apply to --synthetic tiny"),
        ("convert --snapshot D --revision abc123", ["convert", "--snapshot", str(snapshots["n16"]), "--revision",
                                                    "abc123", "--cache", str(tmp_path / "c")],
         "--revision abc123 does not apply to --snapshot"),
        ("convert --snapshot D --synthetic tiny", ["convert", "--version", "n16", "--snapshot", str(snapshots["n16"]),
                                                   "--synthetic", "tiny", "--cache", str(tmp_path / "c")],
         "name two sources: pass one"),
        ("cache gc --older-than-days -1", ["cache", "gc", "--older-than-days", "-1", "--cache", str(tmp_path / "c")],
         "-1 days is negative"),
    ]
    for case, args, expected in cases:
        t0 = time.perf_counter()
        proc = run_cli(*args)
        err = _one_sentence(proc, expected)
        assert time.perf_counter() - t0 < 25, case  # (the tcp:// case: not after a 30 s connect timeout)
        TABLE.append((case, err, proc.returncode))
    assert not list((tmp_path / "c").glob("entries/*.tmp-*"))
    assert a_file.read_text() == "not a folder"


def test_synth_on_a_full_disk_keeps_nothing(tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip(needs("root", "cannot mount a small tmpfs here: a full disk is not exercised"))
    try:
        proc = run_cli("synth", "--version", "n16", "--hf-cache", str(mount))
        err = _one_sentence(proc, "no space left on the device while synthesizing n16 (tiny); nothing was kept")
        assert list(mount.iterdir()) == []  # no empty repo folders left behind
        TABLE.append(("synth --hf-cache <full disk>", err.replace(str(mount), "<tmpfs>"), proc.returncode))
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def _start_as_from_a_terminal(cmd: list[str], **kwargs) -> subprocess.Popen:
    """Start `cmd` with SIGINT at its default, as a terminal starts it. A background job (CI runs `make test` as
    one) inherits SIGINT ignored, and Python then never installs its Ctrl-C handler. A caught signal is reset to
    the default by exec, so the parent catches it while the child starts, instead of a `preexec_fn`: that forces
    a fork of this process, which failed with ENOMEM once the simulated device's 26 GB of mappings were in it."""
    saved = signal.signal(signal.SIGINT, signal.default_int_handler)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONFAULTHANDLER": "1"}  # stacks on SIGABRT: _stderr_once_exited
    try:
        return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                                **kwargs)
    finally:
        signal.signal(signal.SIGINT, saved)


def _interrupt(args: list[str], after: float) -> subprocess.CompletedProcess:
    """Ctrl-C `after` seconds into the command, while it still starts. A command that has already done its work by
    then exits 0, or is killed by the signal as Python shuts down (-2, nothing said): a clean-clone run's `cache ls`
    did each, once. It is started again and interrupted sooner, down to 0.09 s (Python's own start-up takes about
    0.05 s here, and a Ctrl-C inside it is Python's to report, not ours)."""
    for delay in (after, after * 0.67, after * 0.45, 0.09):
        proc = _start_as_from_a_terminal([sys.executable, "-m", "pipeline", *args])
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        err = _stderr_once_exited(proc, 120)
        if proc.returncode not in (0, -signal.SIGINT) or err.strip():  # interrupted while it ran, not after
            break
    return subprocess.CompletedProcess(proc.args, proc.returncode, "", err)


def _stderr_once_exited(proc: subprocess.Popen, timeout: float) -> str:
    """The child's stderr once it exits. One that does not exit within `timeout` (a clean-clone run's convert
    printed its line after Ctrl-C and then did not, once) is made to print every thread's stack (faulthandler, on
    SIGABRT) and fails the test with them, instead of being left running."""
    try:
        return proc.communicate(timeout=timeout)[1]
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        try:
            err = proc.communicate(timeout=30)[1]
        except subprocess.TimeoutExpired:
            proc.kill()
            err = proc.communicate()[1]
        pytest.fail(f"{' '.join(map(str, proc.args[2:]))} did not exit within {timeout:.0f} s of Ctrl-C; its "
                    f"stderr, with every thread's stack:\n{err[-6000:]}")


def _ctrl_c_during_load(root: Path) -> None:
    """Interrupted while it reads the entry: the signal is sent once the child's lease on the entry is there (it
    holds one from its first read to its last), not after a fixed delay, which an idle machine's load outran."""
    for _ in range(5):
        proc = _start_as_from_a_terminal([sys.executable, "-m", "pipeline", "load", "--version", "n17", "--embodiment",
                                          "0", "--cache", str(root)])
        while proc.poll() is None and not list((root / "leases").glob(f"*@{proc.pid}-*")):
            time.sleep(0.0005)
        proc.send_signal(signal.SIGINT)
        during = subprocess.CompletedProcess(proc.args, None, "", _stderr_once_exited(proc, 120))
        during.returncode = proc.returncode
        if during.returncode == 0:
            continue  # it had read everything before the signal landed
        err = _one_sentence(during, "interrupted: nothing was changed", 130)
        assert "resume" not in err and "while starting" not in err
        TABLE.append(("Ctrl-C during load", err, 130))
        return
    pytest.skip("load finished before Ctrl-C landed, five times")


def _ctrl_c_during_convert(hf_cache: Path, tmp_path: Path, scheduler: str) -> None:
    """Interrupted while staging: one line, nothing published, the staged work kept, and the next run resumes it."""
    for attempt in range(3):  # on a loaded machine the run may finish before the signal lands: try again
        root = tmp_path / f"{scheduler}-attempt{attempt}"
        cmd = [sys.executable, "-m", "pipeline", "convert", "--version", "n16", "--synthetic", "tiny", "--hf-cache",
               str(hf_cache), "--cache", str(root), "--scheduler", scheduler]
        proc = _start_as_from_a_terminal(cmd)
        staged = wait_until_staged(proc, root, 20, poll=0.002)
        proc.send_signal(signal.SIGINT)
        err = _stderr_once_exited(proc, 60)
        building = [p for p in (root / "entries").iterdir() if ".tmp-" in p.name]
        if proc.returncode == 0 and not building:
            continue  # it had already published: nothing was interrupted
        assert staged >= 20
        said = _one_sentence(subprocess.CompletedProcess(cmd, proc.returncode, "", err), "interrupted: nothing was published", 130)
        TABLE.append((f"Ctrl-C during convert (--scheduler {scheduler})", said, 130))
        assert building and not [p for p in (root / "entries").iterdir() if ".tmp-" not in p.name]  # kept, unpublished
        resumed = convert(ConvertOptions("n16", hf_cache=hf_cache, synthetic="tiny", cache_root=root, progress=False))
        assert resumed["resumed_chunks"] >= 20
        return
    pytest.fail("three runs finished before Ctrl-C could interrupt them")


def test_the_threads_scheduler_waits_for_its_tasks_off_the_main_thread(hf_cache, tmp_path, monkeypatch):
    """Ctrl-C is raised in the main thread. Waiting there for finished tasks (Dask's `queue.get`), a Ctrl-C that
    landed inside the queue's Condition once it held its lock would leave it held, and every task thread would then
    wait forever to report back: the threads scheduler's loop runs on a thread of its own."""
    import dask.local

    waited, real = [], dask.local.queue_get
    monkeypatch.setattr(dask.local, "queue_get", lambda q: waited.append(threading.current_thread()) or real(q))
    convert(ConvertOptions("n16", embodiments="gr1", hf_cache=hf_cache, synthetic="tiny", cache_root=tmp_path,
                           progress=False))
    assert waited and threading.main_thread() not in waited


def test_no_write_is_handed_off_from_the_main_thread(hf_cache, tmp_path, monkeypatch):
    """The sync scheduler runs every task on the main thread. Handing its writes off there, a Ctrl-C that landed
    inside a lock the hand-off takes (Python's Condition, in ThreadPoolExecutor.submit too) once it held it left
    it held, and the cleanup waited forever (a `make test` run's Ctrl-C test hung so): it writes them itself."""
    from tasks import stage

    handed, real = [], stage.write_behind
    monkeypatch.setattr(stage, "write_behind", lambda *a: handed.append(threading.current_thread()) or real(*a))
    monkeypatch.setattr(stage, "DIRECT_MIN", 0)  # every file as big as a real checkpoint's big ones
    for scheduler in ("sync", "threads"):
        handed.clear()
        convert(ConvertOptions("n16", embodiments="gr1", hf_cache=hf_cache, synthetic="tiny", scheduler=scheduler,
                               cache_root=tmp_path / scheduler, progress=False))
        assert threading.main_thread() not in handed
        assert bool(handed) == (scheduler == "threads")  # the threads scheduler's tasks still hand theirs off


def test_an_error_raised_while_ctrl_c_is_handled_is_the_interrupt(monkeypatch, capsys):
    """Dask's synchronous executor, interrupted inside `Future.set_result`, raises InvalidStateError from the
    KeyboardInterrupt (a clean-clone run printed its traceback once): the user sees the interrupt's one line."""
    from concurrent.futures import Future, InvalidStateError

    from pipeline.commands import cli

    def interrupted_in_set_result(_args):
        future = Future()
        future.set_result([])
        try:
            raise KeyboardInterrupt
        except BaseException as e:
            future.set_exception(e)  # what dask.local.SynchronousExecutor.submit does: InvalidStateError

    monkeypatch.setattr(cli, "cmd_convert", interrupted_in_set_result)
    assert cli.main(["convert", "--version", "n16", "--synthetic", "tiny"]) == 130
    assert capsys.readouterr().err.strip().startswith("interrupted: nothing was published")

    def plain_failure(_args):
        raise InvalidStateError("not from an interrupt")

    monkeypatch.setattr(cli, "cmd_convert", plain_failure)
    with pytest.raises(InvalidStateError):  # any other error is not taken for one
        cli.main(["convert", "--version", "n16", "--synthetic", "tiny"])


def test_ctrl_c_inside_an_extension_modules_import_is_one_line_too():
    """A Ctrl-C that lands while a C extension imports comes out of the import as that module's ImportError (numpy's
    C API says "numpy._core.umath failed to import"; a clean-clone run's Ctrl-C 0.3 s into a start met it): still the
    one line and exit 130, never the traceback. Made certain here: the import of the CLI interrupts itself so."""
    code = ("import builtins, os, signal, sys, time\n"
            "real = builtins.__import__\n"
            "def importing(name, *args, **kwargs):\n"
            "    if name == 'pipeline.commands.cli':\n"
            "        try:\n"
            "            os.kill(os.getpid(), signal.SIGINT)\n"
            "            time.sleep(5)\n"
            "        except KeyboardInterrupt:\n"
            "            raise ImportError('numpy._core.umath failed to import') from None\n"
            "    return real(name, *args, **kwargs)\n"
            "builtins.__import__ = importing\n"
            "from pipeline.__main__ import run\n"
            "sys.exit(run())\n")
    proc = subprocess.run([sys.executable, "-c", code, "cache", "ls"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert (proc.returncode, proc.stderr) == (130, "interrupted while starting: nothing was changed\n"), proc.stderr


_INTERRUPTED_INSIDE_A_CALLBACK = """
import signal, sys, weakref
import pipeline.__main__ as start


class InterruptInsideACallback:  # as the signal lands while importlib runs a weakref callback
    def find_spec(self, name, path=None, target=None):
        if name == "pipeline.commands.cli":
            class Thing: pass
            thing = Thing()
            ref = weakref.ref(thing, lambda r: signal.getsignal(signal.SIGINT)(signal.SIGINT, None))
            del thing
        return None


sys.meta_path.insert(0, InterruptInsideACallback())
sys.argv = ["pipeline", "cache", "ls"]
sys.exit(start.run())
"""


def test_ctrl_c_inside_a_callback_at_start_up_is_the_one_line_too():
    """Python prints what a callback raises, as a traceback, and goes on: a Ctrl-C that lands inside one while the
    command imports (the start-up test met it once, in a clean-clone run) is still the one line, exit 130."""
    proc = subprocess.run([sys.executable, "-c", _INTERRUPTED_INSIDE_A_CALLBACK], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 130 and proc.stderr == "interrupted while starting: nothing was changed\n", proc.stderr


def test_ctrl_c_is_one_line_at_start_up_and_during_convert_which_resumes(two_entries, hf_cache, tmp_path):
    """As from a terminal: each child starts with SIGINT at its default (`_start_as_from_a_terminal`)."""
    root, _, _ = two_entries
    early = _interrupt(["cache", "ls", "--cache", str(root)], 0.3)  # while torch/dask still import
    TABLE.append(("Ctrl-C in the first second", _one_sentence(early, "interrupted", 130), 130))
    for scheduler in ("sync", "threads"):  # threads: the default, its loop off the main thread
        _ctrl_c_during_convert(hf_cache, tmp_path, scheduler)


def test_ctrl_c_during_load_is_one_line(two_entries):
    """A test of its own: when the load outruns the signal five times it is this test that says skipped, not a
    combined one whose other cases passed."""
    root, _, _ = two_entries
    _ctrl_c_during_load(root)


def _as_format_2(entry: Path) -> Path:
    """Rewrite a published entry as cache format 2 wrote one: chunk keys `c/0/0` (format 3 made them `c.0.0`), the
    manifest saying format 2 and a fingerprint that matches its (new) name, as that converter would have."""
    import hashlib

    manifest = json.loads((entry / "MANIFEST.json").read_text())
    for chunk in list(entry.rglob("c.*")):
        parts = chunk.name.split(".")[1:]
        target = chunk.parent.joinpath("c", *parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        chunk.rename(target)
    manifest.pop("source_shapes", None)
    manifest["cache_format"] = 2
    manifest["fingerprint"] = hashlib.sha256(b"format 2 " + manifest["fingerprint"].encode()).hexdigest()
    (entry / "MANIFEST.json").write_text(json.dumps(manifest))
    old = entry.parent / (entry.name[:-20] + manifest["fingerprint"][:20])
    entry.rename(old)
    return old


def test_an_entry_of_an_older_format_is_one_sentence_and_never_reused(hf_cache, tmp_path):
    root = tmp_path / "cache"
    first = convert(ConvertOptions("n16", embodiments="all", hf_cache=hf_cache, synthetic="micro", cache_root=root,
                                   progress=False))
    old = _as_format_2(Path(first["cache_path"]))
    ref = root / "refs" / "n16-tt-n16-port.synthetic.json"
    ref.write_text(json.dumps({"entry": old.name}))
    with pytest.raises(CacheError, match=f"{old.name}: written in cache format 2, which this converter does not read"):
        load("n16", root, embodiment="gr1")
    listed = run_cli("cache", "ls", "--cache", str(root))
    assert "cache format 2 (unreadable here" in listed.stdout
    proc = run_cli("convert", "--version", "n16", "--hf-cache", str(hf_cache), "--synthetic", "micro", "--cache", str(root),
                "--json")  # all slots, as the old entry: nothing of it may be linked
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    summary = json.loads(proc.stdout)
    assert summary["reused_chunks"] == 0 and not summary["cache_hit"] and Path(summary["cache_path"]).name != old.name
    assert load("n16", root, embodiment="gr1").entry == Path(summary["cache_path"]).name
    gc = run_cli("cache", "gc", "--cache", str(root))
    assert gc.returncode == 0 and f"removed {old.name} (cache format 2, which this converter does not read" in gc.stdout


def test_a_check_killed_before_its_cleanup_leaves_nothing_that_passes_for_an_entry(two_entries, hf_cache):
    """`--check-against-cache` publishes a fresh conversion beside the cached entry, compares the two, then deletes
    the fresh one. Killed in between (here: it exits where the delete would run), what stays behind is never
    listed, chosen or counted as an entry, and gc removes it once its process is dead."""
    root, _, current = two_entries
    exit_at_cleanup = ("import os, sys, types, pipeline.jobs.build_entry as c; "
                       "c.shutil = types.SimpleNamespace(rmtree=lambda *a, **k: os._exit(9)); "
                       "from pipeline.commands.cli import main; sys.exit(main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", exit_at_cleanup, "convert", "--version", "n17", "--embodiments",
                           "0", "--hf-cache", str(hf_cache), "--synthetic", "micro", "--cache",
                           str(root), "--check-against-cache"], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)
    assert proc.returncode == 9, proc.stderr[-2000:]
    left = [p for p in (root / "entries").iterdir() if p.name.endswith(current) and p.name != current]
    assert len(left) == 1 and (left[0] / "MANIFEST.json").is_file()  # the fresh conversion, complete, left behind
    fingerprint = json.loads((root / "entries" / current / "MANIFEST.json").read_text())["fingerprint"]
    assert load("n17", root, 0, entry=fingerprint[:12], synthetic=True).entry == current  # the one match
    listed = {r["entry"]: r["state"] for r in json.loads(run_cli("cache", "ls", "--cache", str(root), "--json").stdout)["entries"]}
    assert listed[left[0].name] == "incomplete" and listed[current] == "published"
    gc = run_cli("cache", "gc", "--cache", str(root))
    assert gc.returncode == 0 and f"removed {left[0].name} (temporary of a dead process" in gc.stdout, gc.stdout
    assert not left[0].exists() and (root / "entries" / current).is_dir()


def test_an_entry_removed_after_it_was_chosen_is_said_and_not_half_read(two_entries, monkeypatch):
    root, _, current = two_entries
    chosen_by = cache.choose_entry

    def chosen_then_removed(store, wanted):  # `cache rm` runs between load's choice and its first read
        chosen = chosen_by(store, wanted)
        cache.remove_entry(store, chosen.name, include_current=True)
        return chosen

    monkeypatch.setattr(cache, "choose_entry", chosen_then_removed)
    with pytest.raises(CacheError, match=f"{current}: was removed \\(`cache rm` or `cache gc`\\) while it was being "
                                         "opened; load again"):
        load("n17", root, embodiment=0, synthetic=True)


def test_a_fine_tune_holds_a_lease_on_the_entry_it_links_from(hf_cache, tmp_path, monkeypatch):
    """Reuse hard-links chunks out of an earlier entry; gc or rm running meanwhile must leave that entry alone."""
    from tasks.entries import store as store_mod

    root = tmp_path / "cache"
    first = convert(ConvertOptions("n16", embodiments="gr1", hf_cache=hf_cache, synthetic="micro", cache_root=root,
                                   progress=False))
    source, linked, outcome = Path(first["cache_path"]).name, store_mod.link_or_copy, []

    def link_while_rm_runs(src: Path, dst: Path) -> None:
        if not outcome:
            try:
                cache.remove_entry(cache.cache_store(root), source, include_current=True)
                outcome.append("removed")
            except CacheError as e:
                outcome.append(str(e))
        linked(src, dst)

    monkeypatch.setattr(store_mod, "link_or_copy", link_while_rm_runs)
    second = convert(ConvertOptions("n16", embodiments="gr1,new_embodiment", hf_cache=hf_cache, synthetic="micro",
                                    cache_root=root, progress=False))
    assert second["reused_chunks"] > 0 and f"being read by process {os.getpid()}" in outcome[0], outcome
    assert (root / "entries" / source / "MANIFEST.json").is_file()
    assert cache.remove_entry(cache.cache_store(root), source, include_current=True)["entry"] == source  # after: free


def test_a_killed_test_runs_temporaries_are_taken_back_and_a_live_ones_never(tmp_path):
    """A killed run's folder (its `.lock` names a process that is gone) is what the next run may remove when memory
    is short; a running one's (this process's) and a finished one's (no lock) are not."""
    from tests.conftest import killed_runs

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    runs = tmp_path / "pytest-of-someone"
    for n, lock in ((1, str(gone.pid)), (2, str(os.getpid())), (3, None)):
        (runs / f"pytest-{n}").mkdir(parents=True)
        if lock is not None:
            (runs / f"pytest-{n}" / ".lock").write_text(lock)
    assert killed_runs(tmp_path) == [runs / "pytest-1"]
