"""The conversion graph: a plain dict of named Dask tasks. Wiring only; every function it calls lives in `tasks/`.

    ("index", shard) -> ("read", key) | ("slot", key, e) -> ("transform", target[, e]) -> ("convert", target[, e])
      -> ("stage", target[, e]) [-> ("upload", target[, e]) when a device is open] -> ("unit", unit) -> ("publish",)
    ("index", shard) -> ("verify", shard) -> ("unit", unit)   for every shard the unit reads from, and ("publish",)

Every read depends on the index task of the shard holding *that key*, and every unit on the verify tasks of the
shards its keys live in: a unit cut by a shard boundary depends on two shards, every other unit on one. Hashing
a shard (verify) runs alongside the reads instead of before them — it is the one pass that must see every byte,
and on two cores overlapping it with conversion saves its whole duration — while nothing can be published
before every unit, and so every shard, is verified. Embodiment banks fan out into one task chain per selected slot; each
slot task reads only its slot. Chunks a killed run already staged, or a fine-tune linked from an earlier entry
(and whose bytes still match their record), enter the graph as constants, so only the rest is redone; so do
shards a fine-tune's pre-pass already hashed.

Where the entry is built is one node, `("place",)` (tasks/places.py): a folder, published by rename, or an object
store, which each stage task puts its own objects into from whichever worker runs it, manifest last. The graph is the
same for both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Hashable, Mapping

from dask.task_spec import DataNode, List, Task, TaskRef  # the public names (dask >= 2025)

from tasks.source.checkpoint import Checkpoint
from tasks.errors import without_library_causes
from tasks.device.host_tensors import convert_target
from tasks.plan import Plan, Target, work_units
from tasks.device.ttnn_edge import upload_staged
from tasks.entries.publish import unit_done
from tasks.places import Place, publish, stage
from tasks.source.shards import VerifiedShard, index_shard, read_weight, read_weight_slot, verify_shard
from tasks.entries.manifest import Identity, Staged
from tasks.numerics.transforms import apply

Key = tuple
PUBLISH: Key = ("publish",)
PLACE: Key = ("place",)  # where the entry is built (tasks/places.py)


@dataclass(frozen=True, kw_only=True)
class GraphInputs:
    plan: Plan
    checkpoint: Checkpoint
    slots: tuple[int, ...]
    place: Place                                   # where the entry is built: a folder, or an object store
    expected_identity: Mapping[str, str | None]   # shard -> identity to verify against: HF blob sha256, or content id
    done: Mapping[tuple[str, int | None], Staged]  # chunks already staged by a killed run
    identity: Identity                             # what the publish step records the entry as
    arrays: Mapping[str, dict]                     # target -> its `zarr.json` document (created before the run)
    check_bf16: bool = False                       # also round-trip bf16 targets through ttnn
    # shard -> its tensors' hashes, as an earlier entry of the same shard identity recorded them (jobs/reuse.py)
    known: Mapping[str, VerifiedShard] = field(default_factory=dict)
    # shard -> its tensors' xxh3, hashed by this run to name the entry (pipeline/cache/sources.py)
    identified: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    device: object = None                          # an open ttnn device/mesh: adds ("upload", target) tasks
    record_sha256: bool = False                    # --sha256: take every shard's sha256, even where none is expected


def _task(key: Key, fn: Callable, *args: object) -> Task:
    # without_library_causes: a worker's PipelineError reaches the client as itself, one sentence (tasks/errors.py)
    return Task(key, without_library_causes, fn, *args)


def _origin(ck: Checkpoint, t: Target) -> str:
    """The shard file(s) a target's sources live in, for error messages."""
    return " + ".join(str(ck.shard_path(s)) for s in sorted({ck.shard_of(k) for k in t.sources}))


def _chain(graph: dict, t: Target, slot: int | None, inputs: GraphInputs, reads: list[TaskRef]) -> Key:
    suffix = () if slot is None else (slot,)
    stage_key = ("stage", t.name, *suffix)
    if (t.name, slot) in inputs.done and inputs.device is None:
        graph[stage_key] = DataNode(stage_key, inputs.done[(t.name, slot)])
        return stage_key
    transform_key, convert_key = ("transform", t.name, *suffix), ("convert", t.name, *suffix)
    graph[transform_key] = _task(transform_key, apply, t.transform, List(*reads), t.params)
    graph[convert_key] = _task(convert_key, convert_target, TaskRef(transform_key), DataNode(None, t), slot,  # the Target as one opaque value
                               inputs.check_bf16, _origin(inputs.checkpoint, t))
    graph[stage_key] = _task(stage_key, stage, TaskRef(PLACE), TaskRef(convert_key))
    if inputs.device is None or t.host:  # host-only targets are never uploaded
        return stage_key
    upload_key = ("upload", t.name, *suffix)  # uploads as soon as the target is staged, while others still convert
    graph[upload_key] = _task(upload_key, upload_staged, TaskRef(stage_key), TaskRef(convert_key), t.kind, inputs.device)
    return upload_key


def _hashed_before(inputs: GraphInputs, read_from: set[str]) -> dict[str, VerifiedShard]:
    """The shards whose verify task is what was hashed before the graph. One this run hashed moments ago to name
    the entry is checked by that pass (a second would compare the same bytes with themselves). One an earlier entry
    knows by its identity is trusted like a cache hit when nothing is converted from it. Neither, when its sha256 is
    asked for (--sha256) and not known."""
    known = {s: v for s, v in inputs.known.items() if s not in read_from and (v.sha256 or not inputs.record_sha256)}
    now = {} if inputs.record_sha256 else {
        s: VerifiedShard(inputs.checkpoint.headers[s], None, dict(hashes)) for s, hashes in inputs.identified.items()}
    return known | now


def build_graph(inputs: GraphInputs) -> dict[Hashable, Task]:
    """The whole conversion as `{key: task}`; run it for `PUBLISH`."""
    ck, graph = inputs.checkpoint, {}
    graph[PLACE] = DataNode(PLACE, inputs.place)  # one node: a worker is sent a store's listing once, not per task
    units: dict[str, list[TaskRef]] = {}
    unit_shards: dict[str, set[str]] = {}
    read_from: set[str] = set()  # the shards something is converted from
    for t, slot in work_units(inputs.plan.targets, inputs.slots):
        in_unit = units.setdefault(t.unit, [])
        shards = {ck.shard_of(k) for k in t.sources}
        unit_shards.setdefault(t.unit, set()).update(shards)
        if (t.name, slot) not in inputs.done:
            read_from.update(shards)
        reads = []
        for key in t.sources:
            indexed = TaskRef(("index", ck.shard_of(key)))
            read_key = ("read", key) if slot is None else ("slot", key, slot)
            if read_key not in graph and ((t.name, slot) not in inputs.done or inputs.device is not None):
                graph[read_key] = (_task(read_key, read_weight, indexed, key, t.host) if slot is None
                                   else _task(read_key, read_weight_slot, indexed, key, slot))
            reads.append(TaskRef(read_key))
        in_unit.append(TaskRef(_chain(graph, t, slot, inputs, reads)))
    hashed = _hashed_before(inputs, read_from)
    for shard, header in ck.headers.items():
        graph[("index", shard)] = _task(("index", shard), index_shard, header.path, ck.stored_keys(shard),
                                        ck.stored_names(shard))
        if shard in hashed:
            graph[("verify", shard)] = DataNode(("verify", shard), hashed[shard])
        else:
            graph[("verify", shard)] = _task(("verify", shard), verify_shard, TaskRef(("index", shard)),
                                             inputs.expected_identity.get(shard), inputs.record_sha256)
    for unit, staged in units.items():
        verified = List(*(TaskRef(("verify", s)) for s in sorted(unit_shards[unit])))
        graph[("unit", unit)] = _task(("unit", unit), unit_done, unit, List(*staged), verified)
    unit_refs = List(*(TaskRef(("unit", u)) for u in units))
    verified = List(*(TaskRef(("verify", s)) for s in sorted(ck.headers)))
    graph[PUBLISH] = _task(PUBLISH, publish, TaskRef(PLACE), DataNode(None, inputs.identity), dict(inputs.arrays),
                           unit_refs, verified)
    return graph


def dependencies(graph: Mapping[Hashable, Task]) -> dict[Hashable, frozenset]:
    """Direct dependencies of every task (for tests, JSON export and rendering)."""
    return {key: frozenset(task.dependencies) for key, task in graph.items()}


def ancestors(graph: Mapping[Hashable, Task], key: Hashable) -> set:
    deps, seen, todo = dependencies(graph), set(), [key]
    while todo:
        for d in deps[todo.pop()]:
            if d not in seen:
                seen.add(d)
                todo.append(d)
    return seen
