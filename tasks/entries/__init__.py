"""The cache entry format, built and read through one store interface. Nothing here imports pipeline/.

- `names.py`: the format's names: its version, the keys of entries, refs and objects, an entry's files.
- `zarr_v3.py`, `chunks.py`: the Zarr v3 documents and chunk files an entry holds, written in place.
- `manifest.py`: what an entry records (every chunk's and device file's checksum) and the documents made from it.
- `progress.py`: the progress logs of an entry being built, so that a killed convert resumes.
- `store.py`: the `Store` interface and a local folder behind it; `object_stores.py`: S3 and fsspec;
  `cache_root.py`: `open_store`, the store behind a cache root.
- `objects.py`: an object store's shared, content-named objects, and how long `cache gc` leaves one alone.
- `publish.py`, `refs.py`: how an entry becomes visible (rename, or the manifest last) and how a ref names it.
- `entry.py`, `reload.py`: reading a published entry, checked, onto the host or a device; `fetched.py`: an object
  store read through what loads fetched from it before (`KeepingStore`), kept on local disk.
"""
