"""Where the project's configs are: the source tree's `configs/`, or, installed from a wheel, the same files as the
package data `gr00t_tt_configs` (pyproject.toml). The one locator: versions, recipes and the mock cluster
descriptors are all read from here."""

from __future__ import annotations

import importlib.resources
from pathlib import Path


def _config_dir() -> Path:
    source = Path(__file__).resolve().parent.parent / "configs"
    return source if (source / "recipes.toml").is_file() else Path(str(importlib.resources.files("gr00t_tt_configs")))


CONFIG_DIR = _config_dir()
