"""What the commands print for a person (without --json): one function per report, each taking what the command
returns (a convert's record: pipeline/jobs/summary.py; plain dicts or rows for the rest)."""

from __future__ import annotations

from pipeline.jobs.summary import ConvertSummary


def retries_text(retries: dict | None) -> str:
    """`store_retries` as words: 'requests tried again: 3 (connection cut 2, throttled 1)', or '' for none."""
    if not retries:
        return ""
    return (f"requests tried again: {sum(retries.values())} ("
            + ", ".join(f"{fault} {n}" for fault, n in retries.items()) + ")")


def mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def print_inspect(r: dict) -> None:
    found = " (found from its keys)" if r.get("version_found") else ""
    print(f"{r['version']}{found}: {r['tensors']} tensors, {mb(r['total_bytes'])} of data in {len(r['shards'])} "
          f"shards\n  {r['snapshot']}")
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
    if r.get("trained_embodiments"):
        slots = (f": slots {', '.join(map(str, r['trained_slots']))}, by {r['embodiment_map']}"
                 if r["trained_slots"] else "")
        print(f"  trained for {', '.join(r['trained_embodiments'])} ({r['trained_from']}){slots}")
    kept = r.get("processor")
    if kept is None:
        print("  processor   none beside the weights (a convert keeps the weights only)")
    elif "refused" in kept:
        print(f"  processor   would be refused: {kept['refused']}")
    else:
        print(f"  processor   {kept['trainer']}'s in {kept['from']} ({', '.join(kept['files'])}), statistics for "
              f"{', '.join(kept['embodiments']) or 'no embodiment'}: kept in the entry by a convert")
    for note in r.get("notes", []):
        print(f"  note: {note}")


def print_convert(s: ConvertSummary) -> None:
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
    for shard, against in (s.get("shards_checked_against") or {}).items():
        sha = (s.get("shards_sha256") or {}).get(shard)
        print(f"  checked       {shard} against its {against}" + (f"; sha256 {sha}" if sha else ""))
    if s.get("processor"):
        print(f"  processor     {s['processor']}")
    for note in s.get("notes", []):
        print(f"  note          {note}")
    print(f"  cache entry   {s['cache_path']}")
    if s.get("store_retries"):
        print(f"  network       {retries_text(s['store_retries'])}")
    print(f"  targets       {s['targets']} (+{len(s['skipped'])} source keys skipped by recipe), slots {len(s['slots'])}")
    if s["cache_hit"]:
        return
    resumed, reused = s.get("resumed_chunks", 0), s.get("reused_chunks", 0)
    extra = ", ".join(x for x in (f"{resumed} chunks resumed from a killed run" if resumed else "",
                                  f"{reused} chunks linked from other entries" if reused else "") if x)
    print(f"  tasks         {s['tasks']}" + (f" ({extra})" if extra else ""))
    print(f"  bytes         read {mb(s['bytes_read'])}, written {mb(s['bytes_written'])}")
    print(f"  peak RSS      {mb(s['peak_rss_bytes'])}")
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


def print_cache_rows(rows: list[dict], totals: dict, where: str, sources: bool = False) -> None:
    """`cache ls` / `cache verify`: one line per entry, then the totals; `sources` (verify): under each entry, what
    each source shard was checked against when it was converted."""
    if rows:
        head = f"{'entry':46} {'version':7} {'layout':8} {'profile':7} {'slots':8} {'revision':10} {'source':10} " \
               f"{'size':>10} {'own':>10} {'age':>7}  state / refs"
        print(head)
        for r in rows:
            src = "synthetic" if r["source"] == "synthetic" else ("snapshot" if r["source"] else "-")
            tail = r["state"] + (f"  <- {', '.join(r['refs'])}" if r["refs"] else "") + \
                (f"  (trained for {', '.join(r['trained_for'])}" + (f", read from {r['trained_from']}"
                                                                     if r.get("trained_from") else "") +
                 (f", slots by {r['embodiment_map']}" if r.get("embodiment_map") else "") + ")"
                 if r.get("trained_for") else "") + \
                (f"  processor: {r['processor']['trainer']}'s, for {', '.join(r['processor'].get('embodiments') or ['-'])}"
                 if r.get("processor") else "")
            age = _age(r["age_s"]) if r["age_s"] is not None else "-"
            print(f"{r['entry']:46} {r['version'] or '-':7} {r['layout'] or '-':8} {r['profile'] or '-':7} "
                  f"{_slots(r['slots'], r['bank_slots']):8} {(r['revision'] or '-')[:10]:10} {src:10} {size_text(r['bytes']):>10} "
                  f"{size_text(r['unique_bytes']):>10} {age:>7}  {tail}")
            for shard, against in (r.get("shards_checked_against") or {}).items() if sources else ():
                sha = (r.get("shards_sha256") or {}).get(shard)
                print(f"    source {shard}: checked against its {against}" + (f", sha256 {sha}" if sha else ""))
        print(f"{len(rows)} entries, {size_text(totals['disk_bytes'])} on disk (shared bytes counted once); "
              "'own' is what removing the entry frees")
    else:
        print(f"no entries in {where}")


def print_removed(removed: list[dict], dry_run: bool) -> None:
    """`cache gc` / `cache rm`: what went (or, in a dry run, would go), and what it freed."""
    verb = "would remove" if dry_run else "removed"
    print("\n".join(f"{verb} {r['entry']} ({r['reason']}, {size_text(r['bytes'])}; "
                    f"{'would free' if dry_run else 'freed'} {size_text(r['freed_bytes'])})"
                    + (f"; refs {', '.join(r['refs'])} dropped" if r["refs"] and not dry_run else "")
                    for r in removed) or "nothing to remove")


def size_text(n: float) -> str:
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


def print_targets(tensors: dict, names: tuple[str, ...]) -> None:
    """A loaded tensor per line: its device dtype, layout and shapes (a ttnn tensor), or a host table's."""
    for name in names:
        t = tensors[name]
        if hasattr(t, "padded_shape"):  # a ttnn tensor; host-only targets are torch float32
            print(f"  {name:52} {str(t.dtype):22} {str(t.layout):14} shape {list(t.shape)} padded {list(t.padded_shape)}")
        else:
            print(f"  {name:52} host {t.dtype} {list(t.shape)} (never uploaded, as the port keeps it)")
