"""The harness of `make bench`: the product against raw I/O and the loaders users have today, as ratios measured side by side.

Every measurement runs in a fresh child process (so imports, page faults and peak RSS are its own; peak RSS comes
from the OS via wait4), the contenders of one ratio alternate run by run, and each figure is the median of
`--runs` runs. Page cache: warm (the source and the cache were just written or read), unless `--cold` drops it
before every run. Timings start after imports. Every reload, ours and the baselines', reads every byte once.

Inode quarantine: this VM's root is ext4 without a journal, which will not reuse an inode freed in the last 60 s
(300 s more while its inode-table block is dirty) and scans past every such inode for each file it creates.
Deleting the previous run's cache (~6,000 files and directories) right before a conversion made that
conversion's file creation cost ~2.5 s of extra kernel time (bf16 plan, 11.2 s against 8.8 s after a quiet
minute). So the parent removes every contender's old output itself (`remove`), syncs, and starts a contender
that creates files only 61 s after the last such removal (`settle`): no contender pays for another's cleanup.
Writes bench/results.json, bench/results.md and bench/results.png; exits non-zero only on errors.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tasks.errors import PipelineError

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
DATA = BENCH / "data"


# ---- parent side --------------------------------------------------------------------------------------------------

QUARANTINE_S = 61
MANY_INODES = 500
_last_removal = 0.0


def remove(path: Path) -> None:
    """Delete a contender's old output (a tree); remember when, if it freed enough inodes to matter."""
    global _last_removal
    if not path.exists():
        return
    inodes = sum(1 for _ in path.rglob("*"))
    shutil.rmtree(path, ignore_errors=True)
    if inodes >= MANY_INODES:
        _last_removal = time.monotonic()


def settle() -> None:
    """Before a contender that creates files: flush, then wait out the inode quarantine of the last removal."""
    os.sync()
    wait = QUARANTINE_S - (time.monotonic() - _last_removal)
    if wait > 0:
        time.sleep(wait)


DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def drop_caches() -> None:
    """Empty the page cache (for `--cold`); OSError if this process may not (not root,
    or /proc/sys read-only, as in most containers), so that no result says "cold" when it was warm."""
    os.sync()
    DROP_CACHES.write_text("3\n")


class ChildFailed(PipelineError):
    """A bench child that ended in an error, said in one sentence: its last error line and what to do; its whole
    stderr stays in the log."""

    def __init__(self, name: str, exit_code: int, log: Path):
        text = log.read_text(errors="replace") if log.is_file() else ""
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        said = [line for line in lines if ERROR_LINE.match(line)] or lines or ["(no output)"]
        remedy = (f"free space on the disk that holds {DATA} (the full-scale port and handoff rows alone keep about 58 GB there)"
                  if "No space left on device" in text else "its whole stderr is in " + str(log))
        super().__init__(f"bench child {name} failed (exit {exit_code}): {said[-1][:300]}; {remedy}")


ERROR_LINE = re.compile(r"^[\w.]*(Error|Exception|Interrupt|Exit)\b:?")  # a traceback's last line


def run_child(name: str, args: dict, cold: bool = False, fresh: Path | None = None) -> dict:
    """One measurement in a fresh process; adds its own peak RSS (VmHWM, which the child reports as it ends) and its
    CPU seconds as the OS counted them (wait4).
    `fresh`: an output folder the child creates files in; removed first, and the quarantine waited out."""
    if fresh is not None:
        remove(fresh)
        settle()
    if cold:
        drop_caches()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    started = time.perf_counter()
    with open(BENCH / "last-child-stderr.log", "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "bench", "--child", name, json.dumps(args)],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=err, env=env, text=True)
        out = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = status
    if status != 0:
        raise ChildFailed(name, os.waitstatus_to_exitcode(status), BENCH / "last-child-stderr.log")
    # the child's one JSON line (tt-metal's simulator prints a line of its own at exit)
    result = json.loads(next(line for line in reversed(out.strip().splitlines()) if line.startswith("{")))
    own = result.pop("own_peak_rss_bytes", None)  # the child's VmHWM: its own (bench/__main__.py own_peak_rss_bytes)
    return {**result, "process_seconds": time.perf_counter() - started,
            "peak_rss_bytes": own if own is not None else usage.ru_maxrss * 1024,
            "rusage_maxrss_bytes": usage.ru_maxrss * 1024,
            "cpu_seconds": usage.ru_utime + usage.ru_stime, "user_seconds": usage.ru_utime,
            "sys_seconds": usage.ru_stime, "minor_faults": usage.ru_minflt, "major_faults": usage.ru_majflt}


def median(runs: list[dict], key: str = "seconds") -> float:
    return statistics.median(r[key] for r in runs)


def warm_up(*paths: Path) -> None:
    """Read every file under `paths`, twice, so the contender that follows starts with its inputs in the page cache
    like the others (every contender gets this, right before it runs). The second pass finds them in the cache and
    renews them: a first pass from the disk takes up to 100 s here, and this VM pages out file pages left idle for
    60 s (its DAMON scheme), so without it the first files read could be gone before the contender starts."""
    for _ in range(2):
        for root in paths:
            for f in (root.rglob("*") if root.is_dir() else [root]):
                if f.is_file():
                    with open(f, "rb", buffering=0) as fh:
                        while fh.read(1 << 23):
                            pass
