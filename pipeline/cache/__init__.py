"""The cache's policies, one module each, over the entry format (tasks/entries/) and a store (tasks/entries/store.py):

- `roots.py`: where the cache is, and the temporary folder an entry is built in (resume);
- `sources.py`: the source-hash memo (a plain folder's shards hashed once, remembered by path, size, mtime, inode);
- `selection.py`: which entry a convert finds or a reload opens (`Wanted`, `choose_entry`, refs);
- `homes.py`: where entries go, a folder's way or an object store's (building, reuse, publishing, leases, gc): the
  one place that asks which kind of cache it has;
- `leases.py`: in a folder, readers hold an entry's lock shared; deleting takes it exclusively;
- `housekeeping.py`: `cache ls`, `cache gc` and `cache rm`;
- `pool.py`: what an object store's entries share (objects under `objects/`): sizes counted once, and the sweep
  that removes objects no manifest names once past the grace period.

Entries are named by content (tasks/entries/manifest.py `Identity.of`), built in a temporary folder beside the final one and
published by rename (tasks/entries/publish.py). `refs/<version>-<layout>-<profile>` names the entry the last conversion
produced, so a later process can load without touching the source checkpoint.
"""

from pipeline.cache.housekeeping import GRACE_HOURS, collect_garbage, entry_rows, remove_entry
from pipeline.cache.homes import EntryHome, build_root, build_store, home_of, readers, reading
from pipeline.cache.leases import LEASES
from pipeline.cache.roots import (DEFAULT_ROOT, cache_root, cache_store, claim_tmp, entries_dir, entry_at,
                                  synthetic_hf_cache, writable_folder)
from pipeline.cache.selection import SyntheticWeightsWarning, Wanted, choose_entry, find_entry, resolve_ref, warn_if_synthetic
from pipeline.cache.sources import source_identity

__all__ = ["DEFAULT_ROOT", "EntryHome", "LEASES", "home_of", "SyntheticWeightsWarning", "Wanted", "build_root", "build_store", "cache_root", "cache_store", "choose_entry",
           "GRACE_HOURS", "claim_tmp", "collect_garbage", "entries_dir", "entry_at", "entry_rows", "find_entry", "readers", "reading",
           "remove_entry", "resolve_ref", "source_identity", "synthetic_hf_cache", "warn_if_synthetic", "writable_folder"]
