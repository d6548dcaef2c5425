"""The order in which `make test` hands whole test files to its workers: the longest first.

pytest-xdist's `--dist loadfile` gives each worker one file at a time, in the order of the collection, and by
default reorders the files by their number of tests, which puts a file of one long test (the simulated Blackhole's
child session: 80-130 s) among the last. Longest first (with `--no-loadscope-reorder`), a long file never starts
last, and the two workers finish within about the length of the last file (measured: the workers were busy for
98% of a run's wall time).

The seconds are a run's worker-seconds per file (tests/file_seconds.json); a file not listed goes last, as a new
file is usually short. To measure them again:

    .venv/bin/python -m pytest -q -n auto --dist loadfile --no-loadscope-reorder --junitxml=/tmp/junit.xml
    .venv/bin/python -m tests.file_order /tmp/junit.xml
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ElementTree
from collections import Counter
from pathlib import Path

TABLE = Path(__file__).with_name("file_seconds.json")


def longest_first(items: list) -> None:
    """Sort pytest's items in place so that each file's tests stay together, in their own order, and the files
    come in order of their measured seconds, longest first."""
    seconds = json.loads(TABLE.read_text())["seconds"]
    items.sort(key=lambda item: -seconds.get(item.path.name, 0.0))  # stable: a file's own order is kept


def measured(junit: Path) -> dict[str, float]:
    """Seconds per test file in a pytest --junitxml report (setup, call and teardown)."""
    per_file: Counter = Counter()
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")[1]  # tests.<module>[.<class>]
        per_file[module + ".py"] += float(case.get("time", 0))
    return {name: round(seconds, 1) for name, seconds in per_file.most_common()}


if __name__ == "__main__":
    TABLE.write_text(json.dumps({"measured": f"pytest --junitxml ({sys.argv[1]})", "seconds": measured(
        Path(sys.argv[1]))}, indent=1) + "\n")
