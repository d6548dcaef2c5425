"""The jobs: a convert (`convert.py`: snapshot -> plan -> identity -> cache hit, or the graph and the publish), a load
from the cache (`load.py`), what a fine-tune takes from entries already published (`reuse.py`), the graph of named
tasks (`graph.py`: wiring only; every function it calls lives in tasks/) and the scheduler that runs it, from one
thread to a dask cluster (`run.py`)."""
