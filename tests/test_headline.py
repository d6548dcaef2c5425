"""README.md's headline table is what the results files under bench/ say (bench/headline.py made it), so it cannot
drift from what was measured; and one figure of it, recomputed here from its file with plain json and statistics."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from bench import headline

ROOT = Path(__file__).resolve().parent.parent


def test_the_readmes_table_is_the_one_the_results_files_give():
    readme = (ROOT / "README.md").read_text()
    assert headline.BEGIN in readme and headline.END in readme
    written = readme.split(headline.BEGIN, 1)[1].split(headline.END, 1)[0].strip()
    assert written == headline.table().strip(), "README.md's headline table is stale: run python -m bench.headline --readme"


def test_a_figure_recomputed_from_its_file_is_the_tables():
    runs = json.loads((ROOT / "bench" / "finetune-results.json").read_text())["runs"]
    after = statistics.median(r["seconds"] for r in runs["fine-tune, release cached"])
    floor = statistics.median(r["seconds"] for r in runs["floor: copying the files it wrote, synced"])
    row = next(line for line in headline.table().splitlines() if line.startswith("| fine-tune convert after"))
    assert row.split(" | ")[1] == f"{after / floor:.2f}" and "its floor" in row


def test_the_table_names_only_goals_that_stand():
    table = headline.table()
    assert "blocked" not in table and "issue" not in table


def test_a_readme_without_the_markers_is_refused_not_overwritten():
    with pytest.raises(SystemExit, match="markers are missing"):
        headline.with_table("# a README\n", "| table |\n")
