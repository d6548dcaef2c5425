"""The converter above tasks/ (the stage functions, which know nothing of Dask or of this package), in rooms, each
using only those listed after it:

- `commands/`: what a person sees (the CLI, its reports, the demo);
- `port_n16/`: tt-metal's GR00T N1.6 port built from a cache entry, and held to the port's own model;
- `jobs/`: convert, load, reuse, the graph and the scheduler that runs it;
- `inputs/`: the checkpoint a command names and what its folder says about itself;
- `cache/` and `model/`: the cache's policies over the entry format (tasks/entries/), and each GR00T version's
  state dict and target plan.
"""
