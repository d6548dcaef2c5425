"""What one convert did, as one typed record: `convert --json` prints it (`as_json`), and the text report
(pipeline/commands/printing.py `print_convert`) reads it. A field that does not apply to how the convert went (a
cache hit converts nothing; only a push has pushed bytes) is None, and is then left out of the record read as a
mapping, as the JSON leaves it out."""

from __future__ import annotations

import resource
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields

from tasks.source.checkpoint import Checkpoint
from tasks.plan import Plan, work_units

WORST_NUMERICS_IN_JSON = 10  # the JSON keeps the worst chunks only; every chunk's figures are in the manifest


@dataclass(frozen=True, kw_only=True)
class ConvertSummary(Mapping):
    # what was asked for and what it names: every convert
    version: str
    version_found: bool            # found from the checkpoint's keys, not given
    layout: str
    profile: str
    fingerprint: str
    cache_path: str                # the entry, in the cache's own words (a folder, or an object-store URL)
    slots: list[int]
    targets: int
    skipped: dict[str, str]        # source key -> why the recipe leaves it out
    source: dict                   # the manifest's source record (snapshot, revision, trained tags, ties, ...)
    notes: list[str]               # what the folder holds that the user should hear of
    processor: str = ""            # the trainer's processor: kept (whose, for which embodiments), or none found
    shards_checked_against: dict[str, str]  # shard -> "published sha256" or "content identity"
    # how it went: set once the convert is over
    cache_hit: bool | None = None
    seconds: float | None = None
    tasks: int | None = None
    bytes_read: int | None = None
    bytes_written: int | None = None
    peak_rss_bytes: int | None = None
    shards_sha256: dict[str, str] | None = None
    device_tensors: dict | None = None  # --device: the uploaded tensors (not in the JSON)
    # a build only
    resumed_chunks: int | None = None   # staged by a killed run and kept
    reused_chunks: int | None = None    # linked (or copied inside the store) from published entries
    reused_bytes: int | None = None
    identified_shards: list[str] | None = None  # known by their identity alone, not read to be hashed
    stage_seconds: dict[str, float] | None = None
    stage_tasks: dict[str, int] | None = None
    published_here: bool | None = None  # False: another process published the same entry first
    numerics: list[dict] | None = None  # every chunk's pcc and max error, worst first
    pushed_bytes: int | None = None     # an object-store cache: bytes sent
    # an object store (the cache or the source): requests tried again, by what happened (tasks/io/network.py), on
    # this machine and on a cluster's workers
    store_retries: dict[str, int] | None = None
    local_build: str | None = None      # an object-store cache with a device open: the folder built in
    # --check-against-cache only
    checked_against_fresh_conversion: bool | None = None
    arrays_compared: int | None = None

    def __getitem__(self, key: str) -> object:
        value = getattr(self, key, None) if key in _FIELDS else None
        if value is None:
            raise KeyError(key)
        return value

    def __iter__(self) -> Iterator[str]:
        return (name for name in _FIELDS if getattr(self, name) is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def as_json(self) -> dict:
        """What `convert --json` prints: every field that applies, the worst chunks' numerics only, and no
        device tensors."""
        out = {k: v for k, v in self.items() if k not in ("numerics", "device_tensors")}
        return out | {"numerics_worst": list(self.numerics or [])[:WORST_NUMERICS_IN_JSON]}


_FIELDS = tuple(f.name for f in fields(ConvertSummary))


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def source_bytes_read(plan: Plan, ck: Checkpoint, slots: tuple[int, ...], done: Mapping) -> int:
    """Bytes the read/slot tasks fetched for the units not `done` (verify's hashing pass is counted separately, in
    its stage time)."""
    total = 0
    for t, slot in work_units(plan.targets, slots):
        if (t.name, slot) not in done:
            for key in t.sources:
                nbytes = ck.info(key).nbytes
                total += nbytes // ck.shape(key)[0] if slot is not None else nbytes
    return total
