"""A graph's linear chains run as one task each.

Most of a conversion is chains: a target's ("read", key) -> ("transform", t) -> ("convert", t) -> ("stage", t), where
each task's result is taken by the next one alone and the next takes nothing else. Every scheduler pays for each
task it runs: Dask's local ones a hand-off to a pool thread and back (two context switches, the GIL each way),
dask.distributed a round of messages between its scheduler and a worker. Run as one task per chain, a tiny N1.7 of
every slot is 1,561 tasks instead of 5,953.

Only the run fuses: the graph keeps every named task (`make graph`, `inspect`, the tests), and each link is still
timed and counted as its own stage (`StageSeconds`). Dask's own `fuse_linear_task_spec` leaves an `Alias` node per
fused key, which the local schedulers still run, and names the fused task after its whole chain.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict
from typing import Hashable, Mapping

from dask._task_spec import Dict, convert_legacy_graph  # not in dask.task_spec's public names
from dask.task_spec import DataNode, GraphNode, Task, TaskRef


_RUNS: dict[str, StageSeconds] = {}  # each run's timings in a process its fused tasks were sent to


class StageSeconds:
    """Seconds spent per stage (the first element of each task key) and tasks run, summed over every thread.

    Sent to a dask.distributed worker inside a fused task, it arrives as that worker's own timings of the same run,
    which `handed_back` returns (`client.run`) once the run is over."""

    def __init__(self, run: str | None = None) -> None:
        self.run = run or uuid.uuid4().hex
        self.seconds: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)
        self._lock = threading.Lock()

    def __reduce__(self) -> tuple:
        return _timings_of, (self.run,)

    def __dask_tokenize__(self) -> str:
        return self.run

    def add(self, key: Hashable, seconds: float) -> None:
        stage = key[0] if isinstance(key, tuple) else str(key)
        with self._lock:
            self.seconds[stage] += seconds
            self.counts[stage] += 1


def _timings_of(run: str) -> StageSeconds:
    return _RUNS.setdefault(run, StageSeconds(run))


def handed_back(run: str) -> tuple[dict[str, float], dict[str, int]]:
    """The seconds and task counts this process timed for `run` (a worker's, asked by `client.run`), once."""
    timed = _RUNS.pop(run, None)
    return ({}, {}) if timed is None else (dict(timed.seconds), dict(timed.counts))


def _run_chain(links: tuple[GraphNode, ...], timed: StageSeconds, inputs: dict, constants: dict) -> object:
    """Each link in order, the first given the chain's inputs and each next the result before it and the graph's
    constants it names (and only those: what a link returned is let go as soon as the next one has run)."""
    values = inputs
    for link in links:
        started = time.perf_counter()
        result = link(values)
        timed.add(link.key, time.perf_counter() - started)
        values = {**constants, link.key: result}
    return result


def fuse_chains(graph: Mapping[Hashable, GraphNode], output: Hashable, timed: StageSeconds) -> dict:
    """`graph` with every linear chain as one task under its last link's key, each link timed into `timed`."""
    graph = convert_legacy_graph(graph)  # tuples as tasks (Dask's older form) become Task nodes, as Dask would do
    dependents: dict[Hashable, list[Hashable]] = defaultdict(list)
    for key, node in graph.items():
        for dependency in node.dependencies:
            dependents[dependency].append(key)

    def computed(node: GraphNode) -> list[Hashable]:
        """What a node takes from other tasks: a constant of the graph (where the entry goes) is no link."""
        return [d for d in node.dependencies if isinstance(graph.get(d), Task)]

    def runs_inside_its_dependent(key: Hashable) -> bool:
        taken_by = dependents[key]
        return (key != output and isinstance(graph[key], Task) and len(taken_by) == 1
                and len(computed(graph[taken_by[0]])) == 1)

    fused = {}
    for last, node in graph.items():
        if not isinstance(node, Task):  # a constant (a chunk staged before): the schedulers take it as a result
            fused[last] = node
            continue
        if runs_inside_its_dependent(last):
            continue
        links = [graph[last]]
        while len(computed(links[-1])) == 1:
            (below,) = computed(links[-1])
            if not runs_inside_its_dependent(below):
                break
            links.append(graph[below])
        links.reverse()
        constants = {key for link in links[1:] for key in link.dependencies if key not in computed(link)}
        fused[last] = Task(last, _run_chain, DataNode(None, tuple(links)), DataNode(None, timed),
                           Dict({key: TaskRef(key) for key in links[0].dependencies}),
                           Dict({key: TaskRef(key) for key in constants}))
    return fused
