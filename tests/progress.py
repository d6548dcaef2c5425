"""Watching a convert run in another process: how many chunks it has staged so far (its progress records)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from pipeline.cache import entries_dir


def staged_so_far(root: Path) -> int:
    """Progress records in the cache's entries being built: one JSON line per staged chunk."""
    if not entries_dir(root).exists():
        return 0
    return sum(log.read_bytes().count(b"\n") for log in entries_dir(root).glob("*.tmp-*/.staged/*.jsonl"))


def wait_until_staged(proc: subprocess.Popen, root: Path, at_least: int, poll: float, timeout: float = 60) -> int:
    """Poll until `proc` has staged `at_least` chunks, has exited, or `timeout` passed; the count seen last."""
    deadline, staged = time.time() + timeout, 0
    while time.time() < deadline and proc.poll() is None:
        staged = staged_so_far(root)
        if staged >= at_least:
            break
        time.sleep(poll)
    return staged
