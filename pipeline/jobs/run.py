"""Run a graph on one of four schedulers — the same graph on each — with progress and per-stage timings.

`sync` runs in this thread (plain tracebacks, pdb works), `threads` (default) uses Dask's threaded scheduler (the
heavy work — preadv, numpy copies, ttnn packing — releases the GIL), `processes` starts a local dask.distributed
cluster, and a `tls://host:port` (or `tcp://host:port`) address uses an existing one.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Hashable, Iterable, Mapping

import dask
import dask.threaded
from dask.callbacks import Callback
from dask.diagnostics import ProgressBar

from pipeline.jobs.chains import StageSeconds, fuse_chains, handed_back
from tasks.errors import CacheError, ConfigError, PipelineError
from tasks.io.file_blocks import is_remote
from tasks.entries.object_stores import ObjectStore
from tasks.io.network import retries_so_far

TLS_SETTINGS = ("ca-file", "client.cert", "client.key")
EXPECTED = "expected threads, sync, processes, or a running cluster's tls://host:port (or tcp://host:port) address"


class LogProgress(Callback):
    """Off a terminal (CI, logs, `make convert > log`): one line on stderr every `every` seconds, and at the end."""

    def __init__(self, every: float = 10.0) -> None:
        super().__init__()
        self.every, self.done, self.total = every, 0, 0
        self.t0 = self.last = time.perf_counter()

    def _start_state(self, dsk, state) -> None:
        self.total = len(dsk)
        self.t0 = self.last = time.perf_counter()

    def _posttask(self, key, result, dsk, state, worker_id) -> None:
        self.done += 1
        now = time.perf_counter()
        if now - self.last >= self.every:
            self.last = now
            print(f"progress: {self.done:,}/{self.total:,} tasks ({100 * self.done / max(1, self.total):.0f} %), "
                  f"{now - self.t0:.0f} s", file=sys.stderr, flush=True)

    def _finish(self, dsk, state, errored) -> None:
        if not errored and time.perf_counter() - self.t0 >= self.every:
            print(f"progress: {self.done:,}/{self.total:,} tasks done in {time.perf_counter() - self.t0:.0f} s",
                  file=sys.stderr, flush=True)


class _StopWhenAsked(Callback):
    """Starts no further task once `asked` is set (by a Ctrl-C in the main thread: `_off_the_main_thread`)."""

    def __init__(self, asked: threading.Event) -> None:
        super().__init__()
        self.asked = asked

    def _pretask(self, key, dsk, state) -> None:
        if self.asked.is_set():
            raise KeyboardInterrupt


def _off_the_main_thread(scheduler_loop: Callable[[], object]) -> object:
    """Run the threads scheduler's loop on a thread of its own, the main thread waiting in `Thread.join`, which
    cleans up after a Ctrl-C. In the loop's own wait (`queue.get`), a Ctrl-C that lands inside the queue's
    Condition once it holds its lock leaves it held, and every task thread then waits forever to report back. On
    Ctrl-C no further task starts, and the interrupt is raised once the loop has stopped; had it finished, its
    result stands (what it published is published)."""
    outcome: dict[str, object] = {}
    asked_to_stop = threading.Event()

    def loop() -> None:
        try:
            outcome["result"] = scheduler_loop()
        except BaseException as e:  # handed to the main thread, which raises it
            outcome["error"] = e

    helper = threading.Thread(target=loop, name="dask-scheduler-loop", daemon=True)
    with _StopWhenAsked(asked_to_stop):  # registered before the loop starts: Dask reads its callbacks then
        helper.start()
        try:
            helper.join()
        except KeyboardInterrupt:
            asked_to_stop.set()
            helper.join()
            if "result" not in outcome:
                raise
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def _summed(timings: Iterable[tuple[dict[str, float], dict[str, int]]]) -> tuple[dict, dict]:
    """Every worker's seconds and task counts per stage, added up."""
    seconds, counts = Counter(), Counter()
    for worker_seconds, worker_counts in timings:
        seconds.update(worker_seconds)
        counts.update(worker_counts)
    return dict(seconds), dict(counts)


def _worker_retries(client, before: Mapping[str, dict]) -> dict[str, int]:
    """The requests a cluster's workers tried again since `before` (each worker's `retries_so_far`), summed; a
    worker that died meanwhile took its count with it."""
    total: dict[str, int] = defaultdict(int)
    for worker, counts in client.run(retries_so_far).items():
        for fault, n in counts.items():
            total[fault] += n - before.get(worker, {}).get(fault, 0)
    return {k: n for k, n in sorted(total.items()) if n > 0}


def _missing_here(paths: list[str]) -> list[str]:
    """On a worker: which of the client's folders it cannot see."""
    return [p for p in paths if not os.path.isdir(p)]


def shared_folders(source: Path, entry: Path | None = None) -> dict[str, str]:
    """The folders a cluster's workers must see, each with what to do when they cannot (a checkpoint in an object
    store is read from there by every worker, and an entry built in one is put there by them)."""
    shared = {} if is_remote(source) else {
        str(source): "put the checkpoint where every worker can read it at the same path (a shared filesystem) or "
                     "in the object store (--snapshot s3://bucket/prefix), or convert with --scheduler threads"}
    if entry is not None:
        shared[str(entry)] = ("a cache folder is this machine's own: pass an object-store cache (--cache "
                              "s3://bucket/prefix), which the workers write to themselves, or a cache folder on a "
                              "filesystem they share")
    return shared


def _cannot_reach(url: str, stall: float) -> str | None:
    """On a worker: why it cannot use the object store at `url` with the credentials it has, or None. One listing
    of a single key (retried as every request is: tasks/io/network.py)."""
    from tasks.entries.cache_root import store_at

    try:
        store_at(url, stall).children("refs")
    except PipelineError as e:
        return str(e)
    return None


def check_workers_reach(client, scheduler: str, store_url: str, stall: float) -> None:
    """Every worker of a cluster must reach the object store the entry goes into, with its own credentials (a
    worker has its own environment: credentials exported in the client's shell are not there); one sentence
    naming the worker before any task runs, never a worker's error under a traceback."""
    failing = {worker: said for worker, said in client.run(_cannot_reach, store_url, stall).items() if said}
    if failing:
        worker, said = sorted(failing.items())[0]
        raise CacheError(f"the Dask worker {worker} of {scheduler} cannot use {store_url} ({len(failing)} of the "
                         f"workers cannot): {said.removeprefix(store_url + ': ')}; give every worker the store's "
                         "credentials and endpoint in its own environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, "
                         "AWS_ENDPOINT_URL) and start it again")


def check_workers_see(client, scheduler: str, shared: Mapping[str, str]) -> None:
    """Every worker of a cluster must see the folders the graph names (`shared`: folder -> what to say when one
    cannot: the remedy); one sentence before any task runs, never a worker's FileNotFoundError."""
    missing = {worker: gone for worker, gone in client.run(_missing_here, list(shared)).items() if gone}
    if missing:
        worker, gone = sorted(missing.items())[0]
        raise CacheError(f"{gone[0]}: the Dask worker {worker} of {scheduler} cannot see this folder "
                         f"({len(missing)} of the workers cannot); {shared[gone[0]]}")


@dataclass(frozen=True)
class _Job:
    """One run of a graph, as every scheduler takes it."""
    graph: Mapping
    key: Hashable
    scheduler: str
    workers: int
    progress: bool
    shared: Mapping[str, str] | None  # folders every worker of a cluster must see, each with the remedy to name
    store: ObjectStore | None         # the object store every worker of a cluster must reach


def _in_this_process(job: _Job, compute: Callable[[dict], object]) -> tuple[object, dict]:
    """`compute(graph)` of the job's graph, its linear chains fused (pipeline/jobs/chains.py), each link timed, under
    a progress display."""
    timed = StageSeconds()
    graph = fuse_chains(job.graph, job.key, timed)
    # A redrawn bar only makes sense on a terminal; in logs and CI it would print hundreds of lines.
    bar = (ProgressBar(out=sys.stderr, minimum=1.0, dt=0.5) if sys.stderr.isatty() else LogProgress()) \
        if job.progress else Callback()
    with bar:
        result = compute(graph)
    return result, {"stage_seconds": dict(timed.seconds), "stage_tasks": dict(timed.counts)}


def _run_sync(job: _Job) -> tuple[object, dict]:
    return _in_this_process(job, lambda graph: dask.get(graph, job.key))


def _run_threads(job: _Job) -> tuple[object, dict]:
    def compute(graph: dict) -> object:
        pool = ThreadPoolExecutor(job.workers)
        gc.freeze()  # what lives through the run (graph, plan, headers): not walked again by every collection
        try:
            return _off_the_main_thread(
                lambda: dask.threaded.get(graph, job.key, num_workers=job.workers, pool=pool))
        finally:
            gc.unfreeze()
            # On an error Dask raises at once while other tasks still run: wait for those (and drop the queued
            # ones), so that the caller's cleanup of the entry being built never races a task writing into it.
            pool.shutdown(wait=True, cancel_futures=True)

    return _in_this_process(job, compute)


def _run_processes(job: _Job) -> tuple[object, dict]:
    from distributed import LocalCluster  # lazy: distributed takes ~1 s to import, and only two schedulers use it

    cluster = LocalCluster(n_workers=min(job.workers, 2), threads_per_worker=1, processes=True,
                           dashboard_address=":0" if job.progress else None)
    try:
        if job.progress and cluster.dashboard_link:
            print(f"dask dashboard: {cluster.dashboard_link}", file=sys.stderr, flush=True)
        return _on_client(job, cluster)
    finally:
        cluster.close()


def _run_on_cluster(job: _Job) -> tuple[object, dict]:
    return _on_client(job, job.scheduler, remote=True)


def _on_client(job: _Job, cluster, remote: bool = False) -> tuple[object, dict]:
    """The graph on a dask.distributed cluster. `remote`: its workers are other machines, which are asked first
    whether they see the shared folders and reach the store."""
    from distributed import Client, progress as dist_progress

    client = Client(cluster)
    try:
        if remote and job.shared:
            check_workers_see(client, job.scheduler, job.shared)
        if remote and job.store is not None:
            check_workers_reach(client, job.scheduler, job.store.url, job.store.stall)
        retried_before = client.run(retries_so_far)
        timed = StageSeconds()
        future = client.get(fuse_chains(job.graph, job.key, timed), job.key, sync=False)
        if job.progress and sys.stderr.isatty():
            with contextlib.redirect_stdout(sys.stderr):  # distributed's bar writes to stdout
                dist_progress(future)
        elif job.progress:
            t0 = time.perf_counter()
            while not future.done():
                time.sleep(0.2)
                if time.perf_counter() - t0 >= 10 and int(time.perf_counter() - t0) % 10 == 0:
                    print(f"progress: running on {job.scheduler}, {time.perf_counter() - t0:.0f} s",
                          file=sys.stderr, flush=True)
                    time.sleep(0.8)
        result = client.gather(future)
        seconds, counts = _summed(client.run(handed_back, timed.run).values())
        return result, {"stage_seconds": seconds, "stage_tasks": counts,
                        "worker_retries": _worker_retries(client, retried_before)}
    finally:
        client.close()


# Each scheduler, by name or by the scheme of a running cluster's address. A running cluster's scheduler: tls://
# takes its certificates from dask's own configuration (distributed.comm.tls.*, or DASK_DISTRIBUTED__COMM__TLS__* in
# the environment), as `dask scheduler --tls-*` does; tcp:// lets anyone who reaches the address run code on the
# workers.
SCHEDULERS: dict[str, Callable[[_Job], tuple[object, dict]]] = {
    "threads": _run_threads, "sync": _run_sync, "processes": _run_processes,
    "tls://": _run_on_cluster, "tcp://": _run_on_cluster,
}
IN_PROCESS = ("threads", "sync")  # the schedulers that run every task in this process
CLUSTER_SCHEMES = tuple(name for name in SCHEDULERS if name.endswith("://"))


def _scheduler(scheduler: str) -> Callable[[_Job], tuple[object, dict]] | None:
    if scheduler.startswith(CLUSTER_SCHEMES):
        return SCHEDULERS[scheduler[:scheduler.index("://") + 3]]
    return SCHEDULERS.get(scheduler)


def run(graph: Mapping, key: Hashable, scheduler: str = "threads", workers: int | None = None,
        progress: bool = True, shared: Mapping[str, str] | None = None,
        store: ObjectStore | None = None, work_bytes: int | None = None) -> tuple[object, dict]:
    """Compute `key` of `graph` on `scheduler` (SCHEDULERS); returns (result, {"stage_seconds", "stage_tasks"}, and
    for a dask.distributed one "worker_retries"). `shared`: folders every worker of a cluster must see, each with the
    remedy to name when one cannot; `store`: the object store every worker must reach; `work_bytes`: what the
    graph reads from this machine into this machine, which bounds the threads scheduler's threads (THREAD_BYTES
    each)."""
    runner = _scheduler(scheduler)
    if runner is None:
        raise ConfigError(f"unknown scheduler {scheduler!r}: {EXPECTED}")
    return runner(_Job(graph, key, scheduler, workers or _default_workers(scheduler, work_bytes), progress, shared,
                       store))


# A thread of the threads scheduler for at least this much to read: below it, threads cost more than they overlap
# (their hand-offs and the GIL passed between them). A tiny N1.7 of every slot (8 MB to read): 1.60-1.75 s and 1.5-1.7
# CPU-s on one thread, 1.94-1.96 s and 2.1 CPU-s on three.
THREAD_BYTES = 32 << 20


def _default_workers(scheduler: str, work_bytes: int | None) -> int:
    # One thread more than the cores: a stage task waits for the disk part of the time, and a core would idle
    # meanwhile (the full N1.6 port plan on 2 cores ran fastest with 3 threads; 4 held more memory for no gain).
    workers = (os.cpu_count() or 2) + 1
    if scheduler == "threads" and work_bytes is not None:
        workers = min(workers, max(1, work_bytes // THREAD_BYTES))
    return workers


def check_scheduler(scheduler: str) -> None:
    """Refuse an unknown scheduler before anything is read, built or replaced."""
    if _scheduler(scheduler) is None:
        raise ConfigError(f"unknown scheduler {scheduler!r}: {EXPECTED}")
    if scheduler.startswith("tls://"):  # say now, not as distributed's TypeError about an ssl_context
        import distributed.config  # noqa: F401 (its defaults, under the configuration read from the environment)

        unset = [k for k in TLS_SETTINGS if not dask.config.get(f"distributed.comm.tls.{k}", None)]
        if unset:
            raise ConfigError(f"--scheduler {scheduler}: dask's configuration names no TLS certificates "
                              f"(distributed.comm.tls.{unset[0]} is not set); set DASK_DISTRIBUTED__COMM__TLS__CA_FILE, "
                              "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT and DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY "
                              "(or the same in ~/.config/dask/), the files `dask scheduler --tls-*` was given")
    if scheduler.startswith(CLUSTER_SCHEMES):  # say now, not after distributed's 30 s connect timeout
        import socket

        host, _, port = scheduler.partition("://")[2].rpartition(":")
        try:
            socket.create_connection((host or "127.0.0.1", int(port)), timeout=3).close()
        except (OSError, ValueError) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e) or type(e).__name__
            raise ConfigError(f"--scheduler {scheduler}: no Dask scheduler answers there ({reason}); start one "
                              "(`dask scheduler`) or use --scheduler threads") from None
