"""The built graph's structure: per-key shard dependencies, slot fan-out, JSON export."""

from __future__ import annotations

import json
import os
import threading

import pytest

from pipeline.jobs.convert import ConvertOptions, convert
from pipeline.model.recipe import build_plan
from tasks.io import file_blocks
from tasks.source.checkpoint import Checkpoint
from pipeline.jobs.graph import PUBLISH, ancestors
from tasks.plan import work_units
from pipeline.model.state_dict import straddling_unit
from pipeline.commands.render import graph_for, graph_json, unit_summary
from pipeline.model.versions import VERSIONS


def _graph(hf_cache, cache_root, version, embodiments="all"):
    return graph_for(ConvertOptions(version, embodiments=embodiments, hf_cache=hf_cache, synthetic="tiny", cache_root=cache_root))[0]


@pytest.mark.parametrize("version", VERSIONS)
def test_only_the_straddling_unit_depends_on_two_shards(hf_cache, cache_root, version):
    graph = _graph(hf_cache, cache_root, version)
    units = [k for k in graph if k[0] == "unit"]
    assert len(units) > 50
    two = []
    for unit in units:
        shards = {k[1] for k in ancestors(graph, unit) if k[0] == "verify"}
        indexed = {k[1] for k in ancestors(graph, unit) if k[0] == "index"}
        assert shards == indexed and len(shards) in (1, 2), unit
        if len(shards) == 2:
            two.append(unit[1])
    assert two == [straddling_unit(version)]


def test_every_read_depends_on_the_index_of_its_own_shard(hf_cache, cache_root, snapshots):
    graph = _graph(hf_cache, cache_root, "n16")
    with Checkpoint(snapshots["n16"]) as ck:
        reads = [k for k in graph if k[0] in ("read", "slot")]
        assert reads
        for key in reads:
            assert {d for d in graph[key].dependencies} == {("index", ck.shard_of(key[1]))}
        for key in (k for k in graph if k[0] == "unit"):  # units wait for exactly their own shards' verification
            direct = {d[1] for d in graph[key].dependencies if d[0] == "verify"}
            assert direct == {ck.shard_of(k) for k in ck.keys() if k.startswith(key[1] + ".")}, key


def test_all_slots_fan_out_into_448_slot_reads(hf_cache, cache_root):
    graph = _graph(hf_cache, cache_root, "n17")
    slot_reads = [k for k in graph if k[0] == "slot"]
    assert len(slot_reads) == 14 * 32
    assert not any(k[0] == "read" and k[1].endswith((".W", ".b")) and "coder" in k[1] for k in graph)


@pytest.mark.parametrize("selection,slots", [("gr1,new_embodiment", {20, 10}), ("3", {3}), ("gr1,20", {20})])
def test_slot_selection_by_tag_and_id(hf_cache, cache_root, selection, slots):
    graph = _graph(hf_cache, cache_root, "n16", selection)
    got = {k[2] for k in graph if k[0] == "slot"}
    assert got == slots and len([k for k in graph if k[0] == "slot"]) == 14 * len(slots)


def test_json_export_lists_every_task_with_its_dependencies(hf_cache, cache_root):
    graph = _graph(hf_cache, cache_root, "n16")
    doc = json.loads(json.dumps(graph_json(graph)))
    tasks = {tuple(t["key"]): {tuple(d) for d in t["deps"]} for t in doc["tasks"]}
    assert len(tasks) == len(graph) and tuple(PUBLISH) in tasks
    unit = ("unit", "action_head.model.transformer_blocks.18")
    stages = [d for d in tasks[unit] if d[0] == "stage"]
    assert len(stages) == 14  # 14 tensors, none fused (tt-n16: the port keeps q, k and v apart)
    assert {d for d in tasks[unit] if d[0] != "stage"} == {("verify", "model-00001-of-00002.safetensors"),
                                                          ("verify", "model-00002-of-00002.safetensors")}
    summary = unit_summary(graph)
    assert summary["action_head.model.transformer_blocks.18"]["shards"] == ["model-00001-of-00002.safetensors",
                                                                             "model-00002-of-00002.safetensors"]


def test_with_an_open_device_each_target_uploads_right_after_staging(hf_cache, cache_root):
    from dataclasses import replace

    from pipeline.jobs.graph import build_graph
    from pipeline.commands.render import graph_inputs

    inputs = graph_inputs(ConvertOptions("n17", embodiments="new_embodiment", hf_cache=hf_cache, synthetic="tiny", cache_root=cache_root))
    graph = build_graph(replace(inputs, device=object()))  # wiring only: nothing runs, no hardware needed
    uploads = [k for k in graph if k[0] == "upload"]
    stages = [k for k in graph if k[0] == "stage"]
    assert len(stages) == len(inputs.plan.targets)
    assert len(uploads) == sum(not t.host for t in inputs.plan.targets) > 900  # host-only targets stay on the host
    for key in uploads:
        assert set(graph[key].dependencies) == {("stage", *key[1:]), ("convert", *key[1:])}
    unit = ("unit", "action_head.model.transformer_blocks.19")
    assert {d[0] for d in graph[unit].dependencies} == {"upload", "verify"}


def test_a_one_embodiment_conversion_reads_only_that_slot_of_each_bank(hf_cache, cache_root, snapshots, monkeypatch):
    """The slot-bytes guarantee on the path production takes: a real convert (the Dask graph, threads), every
    positioned read recorded: at the system call, and each span read from a shard's mapping (a converted source,
    such as a bf16 host table widened; the snapshot's sha256 pass reads whole shards, no span). Each bank's bytes
    read are exactly its slot's byte range."""
    from tasks.source import shards

    reads, lock, preadv, each_block = [], threading.Lock(), os.preadv, shards.each_block

    def recording(fd, buffers, offset):
        n = preadv(fd, buffers, offset)
        with lock:
            reads.append((os.path.realpath(f"/proc/self/fd/{fd}"), offset, n))
        return n

    def mapped(path, consume, block=file_blocks.BLOCK, span=None):
        if span is not None:
            with lock:
                reads.append((os.path.realpath(path), span[0], span[1] - span[0]))
        return each_block(path, consume, block, span)

    monkeypatch.setattr(os, "preadv", recording)
    monkeypatch.setattr(shards, "each_block", mapped)
    summary = convert(ConvertOptions("n16", embodiments="gr1", hf_cache=hf_cache, synthetic="tiny",
                                     cache_root=cache_root, progress=False))
    slot = summary["slots"][0]
    with Checkpoint(snapshots["n16"]) as ck:
        plan = build_plan("n16", {k: ck.shape(k) for k in ck.keys()}, layout="tt-n16")
        banks = sorted({k for t in plan.targets if t.embodiment for k in t.sources})
        assert len(banks) == 14 and all(k.startswith("action_head.") and ck.shape(k)[0] == 32 for k in banks)
        for key in banks:
            header, entry = ck.headers[ck.shard_of(key)], ck.info(key)
            start = header.data_start + entry.start
            per_slot = entry.nbytes // 32
            touched = [(o, n) for path, o, n in reads if path == os.path.realpath(header.path)
                       and o < start + entry.nbytes and o + n > start]
            assert touched == [(start + slot * per_slot, per_slot)], key
    assert sum(n for _, _, n in reads) == summary["bytes_read"]


def test_an_error_returns_only_once_the_tasks_already_running_have_finished(tmp_path):
    """convert removes the entry being built when the graph fails; a task still running would write into it after
    the removal (a flaky leftover directory before this). The run waits for running tasks before raising."""
    import time

    from pipeline.jobs.run import run

    started = threading.Event()

    def slow_writer():
        started.set()
        time.sleep(0.5)
        (tmp_path / "written late").write_text("x")

    def failing():
        started.wait(5)
        raise RuntimeError("verify failed")

    graph = {"slow": (slow_writer,), "fail": (failing,), "both": (lambda a, b: None, "slow", "fail")}
    with pytest.raises(RuntimeError, match="verify failed"):
        run(graph, "both", "threads", workers=2, progress=False)
    assert (tmp_path / "written late").exists()


def test_a_shard_is_hashed_again_only_when_nothing_before_checked_what_is_read_from_it(hf_cache, cache_root):
    """The verify node of a shard: what this run hashed to name the entry (unless --sha256 asks for its sha256);
    what an earlier entry of the same shard identity recorded, when nothing is converted from it; else a task."""
    from dataclasses import replace

    from dask.task_spec import DataNode

    from pipeline.commands.render import graph_inputs
    from pipeline.jobs.graph import build_graph
    from tasks.source.shards import VerifiedShard

    inputs = graph_inputs(ConvertOptions("n16", embodiments="gr1", hf_cache=hf_cache, synthetic="tiny",
                                         cache_root=cache_root))
    ck = inputs.checkpoint
    first, second = sorted(ck.headers)
    head = next(t for t in inputs.plan.targets if ck.shard_of(t.sources[0]) == second)

    def hashed(**given) -> set[str]:
        graph = build_graph(replace(inputs, **given))
        return {s for s in ck.headers if isinstance(graph[("verify", s)], DataNode)}

    assert hashed() == set()  # an HF snapshot: every shard checked against its blob name
    identified = {s: {k: "x" for k in ck.headers[s].entries} for s in ck.headers}
    assert hashed(identified=identified) == {first, second}
    assert hashed(identified=identified, record_sha256=True) == set()
    known = {s: VerifiedShard(ck.headers[s], None, identified[s]) for s in ck.headers}
    assert hashed(known=known) == set()  # both are converted from
    done = {(t.name, slot): None for t, slot in work_units(inputs.plan.targets, inputs.slots)
            if ck.shard_of(t.sources[0]) == first and all(ck.shard_of(k) == first for k in t.sources)}
    assert hashed(known=known, done=done) == {first} and (head.name, None) not in done
    assert hashed(known=known, done=done, record_sha256=True) == set()  # its sha256 is not known


def test_linear_chains_run_as_one_task_each_and_every_link_is_still_timed():
    """In this process a chain of tasks, each taken by the next alone, runs as one task under its last key, with
    the graph's constants its links take (where the entry goes); a task two others take, a task taking two, and a
    constant stay as they are. The result is Dask's own on the graph as built, and each link is counted under its
    stage."""
    import dask
    from dask.task_spec import DataNode, Task, TaskRef

    from pipeline.jobs.chains import StageSeconds, fuse_chains

    def add(*xs):
        return sum(xs)

    graph = {("index", 0): Task(("index", 0), add, 1),                        # taken by two reads
             ("read", "a"): Task(("read", "a"), add, TaskRef(("index", 0)), 10),
             ("read", "b"): Task(("read", "b"), add, TaskRef(("index", 0)), 20),
             ("convert", "a"): Task(("convert", "a"), add, TaskRef(("read", "a")), 100),
             ("place",): DataNode(("place",), 1000),                            # where every stage writes
             ("stage", "a"): Task(("stage", "a"), add, TaskRef(("convert", "a")), TaskRef(("place",))),
             ("stage", "b"): Task(("stage", "b"), add, TaskRef(("read", "b")), TaskRef(("index", 0))),  # takes two
             ("stage", "c"): DataNode(("stage", "c"), 7),                        # staged by an earlier run
             ("unit", 0): Task(("unit", 0), add, TaskRef(("stage", "a")), TaskRef(("stage", "b")),
                               TaskRef(("stage", "c"))),
             ("publish",): Task(("publish",), add, TaskRef(("unit", 0)))}
    timed = StageSeconds()
    fused = fuse_chains(graph, ("publish",), timed)
    assert set(fused) == {("index", 0), ("read", "b"), ("place",), ("stage", "a"), ("stage", "b"), ("stage", "c"),
                          ("publish",)}
    assert dask.get(fused, ("publish",)) == dask.get(graph, ("publish",)) == 1111 + (21 + 1) + 7
    assert dict(timed.counts) == {"index": 1, "read": 2, "convert": 1, "stage": 2, "unit": 1, "publish": 1}


def test_every_target_of_a_real_graph_runs_as_one_task_into_a_folder_or_a_bucket(hf_cache, cache_root):
    """The stage task takes where the entry goes as one value of the graph (tasks/places.py), and still runs inside
    its target's chain: no transform or convert task is left after fusing, and one stage task per target and slot,
    wherever the entry goes."""
    from dataclasses import replace

    from dask.task_spec import Task

    from pipeline.commands.render import graph_inputs
    from pipeline.jobs.chains import StageSeconds, fuse_chains
    from pipeline.jobs.graph import build_graph
    from tasks.places import InBucket

    inputs = graph_inputs(ConvertOptions("n17", hf_cache=hf_cache, synthetic="tiny", cache_root=cache_root))
    bucket = InBucket("s3://bucket/cache", inputs.identity.name, 30.0, {"objects/one": (1, 0.0)}, 0.0)
    for place in (inputs.place, bucket):
        graph = build_graph(replace(inputs, place=place))
        fused = fuse_chains(graph, PUBLISH, StageSeconds())
        stages = [k for k, node in graph.items() if k[0] == "stage" and isinstance(node, Task)]
        assert {k[0] for k in fused} & {"transform", "convert"} == set(), type(place).__name__
        assert len([k for k in fused if k[0] == "stage"]) == len(stages) > 1000


def test_the_threads_scheduler_takes_a_thread_per_thread_bytes_of_what_it_reads(hf_cache, tmp_path, monkeypatch):
    """A tiny plan runs on one thread of the pool (more would cost more than they overlap); a plan of more than
    THREAD_BYTES per thread on more, up to one more than the cores. Seen from the tasks: the threads that ran them."""
    import pipeline.jobs.graph
    import pipeline.jobs.run

    ran_on, apply, default = set(), pipeline.jobs.graph.apply, pipeline.jobs.run.THREAD_BYTES

    def noting_the_thread(*args):
        ran_on.add(threading.get_ident())
        return apply(*args)

    monkeypatch.setattr(pipeline.jobs.graph, "apply", noting_the_thread)
    seen = {}
    for thread_bytes in (default, 1):
        monkeypatch.setattr(pipeline.jobs.run, "THREAD_BYTES", thread_bytes)
        ran_on.clear()
        done = convert(ConvertOptions("n17", embodiments="all", hf_cache=hf_cache, synthetic="tiny",
                                      cache_root=tmp_path / str(thread_bytes), progress=False))
        assert done["bytes_read"] < default  # a tiny plan
        seen[thread_bytes] = len(ran_on)
    assert seen[default] == 1 and 1 < seen[1] <= (os.cpu_count() or 2) + 1
