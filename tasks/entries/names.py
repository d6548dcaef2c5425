"""The cache entry format's names: its format version, the keys of entries and refs under the cache root, the
files of an entry (chunks, device files, progress logs, temporaries). Pure string and path arithmetic, no I/O.

Keys are relative to the cache root: `entries/<name>/…` and `refs/<version>-<layout>-<profile>.json`.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

from tasks.entries.zarr_v3 import chunk_path
from tasks.old_paths import names_moved

CACHE_FORMAT = 7            # bump when the on-disk layout changes (cache/README.md, "Versioning")
CONVERTER_VERSION = "3"     # bump when a transform changes the bytes it produces (3: host tables stored as float32)
READABLE_FORMATS = (3, 4, 5, 6, 7)  # 3: chunk keys c.0.0; 4: + source_shapes; 5: + source_dtypes, float32
                              # host arrays; 6: an object store's entries name their bytes in objects/ (`object_key`);
                              # 7: a TILE target with a device file is one tiled file (tasks/device/one_file.py).
                              # Format 2 kept c/0/0 and is not read.
CONTENT_FORMAT = 5          # in every array's content id: how a chunk's bytes are laid out, which format 6 kept
                            # (so a fine-tune still reuses what a format 5 entry holds)
MANIFEST = "MANIFEST.json"  # written last: present means complete
ENTRIES, REFS = "entries", "refs"
LEASES = "leases"           # `leases/<entry>.lock` (the lock) and `leases/<entry>@<pid>-<random>` (who reads it)
SOURCES = "sources"         # sources/<hash>.json: a plain folder's shard identities (pipeline/cache/sources.py)
HF = "hf"                   # the demo's synthetic Hugging Face cache (pipeline/inputs/snapshot.py)
PORT_CHECKS = "port-checks"  # the port hand-off's self-check verdicts (pipeline/port_n16/verdict.py)
OBJECTS = "objects"         # objects/<sha256>[.tensorbin]: an object store's chunks and device files, shared by
                            # every entry that holds the same bytes (`object_key`)
FETCHED = "fetched"         # fetched/<sha256>[.tensorbin]: what loads from an object store keep (tasks/entries/fetched.py)
PORT_MODELS = "port-models"  # port-models/<entry>/: the port's model kept per entry (pipeline/port_n16/kept.py)
PROGRESS_DIR = ".staged"    # progress logs of an entry being built (resume): one JSON line per staged chunk
PROCESSOR_DIR = "processor"  # the trainer's processor files, kept beside the weights (`Identity.processor`)
PACKED_DIR = "tensorbin"    # ttnn's `.tensorbin` device files, outside the Zarr arrays
PACKED_SUFFIX = ".tensorbin"  # ttnn's load_tensor refuses a device file named otherwise
WHOLE = "all"               # the manifest key of a whole-array chunk; a bank's chunks are keyed by slot
TMP_MARK = ".tmp-"          # `<name>.tmp-<pid>-<random>`: an entry being built (local caches only)


# -- names --------------------------------------------------------------------------------------------------------
def holds_data(key: str) -> bool:
    """Whether an entry's key is one of its chunks (`<array>/c[.…]`) or device files (`tensorbin/….tensorbin`),
    not a document (`zarr.json`, the manifest) or anything else."""
    *folders, name = key.split("/")
    return name == "c" or name.startswith("c.") or (PACKED_DIR in folders and name.endswith(PACKED_SUFFIX))


def is_temporary(name: str) -> bool:
    """Whether a name under entries/ is an entry being built (or a killed run's, or a replaced one set aside)."""
    return TMP_MARK in name


def entry_key(name: str) -> str:
    return f"{ENTRIES}/{name}"


def manifest_key(name: str) -> str:
    return f"{ENTRIES}/{name}/{MANIFEST}"


SYNTHETIC_REF = ".synthetic"  # synthetic conversions have refs of their own: fake weights never take a real ref


def ref_key(version: str, layout: str, profile: str, synthetic: bool = False) -> str:
    """The ref naming the entry last converted for this version, layout and profile (from a synthetic stand-in:
    `<...>.synthetic.json`, so that converting one never changes what a real load opens)."""
    return f"{REFS}/{version}-{layout}-{profile}{SYNTHETIC_REF if synthetic else ''}.json"


def ref_object(stem: str) -> str:
    """The key of the ref `refs()` lists as `stem`."""
    return f"{REFS}/{stem}.json"


def entry_name(version: str, layout: str, profile: str, fingerprint: str) -> str:
    """`<version>-<layout>-<profile>-<first 20 hex digits of the fingerprint>`: what `open_entry` holds a manifest to."""
    return f"{version}-{layout}-{profile}-{fingerprint[:20]}"


def object_key(sha256: str, suffix: str = "") -> str:
    """Where an object store keeps bytes of this sha256, for every entry that holds them: a name no other bytes
    can claim (an xxh3 can be forged by a stranger's checkpoint, to stand in for another entry's bytes). `suffix`:
    a device file's (PACKED_SUFFIX), which ttnn wants in the name of the file it loads."""
    return f"{OBJECTS}/{sha256}{suffix}"


def is_object_key(key: object) -> bool:
    """Whether `key` is an `object_key`: `objects/<64 hex>`, or with a device file's suffix."""
    return isinstance(key, str) and _OBJECT_KEY.fullmatch(key) is not None


_OBJECT_KEY = re.compile(rf"{OBJECTS}/[0-9a-f]{{64}}({re.escape(PACKED_SUFFIX)})?")


def chunk_key(slot: int | None) -> str:
    return WHOLE if slot is None else str(slot)


def is_whole_number(text: object) -> bool:
    """The one rule for a number as typed or stored as text (a slot id, a chunk key, a device id, a count): ASCII
    digits. (`str.isdigit` also takes '²', which `int` refuses, and '０'.)"""
    return isinstance(text, str) and text.isascii() and text.isdigit()


def slot_of(key: str) -> int | None:
    return None if key == WHOLE else int(key)


def chunk_coords(ndim: int, slot: int | None) -> tuple[int, ...]:
    """Whole-array targets are one chunk; an embodiment bank has one chunk per slot."""
    return (0,) * ndim if slot is None else (slot,) + (0,) * ndim


def chunk_file(entry: Path | PurePosixPath, name: str, ndim: int, slot: int | None) -> Path | PurePosixPath:
    """The chunk of target `name` (`ndim` = its logical rank) for `slot`, under the entry folder or key."""
    return chunk_path(entry / name, chunk_coords(ndim, slot))


def _chunk_name(name: str, slot: int | None) -> str:
    return name + ("" if slot is None else f"@{slot}")


def packed_path(entry: Path | PurePosixPath, name: str, slot: int | None) -> Path | PurePosixPath:
    """Where a target's `.tensorbin` lives (outside the arrays, so Zarr readers never see it)."""
    return entry / PACKED_DIR / packed_name(name, slot)


def packed_name(name: str, slot: int | None) -> str:
    return _chunk_name(name, slot) + PACKED_SUFFIX


def tmp_name(name: str, pid: int, token: str) -> str:
    """The folder an entry is built in: `<name>.tmp-<pid>-<token>` (its owner's pid, so orphans can be told)."""
    return f"{name}{TMP_MARK}{pid}-{token}"


def set_aside_name(name: str, pid: int) -> str:
    """Where `--force` moves a published entry while its replacement is renamed into place (a temporary, so gc
    removes one a kill left behind)."""
    return f"{name}{TMP_MARK}{pid}-replaced"


def scratch_name(name: str, pid: int) -> str:
    """A throwaway entry that `--check-against-cache` converts into beside `name`, deleted either way:
    `.tmp-<pid>-check-<name>`. A temporary by its name, so nothing lists or opens it as published, and a kill
    before it is deleted leaves what gc removes once its process is dead (`tmp_owner`)."""
    return f"{TMP_MARK}{pid}-check-{name}"


def tmp_owner(folder: str) -> int | None:
    """The pid that builds in a `tmp_name` folder; None for any other name."""
    try:
        return int(folder.split(TMP_MARK, 1)[1].split("-", 1)[0])
    except (IndexError, ValueError):
        return None


def progress_log(entry: Path, writer: str) -> Path:
    """One append-only log per writing process and thread: a file per chunk would cost an inode each, which is
    what creating files costs most on ext4 (find_inode_bit), thousands of times per entry."""
    return entry / PROGRESS_DIR / f"{writer}.jsonl"


# Names that left this module (deprecated, CHANGELOG.md): gc's policy
__getattr__ = names_moved("tasks.entries.names", dict.fromkeys(("GRACE_HOURS", "FRESH_FOR"), "tasks.entries.objects"))
