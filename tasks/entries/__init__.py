"""The cache entry format: its names (names.py), records and documents (manifest.py), the writes of an entry being
built (chunks.py, zarr_v3.py, progress.py), how it is made visible (publish.py, refs.py), and how a published one is
read (entry.py, reload.py), all through one store interface (store.py). Nothing here imports pipeline/."""
