"""The jobs. A convert, along its flow: `convert.py` takes what it is asked (`options.py`), prepares (`prepare.py`:
the checkpoint found and read once, its targets planned, its entry named), then takes the entry the cache holds
(`cached.py`) or builds it (`build_entry.py`: the graph of named tasks, `graph.py`, wiring only, run by `run.py` from one
thread to a dask cluster, with what published entries already hold given to it by `reuse.py`), and says what it did
(`summary.py`). A load from the cache (`load.py`) reads what a convert published."""

from tasks.old_paths import modules_moved

modules_moved({"pipeline.jobs.build": "pipeline.jobs.build_entry"})  # 0.2.0's name, deprecated (CHANGELOG.md)
