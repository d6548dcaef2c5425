"""`python -m bench.bucket_finetune`: a fine-tune converted into an object store after its release (issue 49).

moto's S3 server on 127.0.0.1 stands in for the bucket. A synthetic N1.6 (tiny, every slot, seed 7) is converted into
`s3://gr00t/cache`, then a fine-tune of it whose `action_head.*` tensors changed; then both into a local folder, for
the changed targets' bytes. Bytes sent are counted at the store interface (every `put` and `put_many` of this
process: the threads scheduler runs the stage tasks here); objects and bytes added are read off the bucket's
listing before and after; the changed targets' objects and bytes from the fine-tune's local entry (its files that
are no other entry's links). The floor of the release's convert into the bucket is boto3 putting the same objects
with as many in flight. Writes bench/bucket-finetune-results.json and prints it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OUT = Path(__file__).with_name("bucket-finetune-results.json")


def _moto() -> subprocess.Popen:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.environ.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ACCESS_KEY_ID="bench",
                      AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return server
        except OSError:
            time.sleep(0.1)
    server.terminate()
    raise SystemExit("moto's server did not start")


def check_disk(work: Path, scale: str, copies: float) -> None:
    """Refuse to start, in one sentence naming what is needed and where, unless the disk holds `copies` times a
    synthetic N1.6 of `scale` with a tenth to spare, in `work` and in the temporary folder moto spools large
    objects to: a disk that fills during a run costs the loads their kept bytes (and then their figures), silently."""
    from pipeline.model.state_dict import tensor_specs

    checkpoint = sum(s.nbytes for s in tensor_specs("n16", scale))
    need = int(copies * checkpoint * 1.1)
    for where in {work, Path(tempfile.gettempdir())}:
        free = shutil.disk_usage(where).free
        if free < need:
            raise SystemExit(f"{where}: {free / 1e9:.1f} GB free, and this bench needs {need / 1e9:.1f} GB there "
                             f"({copies:g} copies of a {scale} N1.6 of {checkpoint / 1e9:.2f} GB: its inputs, moto's "
                             "copies, the entries and what the loads keep); free space, or set TMPDIR to a larger disk")


def _loads(store, bucket: str, names: list[str], work: Path) -> dict:
    """One embodiment (new_embodiment) of the release, then of its fine-tune, loaded from the bucket into a machine
    whose local cache starts empty; beside each, the floor: the same chunk objects fetched by boto3 with as many
    requests in flight (16), in this process. And the bytes in which the two entries' chunks differ."""
    from concurrent.futures import ThreadPoolExecutor

    import boto3

    from pipeline.jobs.load import TRANSFERS, load
    from tasks.entries import reload
    from tasks.entries.entry import open_entry

    import torch  # noqa: F401  imported before the clock starts, as in any process that uses the tensors

    os.environ["GR00T_CACHE"] = str(work / "loader")  # another machine: nothing kept yet
    client = boto3.client("s3")
    bucket_name, prefix = bucket.removeprefix("s3://").split("/", 1)
    out, manifests = {}, []
    for what, name in zip(("release", "fine-tune"), names):
        t0 = time.perf_counter()
        got = load("n16", bucket, "new_embodiment", entry=name, synthetic=True)
        wall = time.perf_counter() - t0
        entry = open_entry(store, name)
        manifests.append(entry.manifest)
        keys = [entry.chunk_object(a, s) for a, s in reload.plan_reads(entry.manifest, got.slot)]
        t0 = time.perf_counter()
        with ThreadPoolExecutor(TRANSFERS) as pool:
            fetched = sum(pool.map(lambda k: len(client.get_object(Bucket=bucket_name, Key=f"{prefix}/{k}")["Body"].read()),
                                   keys))
        floor = time.perf_counter() - t0
        out[f"load {what} from the bucket"] = {"wall_s": round(wall, 2), "bytes_read": got.stats["bytes_read"],
                                                "bytes_fetched": got.stats["bytes_fetched"],
                                                "bytes_not_kept": got.stats.get("bytes_not_kept", 0),
                                                "not_kept_because": got.stats.get("not_kept_because"),
                                                "floor_boto3_s": round(floor, 2), "floor_bytes": fetched,
                                                "wall_over_floor": round(wall / floor, 2)}
        slot = got.slot
    release, tuned = manifests
    differ = 0
    for name, arr in tuned.arrays.items():
        for s, rec in arr.chunks.items():
            if s in (None, slot):
                before = release.arrays[name].chunks.get(s) if name in release.arrays else None
                differ += rec.nbytes if before is None or before.xxh3 != rec.xxh3 else 0
    out["bytes in which the two differ"] = differ
    return out


def _put_floor(store, local_root: Path, name: str, bucket_name: str, prefix: str) -> dict:
    """The floor of a convert into the bucket: the objects entry `name` put there (each distinct chunk and device
    file, and its manifest) put again by boto3 under another prefix, as many requests in flight as the store keeps
    (16), each object read from the same entry built in the local folder `local_root` as it is sent (a full-size
    entry held whole in memory beside moto's copy does not fit in this machine)."""
    from concurrent.futures import ThreadPoolExecutor

    import boto3

    from tasks.entries.entry import open_entry
    from tasks.entries.names import manifest_key
    from tasks.entries.store import IN_FLIGHT, LocalStore

    client = boto3.client("s3")
    there, here = open_entry(store, name), open_entry(LocalStore(local_root), name)
    files = {}
    for array, arr in there.manifest.arrays.items():
        for slot, rec in arr.chunks.items():
            files[rec.object] = here.store.path(here.chunk_object(array, slot))
            if rec.tensorbin is not None:
                files[rec.tensorbin.object] = here.store.path(here.device_object(array, slot))
    manifest = store.get(manifest_key(name))

    def put(item: tuple[str, Path | bytes]) -> int:
        key, what = item
        body = what if isinstance(what, bytes) else what.read_bytes()
        client.put_object(Bucket=bucket_name, Key=f"{prefix}/{key}", Body=body)
        return len(body)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(IN_FLIGHT) as pool:
        sent = sum(pool.map(put, [*files.items(), (manifest_key(name), manifest)]))
    return {"floor_boto3_s": round(time.perf_counter() - t0, 2), "objects": len(files) + 1, "bytes": sent}


def _rss() -> str:
    import resource

    return f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6:.1f} GB peak"


def _own_files(entry: Path) -> tuple[int, int]:
    """A local entry's chunks and device files that are its own (not hard links of another entry's): what a
    fine-tune changed. Their count and bytes."""
    from tasks.entries.names import MANIFEST
    from tasks.entries.zarr_v3 import METADATA

    own = [p for p in entry.rglob("*") if p.is_file() and p.name not in (METADATA, MANIFEST)
           and p.stat().st_nlink == 1]
    return len(own), sum(p.stat().st_size for p in own)


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m bench.bucket_finetune")
    ap.add_argument("--scale", default="tiny", choices=("tiny", "full"),
                    help="the synthetic N1.6's size (full: 6.57 GB; results go to bucket-finetune-full-results.json)")
    scale = ap.parse_args(argv).scale
    out = OUT if scale == "tiny" else OUT.with_name("bucket-finetune-full-results.json")
    work = Path(tempfile.mkdtemp(prefix="bench-bucket-"))
    check_disk(work, scale, copies=8)  # two inputs, moto's entries and floor, two local entries, the loads' kept bytes
    os.environ["GR00T_CACHE"] = str(work / "client")  # the client's own folder: the source memo only
    server = _moto()
    try:
        import boto3

        from pipeline.jobs.convert import ConvertOptions, convert
        from pipeline.model.state_dict import tensor_specs
        from pipeline.inputs.synth import synthesize
        from tasks.entries.object_stores import S3Store
        from tasks.entries.cache_root import open_store

        boto3.client("s3").create_bucket(Bucket="gr00t")
        head = frozenset(s.key for s in tensor_specs("n16", scale) if s.key.startswith("action_head."))
        release_hf, tuned_hf = work / "release-hf", work / "tuned-hf"
        synthesize("n16", release_hf, scale, seed=7)
        synthesize("n16", tuned_hf, scale, seed=7, mutate=head)
        sent: list[int] = []
        put, put_many = S3Store.put, S3Store.put_many
        S3Store.put = lambda self, k, d: (sent.append(len(d)), put(self, k, d))[1]
        S3Store.put_many = lambda self, o: (sent.extend(map(len, o.values())), put_many(self, o))[1]
        bucket = "s3://gr00t/cache"
        store = open_store(bucket)

        def run(hf: Path, root: str | Path) -> dict:
            before = store.sizes("")
            sent.clear()
            t0, c0 = time.perf_counter(), os.times()
            s = convert(ConvertOptions("n16", hf_cache=hf, synthetic=scale, cache_root=root, progress=False))
            wall, c1 = time.perf_counter() - t0, os.times()
            print(f"{hf.name} into {root}: {wall:.1f} s ({_rss()})", file=sys.stderr, flush=True)
            added = {k: n for k, n in store.sizes("").items() if k not in before}
            return {"wall_s": round(wall, 2), "cpu_s": round(c1.user - c0.user + c1.system - c0.system, 2),
                    "bytes_sent": sum(sent), "objects_added": len(added), "bytes_added": sum(added.values()),
                    "reused_chunks": s.get("reused_chunks", 0), "bytes_written": s.get("bytes_written", 0),
                    "entry": s["cache_path"].rstrip("/").rsplit("/", 1)[1]}

        rows = {"release into the bucket": run(release_hf, bucket),
                "fine-tune into the bucket": run(tuned_hf, bucket),
                "release into a local folder": run(release_hf, work / "local"),
                "fine-tune into a local folder": run(tuned_hf, work / "local")}
        changed = rows["fine-tune into a local folder"]["bytes_written"]
        tuned_entry = work / "local" / "entries" / rows["fine-tune into a local folder"]["entry"]
        changed_objects, changed_bytes = _own_files(tuned_entry)
        assert changed_bytes == changed
        print(f"converts done ({_rss()}); the floor of the release's convert", file=sys.stderr, flush=True)
        puts = _put_floor(store, work / "local", rows["release into the bucket"]["entry"], "gr00t", "floor")
        print(f"floor done ({_rss()}); loads", file=sys.stderr, flush=True)
        beyond = rows["release into the bucket"]["wall_s"] - rows["release into a local folder"]["wall_s"]
        puts["convert into the bucket beyond into a folder, s"] = round(beyond, 2)
        puts["... over the boto3 floor"] = round(beyond / puts["floor_boto3_s"], 2)
        loads = _loads(store, bucket, [rows["release into the bucket"]["entry"], rows["fine-tune into the bucket"]["entry"]],
                       work)
        result = {"measured": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": f"{os.cpu_count()} cores", "command": f"python -m bench.bucket_finetune --scale {scale}",
                  "rows": rows, "loads": loads, "release put by boto3": puts, "changed_targets_bytes": changed,
                  "changed_targets_objects": changed_objects,
                  "bytes_sent_over_changed": round(rows["fine-tune into the bucket"]["bytes_sent"] / changed, 3),
                  "objects_added_beyond_changed": rows["fine-tune into the bucket"]["objects_added"] - changed_objects}
        result["scale"] = scale
        tuned_load, differ = loads["load fine-tune from the bucket"], loads["bytes in which the two differ"]
        result["fine_tune_load_fetched_over_differ"] = round(tuned_load["bytes_fetched"] / differ, 3)
        result["verdicts"] = {
            "the fine-tune's load fetches <= 1.05x the bytes in which the two entries differ":
                result["fine_tune_load_fetched_over_differ"] <= 1.05,
            "the disk had room: every load kept what it fetched":
                all(row["bytes_not_kept"] == 0 for key, row in loads.items() if key.startswith("load ")),
            "the fine-tune sends <= 1.05x its changed targets' bytes": result["bytes_sent_over_changed"] <= 1.05}
        out.write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps(result, indent=1))
        for goal, met in result["verdicts"].items():
            print(f"{'MET   ' if met else 'NOT MET'} {goal}")
    finally:
        server.terminate()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
