"""What the product promises on untrusted input and under faults, in one place.

Bad input: one clear error naming the file (and the key when there is one), exit status 2, no traceback, and no
cache entry published. Faults (kill -9, disk full, a dying worker, concurrent writers and readers): never a
published half-entry, and a later run produces the bytes of an uninterrupted one.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from pipeline import cache as cache_mod
from pipeline.cache import sources
from pipeline.commands.cli import main
from pipeline.jobs.convert import ConvertOptions, convert
from tasks.source.checkpoint import INDEX_NAME
from tasks.entries.entry import list_entries
from tasks.errors import CheckpointError, ConfigError, PipelineError
from tasks.entries.store import LocalStore
from tests.required import needs
from tests.progress import wait_until_staged

from tests.conftest import ROOT
S1, S2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
TABLE: list[tuple[str, str]] = []  # (case, error): printed at the end of the run by conftest


def _header(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def _write_header(path: Path, header: dict | bytes, data: bytes) -> None:
    body = header if isinstance(header, bytes) else json.dumps(header, separators=(",", ":")).encode()
    body += b" " * (-len(body) % 8)
    path.write_bytes(struct.pack("<Q", len(body)) + body + data)


def _by_offset(header: dict) -> list[str]:
    return sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])


def _edit(shard: str, fn):
    """A corruption that rewrites one shard's header: fn(header, keys by offset) -> header (or raw bytes)."""
    def corrupt(snap: Path) -> None:
        header, data = _header(snap / shard)
        _write_header(snap / shard, fn(header, _by_offset(header)), data)
    return corrupt


def _entry(i: int, field: str, value_fn):
    def fn(h, keys):
        h[keys[i]][field] = value_fn(h[keys[i]])
        return h
    return _edit(S1, fn)


def _rename(header: dict, old: str, new: str) -> dict:
    entry = header.pop(old)
    return {**header, new: entry}


def _index(fn):
    def corrupt(snap: Path) -> None:
        index = json.loads((snap / INDEX_NAME).read_text())
        fn(index)
        (snap / INDEX_NAME).write_text(json.dumps(index))
    return corrupt


def _bytes(shard: str, fn):
    return lambda snap: (snap / shard).write_bytes(fn((snap / shard).read_bytes()))


def _flip_last_data_byte(snap: Path) -> None:
    data = bytearray((snap / S2).read_bytes())
    data[-1] ^= 0x01
    (snap / S2).write_bytes(bytes(data))


def _nan_in(key_suffix: str):
    def corrupt(snap: Path) -> None:
        header, data = _header(snap / S2)
        key = next(k for k in header if k.endswith(key_suffix))
        start = header[key]["data_offsets"][0]
        data = bytearray(data)
        data[start:start + 2] = np.array([0x7FC0], np.uint16).tobytes()  # bf16 NaN
        _write_header(snap / S2, header, bytes(data))
    return corrupt


BAD_SNAPSHOTS = [  # (case, corruption, expected fragment, names a key)
    ("truncated in header", _bytes(S1, lambda b: b[:64]), "runs past the end of the", False),
    ("truncated in data", _bytes(S2, lambda b: b[:-10]), "is past the end of the data", True),
    ("header length 2^63", _bytes(S1, lambda b: struct.pack("<Q", 2**63) + b[8:]), "exceeds the 104857600-byte cap", False),
    ("header length past EOF", _bytes(S1, lambda b: struct.pack("<Q", len(b)) + b[8:]), "runs past the end of the", False),
    ("header not UTF-8", _edit(S1, lambda h, k: b"\xff\xfe\xfd"), "header is not UTF-8", False),
    ("header JSON not an object", _edit(S1, lambda h, k: b'"a string"'), "header must be a JSON object, found str", False),
    ("__metadata__ not a dict of strings", _edit(S1, lambda h, k: {**h, "__metadata__": {"format": ["pt"]}}),
     "__metadata__ must be an object of strings", True),
    ("data_offsets reversed", _entry(1, "data_offsets", lambda e: e["data_offsets"][::-1]), "are reversed or negative", True),
    ("data_offsets overlapping", _entry(1, "data_offsets", lambda e: [o - 2 for o in e["data_offsets"]]),
     "overlaps the previous tensor", True),
    ("data_offsets leaving a gap", _entry(1, "data_offsets", lambda e: [o + 2 for o in e["data_offsets"]]),
     "leaves a gap of 2 bytes", True),
    ("data_offsets out of range", _entry(-1, "data_offsets", lambda e: [e["data_offsets"][0], 10**12]),
     "data_offsets span", True),
    ("shape x dtype != span", _entry(0, "shape", lambda e: [e["shape"][0] + 1, *e["shape"][1:]]), "needs", True),
    ("unknown dtype", _entry(0, "dtype", lambda e: "Q7"), "unknown dtype 'Q7'", True),
    ("negative shape", _entry(0, "shape", lambda e: [-1, *e["shape"][1:]]), "shape must be a list of non-negative integers", True),
    ("non-integer shape", _entry(0, "shape", lambda e: ["2", *e["shape"][1:]]), "shape must be a list of non-negative integers", True),
    ("key in two shards", _edit(S2, lambda h, k: _rename(h, k[0], "backbone.model.language_model.model.norm.weight")),
     "key is also stored in", True),
    ("index lists a key the header lacks", _index(lambda i: i["weight_map"].update({"action_head.ghost.weight": S2})),
     "listed in the index are in no shard header", True),
    ("header holds a key the index lacks", _index(lambda i: i["weight_map"].pop("action_head.position_embedding.weight")),
     "does not list it", True),
    ("index total_size wrong", _index(lambda i: i["metadata"].update(total_size=i["metadata"]["total_size"] + 2)),
     "metadata.total_size is", False),
    ("index names ../x as a shard", _index(lambda i: i["weight_map"].update({"action_head.vlln.bias": "../x"})),
     "is not a plain file name", False),
    ("index names /etc/passwd as a shard", _index(lambda i: i["weight_map"].update({"action_head.vlln.bias": "/etc/passwd"})),
     "is not a plain file name", False),
    ("index names a/b as a shard", _index(lambda i: i["weight_map"].update({"action_head.vlln.bias": "a/b"})),
     "is not a plain file name", False),
    ("missing shard", lambda snap: (snap / S2).unlink(), "shard listed in model.safetensors.index.json is missing", False),
    ("flipped data byte", _flip_last_data_byte, "the file changed or is corrupt", False),
    ("NaN where the recipe forbids it", _nan_in("position_embedding.weight"), "NaN/Inf value(s) in target", True),
]


def _convert_cli(capsys, *args: str) -> tuple[int, str]:
    rc = main(["convert", "--version", "n16", "--json", *args])
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("case,corrupt,expected,names_key", BAD_SNAPSHOTS, ids=[c[0] for c in BAD_SNAPSHOTS])
def test_bad_snapshot(copy_snapshot, tmp_path, capsys, case, corrupt, expected, names_key):
    snap = copy_snapshot("n16")
    corrupt(snap)
    if case == "flipped data byte":  # a plain folder has no blob name: its content hash was remembered at first use
        _remember_original_hash(snap, tmp_path / "cache")
    rc, err = _convert_cli(capsys, "--snapshot", str(snap), "--cache", str(tmp_path / "cache"), "--embodiments", "gr1")
    assert rc == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert expected in err and str(snap) in err
    assert ("key '" in err) == names_key, err
    _assert_nothing_published(tmp_path / "cache")
    TABLE.append((case, err.strip()[len("error: "):].replace(str(snap), "<snapshot>")))


@pytest.mark.parametrize("where", ["a shard", "the snapshot"])
def test_a_pipe_where_a_weight_file_should_be_is_one_sentence_not_a_wait(copy_snapshot, tmp_path, where):
    """Opening a named pipe for reading waits for a writer that may never come: a convert handed one (a shard of
    the folder, or `--snapshot` itself) says what it is and exits, in a child with a deadline."""
    from tests.conftest import run_cli

    snap = copy_snapshot("n16")
    if where == "a shard":
        (snap / S2).unlink()
        os.mkfifo(snap / S2)
        given, named = snap, snap / S2
    else:
        given = named = tmp_path / "model.safetensors"
        os.mkfifo(given)
    done = run_cli("convert", "--version", "n16", "--snapshot", str(given), "--cache", str(tmp_path / "cache"),
                   timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith(f"error: {named}: is ") and "a regular file" in done.stderr
    assert "a named pipe" in done.stderr if where == "a shard" else "a pipe, a device or a socket" in done.stderr
    _assert_nothing_published(tmp_path / "cache")


@pytest.mark.parametrize("what", ["a folder", "a link to itself"])
def test_a_model_file_that_is_no_file_is_named_for_what_it_is(tmp_path, capsys, what):
    """`model.safetensors` as a folder, or as a link that loops: one sentence saying so, never "listed in the
    index" of a folder that has no index."""
    snap = tmp_path / "ckpt"
    snap.mkdir()
    if what == "a folder":
        (snap / "model.safetensors").mkdir()
    else:
        (snap / "model.safetensors").symlink_to("model.safetensors")
    rc, err = _convert_cli(capsys, "--snapshot", str(snap), "--cache", str(tmp_path / "cache"))
    assert rc == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: {snap / 'model.safetensors'}: is ")
    assert ("is a folder, not a regular file" if what == "a folder" else "a link to nothing") in err, err
    assert INDEX_NAME not in err


@pytest.mark.parametrize("command", [["cache", "ls"], ["cache", "verify"], ["cache", "gc"], ["load", "--version", "n16"]])
@pytest.mark.parametrize("cache", ["a file", "s3://", "s3:///"])
def test_a_cache_that_is_a_file_or_a_url_without_a_bucket_is_one_sentence(tmp_path, capsys, command, cache):
    """Not "no entries" with exit 0 (a file), nor a listing of `s3:/entries` on the local disk (no bucket)."""
    if cache == "a file":
        cache = str(tmp_path / "cache")
        Path(cache).write_text("not a cache")
    rc = main([*command, "--cache", cache])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: {cache}: ")
    assert ("the cache is a file, not a folder" if "://" not in cache else "names no bucket; pass s3://BUCKET") in err
    if "://" in cache:
        assert not Path("s3:").exists()  # the URL was once taken as the local folder 's3:'
    else:
        assert Path(cache).read_text() == "not a cache"


@pytest.mark.parametrize("command", [["synth", "--version", "n16"], ["convert", "--version", "n16", "--synthetic", "tiny"]])
def test_an_hf_cache_given_as_a_url_is_one_sentence_and_no_local_folder(tmp_path, capsys, monkeypatch, command):
    """`--hf-cache s3://bucket/x` was the local folder `s3:/bucket/x`: synth filled it with a checkpoint in silence,
    and the convert's remedy named `--hf-cache s3:/bucket/x`."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as done:  # a usage error, as argparse ends one
        main([*command, "--hf-cache", "s3://team-weights/hf", "--cache", str(tmp_path / "cache")])
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.count("\n") == 1, err
    TABLE.append((f"{command[0]} --hf-cache s3://…", err.strip()[len("error: "):]))
    assert "argument --hf-cache: s3://team-weights/hf: the Hugging Face cache is a folder on this machine, not a URL" in err
    assert not (tmp_path / "s3:").exists() and not (tmp_path / "cache" / "entries").exists()
    with pytest.raises(ConfigError, match="the Hugging Face cache is a folder on this machine"):  # from Python too
        convert(ConvertOptions("n16", synthetic="tiny", hf_cache="s3://team-weights/hf", cache_root=tmp_path / "c"))
    assert not (tmp_path / "s3:").exists()


@pytest.mark.parametrize("case", ["no credentials", "unreachable", "no bucket"])
def test_a_checkpoint_in_a_store_that_cannot_be_read_is_one_sentence(tmp_path, case):
    """`--snapshot s3://…` where the store cannot be reached, or no credentials are set, or the URL names no
    bucket: one sentence naming the URL and what to do, exit 2, nothing written (it was botocore's traceback)."""
    from tests.conftest import run_cli

    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ENDPOINT_URL="http://127.0.0.1:1", AWS_CONFIG_FILE=str(tmp_path / "none"),
               AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"), AWS_EC2_METADATA_DISABLED="true")
    if case == "unreachable":
        env.update(AWS_ACCESS_KEY_ID="key", AWS_SECRET_ACCESS_KEY="secret")
    url = "s3://" if case == "no bucket" else "s3://team-weights/runs/ckpt"
    done = run_cli("convert", "--snapshot", url, "--cache", str(tmp_path / "cache"), env=env, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert url + ": " in done.stderr
    assert {"no credentials": "no credentials for the object store; set AWS_ACCESS_KEY_ID",
            "unreachable": "the object store cannot be reached (",
            "no bucket": "names no bucket; pass s3://BUCKET/PREFIX"}[case] in done.stderr
    if case == "unreachable":
        assert "copy the checkpoint to a local folder" in done.stderr
    assert not (tmp_path / "cache" / "entries").exists() or not any((tmp_path / "cache" / "entries").iterdir())


def _remember_original_hash(snap: Path, root: Path) -> None:
    """Record what the shard's content identity was before the flip, as a first (clean) run would have."""
    import hashlib

    from tasks.source.safetensors_file import read_header
    from tasks.source.shards import content_identity, hash_shard

    data = bytearray((snap / S2).read_bytes())
    data[-1] ^= 0x01
    original = root / "original.safetensors"
    original.parent.mkdir(parents=True, exist_ok=True)
    original.write_bytes(bytes(data))
    header = read_header(original)
    content = content_identity(header, hash_shard(header, with_sha256=False)[1])
    original.unlink()
    stat = sources._stat_key(snap / S2)  # the memo's own key of the file
    record = root / "sources" / (hashlib.sha256(stat["path"].encode()).hexdigest()[:32] + ".json")
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps({"stat": stat, "content": content}))


def _assert_nothing_published(root: Path) -> None:
    entries = cache_mod.entries_dir(root)
    leftovers = sorted(p.name for p in entries.iterdir()) if entries.exists() else []
    assert leftovers == [], leftovers


@pytest.mark.parametrize("case,args,expected", [
    ("unknown version", ["--version", "n99"], "unknown version 'n99': expected one of n15, n16, n17"),
    ("unknown embodiment tag", ["--version", "n16", "--embodiments", "robot9"], "unknown embodiment tag 'robot9' for n16"),
    ("slot index out of range", ["--version", "n16", "--embodiments", "32"], "embodiment slot 32 is out of range for this n16 checkpoint"),
    # '²' passes str.isdigit and int() refuses it: a ValueError traceback before
    ("a digit that is no slot id", ["--version", "n16", "--embodiments", "²"], "unknown embodiment tag '²' for n16"),
    ("'all' beside other items", ["--version", "n16", "--embodiments", "all,0"],
     "embodiments 'all,0': 'all' selects every slot and stands alone"),
    ("unknown profile", ["--version", "n16", "--profile", "fp4"], "unknown profile 'fp4'"),
])
def test_bad_request(hf_cache, tmp_path, capsys, case, args, expected):
    rc = main(["convert", *args, "--hf-cache", str(hf_cache), "--synthetic", "tiny", "--cache", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and expected in err and err.count("\n") == 1
    TABLE.append((case, err.strip()[len("error: "):]))


@pytest.fixture
def published(hf_cache, tmp_path) -> Path:
    return Path(convert(ConvertOptions("n16", embodiments="gr1", hf_cache=hf_cache, synthetic="micro", cache_root=tmp_path,
                                       progress=False))["cache_path"])


def _chunk(entry: Path) -> Path:
    return entry / "language.model.layers.1.mlp.up_proj.weight" / "c.0.0.0.0.0.0"  # a tiled chunk (format 7)


@pytest.mark.parametrize("case,damage,expected", [
    ("tampered chunk", lambda e: _chunk(e).write_bytes(b"\0" + _chunk(e).read_bytes()[1:]), "does not match its manifest checksum"),
    ("missing chunk", lambda e: _chunk(e).unlink(), "chunk is missing from the cache entry"),
    ("missing manifest", lambda e: (e / "MANIFEST.json").unlink(), "no MANIFEST.json"),
    ("corrupt manifest", lambda e: (e / "MANIFEST.json").write_text("{"), "manifest is not valid JSON"),
    ("manifest of another source", lambda e: (e / "MANIFEST.json").write_text(json.dumps(
        {**json.loads((e / "MANIFEST.json").read_text()), "fingerprint": "f" * 64})), "does not match the entry name"),
])
def test_bad_cache_entry(published, tmp_path, capsys, case, damage, expected):
    damage(published)
    rc = main(["load", "--version", "n16", "--cache", str(tmp_path), "--embodiment", "gr1", "--json"])
    err = capsys.readouterr().err
    assert rc == 2 and expected in err and str(published) in err and err.count("\n") == 1, err
    if "chunk" in case:  # and `cache verify` names the very file
        problems = cache_mod.entry_at(published).verify()
        assert len(problems) == 1 and problems[0].startswith(f"{_chunk(published)}: chunk "), problems
    TABLE.append((case, err.strip()[len("error: "):].replace(str(tmp_path), "<cache>")))


@pytest.mark.parametrize("case,edit,expected", [
    ("bank flag gone", lambda a: a["attributes"].pop("embodiment_bank"),
     "has attributes of the wrong type (embodiment_bank, device_dtype, device_layout, transform, dtype)"),
    ("shape not a list", lambda a: a["attributes"].update(logical_shape=7), "has the logical shape 7, not a list of sizes"),
    ("chunk record gone", lambda a: a.update(chunks={}), "has no chunk, not its whole array"),
    ("slot '²'", lambda a: a.update(attributes={**a["attributes"], "embodiment_bank": True},
                                      chunks={"²": next(iter(a["chunks"].values()))}),
     "has chunks ², not slots of its bank"),
])
def test_a_manifest_damaged_inside_is_one_sentence_and_a_broken_entry_for_every_command(published, tmp_path, capsys,
                                                                                          case, edit, expected):
    """A manifest that parses but whose records are torn or edited (found by mutating one: KeyError and TypeError
    tracebacks from `cache ls`, `verify`, `gc` and `load`): refused where it is read, named by file and array."""
    manifest, array = published / "MANIFEST.json", _chunk(published).parent.name
    doc = json.loads(manifest.read_text())
    edit(doc["arrays"][array])
    manifest.write_text(json.dumps(doc))
    rc = main(["load", "--version", "n16", "--cache", str(tmp_path), "--embodiment", "gr1"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert f"{manifest}: manifest records array '{array}', which {expected}; convert again with --force" in err
    TABLE.append((f"manifest: {case}", err.strip()[len("error: "):].replace(str(tmp_path), "<cache>")))
    assert main(["cache", "ls", "--cache", str(tmp_path), "--json"]) == 0
    assert [r["state"] for r in json.loads(capsys.readouterr().out)["entries"]] == ["broken"]
    assert main(["cache", "verify", "--cache", str(tmp_path)]) == 2  # it was exit 0 for an entry it could not read
    assert "1 entry(ies) failed verification (1 with no valid manifest" in capsys.readouterr().err
    assert main(["cache", "gc", "--cache", str(tmp_path), "--dry-run", "--json"]) == 0
    assert [r["entry"] for r in json.loads(capsys.readouterr().out)["removed"]] == [published.name]


def test_a_ref_that_names_no_entry_is_one_sentence(published, tmp_path, capsys):
    ref = next((tmp_path / "refs").glob("*.json"))
    ref.write_text("-1")
    rc = main(["load", "--version", "n16", "--cache", str(tmp_path), "--embodiment", "gr1"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and f"{ref}: is not a ref (an object naming an entry" in err, err
    TABLE.append(("ref naming no entry", err.strip()[len("error: "):].replace(str(tmp_path), "<cache>")))


# ---- faults -------------------------------------------------------------------------------------------------------

def _entry_chunks(entry: Path) -> dict[str, bytes]:
    return {str(p.relative_to(entry)): p.read_bytes() for p in sorted(entry.rglob("c.*")) if p.is_file()}


def test_kill_9_at_ten_seeded_points_and_mid_staging_never_publishes_and_resumes_exactly(hf_cache, tmp_path):
    clean = convert(ConvertOptions("n16", hf_cache=hf_cache, synthetic="tiny", cache_root=tmp_path / "clean", progress=False))
    root = tmp_path / "killed"
    cmd = [sys.executable, "-m", "pipeline", "convert", "--version", "n16", "--hf-cache", str(hf_cache), "--synthetic", "tiny",
           "--cache", str(root), "--scheduler", "sync", "--json"]
    started = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)  # how long a whole run takes here
    full = time.perf_counter() - started
    shutil.rmtree(root)
    rng = random.Random(20261130)
    for point in sorted(rng.uniform(0.1, 0.95) * full for _ in range(10)):
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(point)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        published = [p for p in cache_mod.entries_dir(root).iterdir() if ".tmp-" not in p.name] \
            if cache_mod.entries_dir(root).exists() else []
        for entry in published:  # a run that finished before the kill published a complete entry, never a half one
            assert cache_mod.entry_at(entry).verify() == []
    final = convert(ConvertOptions("n16", hf_cache=hf_cache, synthetic="tiny", cache_root=root, progress=False))
    assert _entry_chunks(Path(final["cache_path"])) == _entry_chunks(Path(clean["cache_path"]))
    # and once for certain mid-staging (a seeded point may fall after the publish): the next run takes the work up
    root = tmp_path / "killed-mid-staging"
    proc = subprocess.Popen([*cmd[:cmd.index("--cache") + 1], str(root), *cmd[cmd.index("--cache") + 2:]], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    staged = wait_until_staged(proc, root, 300, poll=0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert staged >= 300, "the run finished before it could be killed"
    resumed = convert(ConvertOptions("n16", hf_cache=hf_cache, synthetic="tiny", cache_root=root, progress=False))
    assert resumed["resumed_chunks"] >= 300 and _entry_chunks(Path(resumed["cache_path"])) == _entry_chunks(Path(clean["cache_path"]))
    assert [p.name for p in cache_mod.entries_dir(root).iterdir()] == [Path(resumed["cache_path"]).name]  # adopted


@pytest.mark.parametrize("handed_off", [False, True], ids=["written-by-the-task", "handed-off"])
def test_disk_full_is_a_clean_error(hf_cache, tmp_path, capsys, monkeypatch, handed_off):
    """Both ways a stage task writes: itself (a tiny checkpoint's files are all below DIRECT_MIN), and handed off to
    the writer threads (as a real checkpoint's big ones are), whose failure the next hand-off or the publish raises."""
    import tasks.stage

    handed = []
    if handed_off:
        monkeypatch.setattr(tasks.stage, "DIRECT_MIN", 0)
        monkeypatch.setattr(tasks.stage, "write_behind", lambda *a, write=tasks.stage.write_behind: (
            handed.append(a[1]), write(*a))[1])
    mount = tmp_path / "small"  # room for the array documents (a page each on tmpfs), not for every chunk
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip(needs("root", "cannot mount a small tmpfs here: disk-full not exercised"))
    try:
        rc = main(["convert", "--version", "n16", "--hf-cache", str(hf_cache), "--synthetic", "tiny", "--cache", str(mount), "--json"])
        err = capsys.readouterr().err
        assert rc == 2 and "no space left on the device while staging" in err and err.count("\n") == 1
        assert [p for p in cache_mod.entries_dir(mount).iterdir()] == []  # temporaries removed, nothing published
        assert bool(handed) == handed_off, err
        if not handed_off:
            TABLE.append(("disk full during staging", err.strip()[len("error: "):].replace(str(mount), "<tmpfs>")))
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_a_worker_dying_mid_graph_never_publishes_a_bad_entry(hf_cache, tmp_path):
    import psutil
    from distributed import LocalCluster
    from distributed.scheduler import KilledWorker

    clean = convert(ConvertOptions("n16", hf_cache=hf_cache, synthetic="tiny", cache_root=tmp_path / "clean", progress=False))
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        # the cluster's own worker processes (each nanny's), never another child: its resource tracker, the
        # session's moto server
        workers = [psutil.Process(nanny.process.process.pid) for nanny in cluster.workers.values()]
        opts = ConvertOptions("n16", scheduler=cluster.scheduler_address, hf_cache=hf_cache, synthetic="tiny",
                              cache_root=tmp_path / "dist", progress=False)
        import threading

        def kill_one() -> None:
            time.sleep(1.5)
            workers[0].kill()

        threading.Thread(target=kill_one, daemon=True).start()
        try:
            summary = convert(opts)
        except (PipelineError, KilledWorker) as e:  # failing is allowed, as one error; publishing a bad entry is not
            assert str(e), "an error that says nothing"
            summary = None
    entries = cache_mod.entries_dir(tmp_path / "dist")
    published = [p for p in entries.iterdir() if ".tmp-" not in p.name] if entries.exists() else []
    if summary is None:
        assert published == []
    else:  # the scheduler retried the lost tasks elsewhere: the entry must be exactly right
        assert _entry_chunks(Path(summary["cache_path"])) == _entry_chunks(Path(clean["cache_path"]))


def test_readers_during_publish_never_see_a_partial_entry(hf_cache, tmp_path):
    cmd = [sys.executable, "-m", "pipeline", "convert", "--version", "n16", "--hf-cache", str(hf_cache), "--synthetic", "tiny",
           "--cache", str(tmp_path), "--json"]
    procs = [subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) for _ in range(2)]
    polls = 0
    while any(p.poll() is None for p in procs):
        for name, entry, state in list_entries(LocalStore(tmp_path)):
            if state != "incomplete":  # anything not a temporary must be complete and valid
                assert state == "published" and entry.verify() == []
        polls += 1
        time.sleep(0.01)
    assert polls > 10  # the cache was looked at while the writers ran, not only after
    assert all(p.returncode == 0 for p in procs)
    outs = [json.loads(p.stdout.read()) for p in procs]
    assert len({o["cache_path"] for o in outs}) == 1
    assert [state for _, _, state in list_entries(LocalStore(tmp_path))] == ["published"]  # one entry, whole


# ---- limits -------------------------------------------------------------------------------------------------------

def test_tensor_count_cap(tmp_path, monkeypatch):
    from tasks.source import safetensors_file

    monkeypatch.setattr(safetensors_file, "MAX_TENSORS_PER_FILE", 3)
    path = tmp_path / "many.safetensors"
    with open(path, "wb") as fh:
        safetensors_file.write_file(fh, [(f"t{i}", "U8", (1,)) for i in range(4)], lambda k: [np.zeros(1, np.uint8)])
    with pytest.raises(CheckpointError, match="header lists 4 tensors, more than the cap of 3"):
        safetensors_file.read_header(path)


def test_no_pickle_anywhere_in_the_project():
    offenders = [str(p) for d in ("pipeline", "tasks") for p in (ROOT / d).rglob("*.py")
                 if "import pickle" in p.read_text() or "torch.load" in p.read_text()]
    assert offenders == []


def test_new_cache_files_follow_the_umask(hf_cache, tmp_path):
    old = os.umask(0o027)
    try:
        entry = Path(convert(ConvertOptions("n15", embodiments="gr1", hf_cache=hf_cache, synthetic="tiny", cache_root=tmp_path,
                                            progress=False))["cache_path"])
    finally:
        os.umask(old)
    modes = {p.stat().st_mode & 0o777 for p in entry.rglob("*")}
    assert modes <= {0o640, 0o750}, {oct(m) for m in modes}
