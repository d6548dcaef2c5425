"""The one writer of every bench report: its context (when, on what, how warm, what the clock counts, the command),
the contenders side by side, the ratios against their goals; written as `<stem>.json` (everything, every run) and
`<stem>.md` (the tables the READMEs quote)."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Callable

from bench.harness import median

WARM = "warm (each contender's inputs read right before it)"
IMPORTS = "'wall in child' starts after imports; 'wall of process' and CPU include them"


def context(*, only: str, scale: str, runs: int, cold: bool, started: float, **fields) -> dict:
    """What every report states about its run; `fields` add what this one measured (version, layout, ...)."""
    return {"scale": scale, "runs": runs, "page_cache": "cold" if cold else WARM, "cores": os.cpu_count(),
            "python": platform.python_version(), "machine": platform.machine(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S"), "bench_seconds": round(time.time() - started, 1),
            "imports": IMPORTS, "command": f"python -m bench --only {only} --runs {runs} --scale {scale}"
                                          f"{' --cold' if cold else ''}", **fields}


def metric(rows: list, name: str, ours: float, base: float | None, goal: str, holds: bool, *, unit: str = "s",
           note: str = "") -> None:
    """One ratio against its goal (`base` None: `ours` is the figure itself), appended to `rows` and printed."""
    ratio = ours / base if base else ours
    rows.append({"metric": name, "ours": round(ours, 4), "baseline": None if base is None else round(base, 4),
                 "ratio": round(ratio, 4), "goal": goal, "holds": bool(holds), "unit": unit, "note": note})
    print(f"  {name}: {ratio:.3f} (goal {goal}) {'OK' if holds else 'MISSED'} {note}", flush=True)


def times(runs: list[dict]) -> str:
    """The cells every contender row shows, medians: wall in child | wall of process | CPU user | CPU sys."""
    return (f"{median(runs):.2f} s | {median(runs, 'process_seconds'):.2f} s | {median(runs, 'user_seconds'):.2f} s | "
            f"{median(runs, 'sys_seconds'):.2f} s")


def contender_table(raw: dict[str, list], *, columns: tuple[str, ...] = ("contender",),
                    cells: Callable[[str], list[str]] = lambda key: [key],
                    extra: dict[str, Callable[[list], str]] | None = None) -> list[str]:
    """One row per contender of `raw` (its runs' medians): `cells(key)` fills `columns`, `extra` adds columns."""
    extra = extra or {}
    head = [*columns, "wall in child", "wall of process", "CPU user", "CPU sys", "peak RSS", *extra]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key, runs in raw.items():
        row = [*cells(key), times(runs), f"{median(runs, 'peak_rss_bytes') / 1e9:.2f} GB", *(f(runs) for f in extra.values())]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def metric_table(rows: list[dict]) -> list[str]:
    lines = ["| metric | ours | baseline | ratio | goal | holds |", "|---|---|---|---|---|---|"]
    for r in rows:
        base = "" if r["baseline"] is None else f"{r['baseline']:.3f} {r['unit']}"
        note = f" ({r['note']})" if r["note"] else ""
        lines.append(f"| {r['metric']}{note} | {r['ours']:.3f} {r['unit']} | {base} | {r['ratio']:.3f} | {r['goal']} | "
                     f"{'yes' if r['holds'] else '**no**'} |")
    return lines


def write(out: Path, stem: str, *, ctx: dict, raw: dict, what: str, tables: list[list[str]],
          metrics: list[dict] | None = None, after: list[str] = ()) -> list[str]:
    """`<stem>.json` and `<stem>.md` under `out`: the context sentence (`what` was measured), `tables`, `after`.
    Returns the markdown lines (the caller prints them)."""
    doc = {"context": ctx, **({"metrics": metrics} if metrics is not None else {}), "runs": raw}
    (out / f"{stem}.json").write_text(json.dumps(doc, indent=1))
    lines = [f"Measured {ctx['date']} on {ctx['cores']} cores, {what}, median of {ctx['runs']}; page cache "
             f"{ctx['page_cache']}; {ctx['imports']}. Command: `{ctx['command']}`."]
    for table in tables:
        lines += ["", *table]
    if after:
        lines += ["", *after]
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    return lines
