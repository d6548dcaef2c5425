"""`python -m bench --only network` (or `python -m bench.network_faults`): the object store through a network that
fails (issue 63), against the same network without faults, in one sitting.

moto's S3 server stands in for the bucket, behind tests/faulty_network.py's proxy. A synthetic N1.6 (seed 7, every
slot, its default layout) is converted into the bucket and one embodiment (new_embodiment) loaded from it by a
machine whose local cache starts empty, `--runs` times each way, alternating: through the proxy with no faults,
and through it with `--rate` of the requests cut mid-response and as many answered `503 SlowDown` (the proxy's
cost is in both). Each run has a prefix and a local cache of its own: nothing is reused between runs. The entries'
objects (their ETags, S3's MD5 of what it stored) and the loaded tensors (sha256) must be identical both ways.
Prints each goal's verdict from this run, writes bench/network-faults[-full]-results.json.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

GOAL = 1.3  # a convert, and a load, through the faults: at most this many times the same without them
OUT = Path(__file__).with_name("network-faults-results.json")


def _tensor_digest(tensors: dict) -> str:
    import torch

    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(name.encode())
        digest.update(tensors[name].contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _one_run(condition: str, i: int, proxy, rate: float, hf: Path, scale: str, work: Path) -> dict:
    from pipeline.jobs.convert import ConvertOptions, convert
    from pipeline.jobs.load import load
    from tasks.entries.cache_root import open_store
    from tests.buckets import entry_md5s

    bucket = f"s3://gr00t/{condition}-{i}"
    os.environ["GR00T_CACHE"] = str(work / f"client-{condition}-{i}")
    rates = {"cut_response": rate, "slowdown": rate} if condition == "faults" else {}
    proxy.set(**rates)
    faults0 = sum(proxy.counts.values())
    t0, c0 = time.perf_counter(), os.times()
    done = convert(ConvertOptions("n16", hf_cache=hf, synthetic=scale, cache_root=bucket, progress=False))
    convert_s, c1 = time.perf_counter() - t0, os.times()
    faults1 = sum(proxy.counts.values())
    os.environ["GR00T_CACHE"] = str(work / f"loader-{condition}-{i}")  # another machine: nothing kept yet
    t0 = time.perf_counter()
    got = load("n16", bucket, "new_embodiment", entry=done["cache_path"].rsplit("/", 1)[1], synthetic=True)
    load_s, c2 = time.perf_counter() - t0, os.times()
    proxy.set()
    name = done["cache_path"].rsplit("/", 1)[1]
    objects = entry_md5s(open_store(bucket), name)
    row = {"condition": condition, "run": i, "convert_wall_s": round(convert_s, 2),
           "convert_cpu_s": round(c1.user - c0.user + c1.system - c0.system, 2),
           "convert_faults": faults1 - faults0, "convert_retries": done.get("store_retries", {}),
           "load_wall_s": round(load_s, 2), "load_cpu_s": round(c2.user - c1.user + c2.system - c1.system, 2),
           "load_faults": sum(proxy.counts.values()) - faults1, "load_retries": got.stats.get("store_retries", {}),
           "load_bytes_read": got.stats["bytes_read"], "entry": name, "objects": len(objects),
           "objects_md5": hashlib.sha256(json.dumps(objects, sort_keys=True).encode()).hexdigest(),
           "tensors_sha256": _tensor_digest(got.tensors)}
    print(f"{condition} {i}: convert {convert_s:.1f} s ({row['convert_faults']} faults), load {load_s:.1f} s "
          f"({row['load_faults']} faults)", file=sys.stderr, flush=True)
    shutil.rmtree(work / f"loader-{condition}-{i}", ignore_errors=True)
    open_store(bucket).delete("")  # moto holds it in memory or its temporaries: one run's worth at a time
    return row


def run(scale: str = "tiny", runs: int = 2, rate: float = 0.01, seed: int = 1) -> int:
    from bench.bucket_finetune import _moto, check_disk
    from tests.faulty_network import FaultyProxy

    out = OUT if scale == "tiny" else OUT.with_name("network-faults-full-results.json")
    work = Path(tempfile.mkdtemp(prefix="bench-network-"))
    check_disk(work, scale, copies=3)  # the checkpoint, moto's copy of one run's entry, one load's kept bytes
    server = _moto()
    moto = os.environ["AWS_ENDPOINT_URL"]
    proxy = FaultyProxy(int(moto.rsplit(":", 1)[1]), seed=seed)
    try:
        import boto3

        from pipeline.inputs.synth import synthesize

        boto3.client("s3", endpoint_url=moto).create_bucket(Bucket="gr00t")
        os.environ["AWS_ENDPOINT_URL"] = proxy.url  # every request of this process through the proxy
        hf = work / "hf"
        synthesize("n16", hf, scale, seed=7)
        rows = [_one_run(condition, i, proxy, rate, hf, scale, work)
                for i in range(runs) for condition in ("clean", "faults")]
    finally:
        proxy.close()
        server.terminate()
        shutil.rmtree(work, ignore_errors=True)
    by = {c: [r for r in rows if r["condition"] == c] for c in ("clean", "faults")}
    median = {c: {k: round(statistics.median(r[k] for r in rs), 2) for k in ("convert_wall_s", "load_wall_s")}
              for c, rs in by.items()}
    ratios = {k: round(median["faults"][k] / median["clean"][k], 2) for k in ("convert_wall_s", "load_wall_s")}
    identical = (len({r["objects_md5"] for r in rows}) == 1 and len({r["tensors_sha256"] for r in rows}) == 1)
    faulted = all(r["convert_faults"] > 0 and r["load_faults"] > 0 for r in by["faults"])
    verdicts = {
        f"convert into the bucket through the faults <= {GOAL}x without": ratios["convert_wall_s"] <= GOAL,
        f"one-embodiment load through the faults <= {GOAL}x without": ratios["load_wall_s"] <= GOAL,
        "bytes identical (every object, every loaded tensor)": identical,
        "every faulty run met faults, converting and loading": faulted}
    result = {"measured": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": f"{os.cpu_count()} cores",
              "command": f"python -m bench.network_faults --scale {scale} --runs {runs} --rate {rate} --seed {seed}",
              "scale": scale, "faults": f"{rate:.1%} of requests cut mid-response, {rate:.1%} answered 503 SlowDown",
              "medians": median, "faults_over_clean": ratios, "verdicts": verdicts, "runs": rows}
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1))
    for goal, met in verdicts.items():
        print(f"{'MET   ' if met else 'NOT MET'} {goal}")
    return 0 if all(verdicts.values()) else 1


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m bench.network_faults", description=__doc__)
    ap.add_argument("--scale", default="tiny", choices=("tiny", "full"))
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--rate", type=float, default=0.01, help="of the requests cut, and as many throttled (0.01)")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    return run(a.scale, a.runs, a.rate, a.seed)


if __name__ == "__main__":
    raise SystemExit(main())
