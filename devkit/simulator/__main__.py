"""`python -m devkit.simulator build`: build what the simulated device needs (run by `make test`)."""

import os
import sys
from pathlib import Path

from devkit.simulator import CONFIGS, build, runtime_root, unavailable_reason

if sys.argv[1:] != ["build"]:
    sys.exit("usage: python -m devkit.simulator build")
reason = unavailable_reason()
if reason:
    print(f"simulator: not built ({reason}); the device tests will skip")
    sys.exit(0)
for cfg in CONFIGS:
    lib = Path(os.environ["TT_METAL_SIMULATOR"]) if cfg == "wh" and os.environ.get("TT_METAL_SIMULATOR") else build(cfg)
    print(f"simulator: {cfg} ready at {lib}" if lib else f"simulator: {cfg} not available")
print(f"simulator: runtime root {runtime_root()} (firmware stand-in for the absent SFPI compiler)")
