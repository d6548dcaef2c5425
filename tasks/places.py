"""Where an entry is being built, as the graph's stage and publish tasks see it: one class per kind of cache, and
the one value of the graph they both read (a Dask worker is sent it once, not with every task).

- `InFolder`: a temporary folder beside the entry's final name. Each target is written there (tasks/stage.py
  `stage_target`) and the entry is published by one rename (tasks/entries/publish.py `publish_entry`).
- `InBucket`: an object store. The worker that converted a target puts its objects there itself (`stage_into_store`)
  and the publish puts the manifest last (`publish_into_store`): no task needs a path only the client has.

pipeline/cache/homes.py chooses the place for a cache; the graph only wires `stage` and `publish` to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from tasks.device.host_tensors import Converted
from tasks.entries.manifest import Identity, Staged
from tasks.entries.objects import Present
from tasks.entries.publish import UnitDone, publish_entry, publish_into_store
from tasks.source.shards import VerifiedShard
from tasks.stage import stage_into_store, stage_target


@dataclass(frozen=True)
class InFolder:
    tmp: str                # the folder the entry is built in
    final: str              # the entry's published folder, which the rename makes
    behind: bool = False    # the publish runs in this process: stage tasks hand their writes off (`write_behind`)
    replace: bool = False   # --force: a published entry of the same name is replaced at the rename

    def stage(self, converted: Converted) -> Staged:
        return stage_target(self.tmp, converted, self.behind)

    def publish(self, identity: Identity, arrays: Mapping[str, dict], units: Sequence[UnitDone],
                verified: Sequence[VerifiedShard]) -> dict:
        return publish_entry(self.tmp, self.final, identity, arrays, units, verified, self.replace)


@dataclass(frozen=True)
class InBucket:
    url: str                # the object store's cache root
    name: str               # the entry's name
    stall: float | None     # the client's stall limit (a worker has an environment of its own)
    present: Present = field(default_factory=dict)  # its objects when the convert began: key -> (size, written)
    fresh_after: float = 0.0  # an object there written before this is freshened, not trusted

    def stage(self, converted: Converted) -> Staged:
        return stage_into_store(self.url, self.stall, converted, self.present, self.fresh_after)

    def publish(self, identity: Identity, arrays: Mapping[str, dict], units: Sequence[UnitDone],
                verified: Sequence[VerifiedShard]) -> dict:
        return publish_into_store(self.url, self.stall, self.name, identity, arrays, units, verified)


Place = InFolder | InBucket


def stage(place: Place, converted: Converted) -> Staged:
    """The graph's stage task: one converted target (or slot) into the entry being built."""
    return place.stage(converted)


def publish(place: Place, identity: Identity, arrays: Mapping[str, dict], units: Sequence[UnitDone],
            verified: Sequence[VerifiedShard]) -> dict:
    """The graph's publish task: once every unit is done and every shard verified, the entry, whole or not at all."""
    return place.publish(identity, arrays, units, verified)
