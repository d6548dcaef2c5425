"""The stage functions: plain values in, plain values out, no Dask. pipeline/ wires them into a graph.

Rooms, from the floor up; a module imports only from its own room or the ones below it (tests/test_layout.py):

- `errors.py`, `config_files.py`: the one exception family, and where the configs are.
- `io/`: bytes in and out of files and object stores (reads by range, writes past the page cache, network faults).
- `numerics/`: pure numpy and the C kernels: what each source dtype becomes, and the source -> target transforms.
- `source/`: the checkpoint: the safetensors format, its shards, and a lazy view of a whole checkpoint.
- `plan.py`: the work: targets, plans, and a host table waiting in its shard.
- `device/`: ttnn: host tensors in the device dtype and layout, `.tensorbin` files, upload to a device.
- `entries/`: the cache entry format, built and read through one store interface.
- `stage.py`: writing a converted target into an entry being built, locally or in an object store.
- `places.py`: where an entry is being built (a folder, or an object store), as the graph's stage and publish
  tasks see it.

`old_paths.py` keeps the modules' import paths of earlier versions working, with a DeprecationWarning.
"""

from tasks import old_paths  # noqa: F401 (before any old path is imported: it answers them)
