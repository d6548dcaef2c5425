"""The cache's values as zarr-python gives them, by the few lines cache/README.md shows a reader that knows nothing
of this project (its "Tiled chunks" block, run as written): the independent reader tests hold entries to."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

README = Path(__file__).resolve().parents[1] / "cache" / "README.md"


def readme_block() -> str:
    """cache/README.md's Python block that reads an entry with zarr-python alone."""
    return re.search(r"```python\n(import zarr\n.*?)```", README.read_text(), re.S).group(1)


def _definitions() -> dict:
    namespace: dict = {}
    exec(readme_block().split("\nentry = ")[0], namespace)  # the imports and `values`, not the example's use
    return namespace


values = _definitions()["values"]


def read_entry(entry: Path) -> dict[str, np.ndarray]:
    """Every array of an entry by the README block, run whole, as written: name -> values."""
    namespace: dict = {"ENTRY": str(entry)}
    exec(readme_block(), namespace)
    return namespace["tensors"]
