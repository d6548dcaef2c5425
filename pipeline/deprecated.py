"""The import paths of earlier versions, kept working for one minor version with a DeprecationWarning that names
the new import (CHANGELOG.md): `from pipeline.load import load` and `from pipeline.convert import convert, …`
(pipeline/load.py, pipeline/convert.py), and `load`'s keywords `ttnn_host=` and `device=` (pipeline/jobs/load.py).
Moved modules and names are tasks/old_paths.py's: `pipeline.jobs.build` (pipeline/jobs/__init__.py), and the
names that left `pipeline.inputs.folder` (pipeline/inputs/folder.py).
Importing an old path leaves `pipeline.load` the function (pipeline/__init__.py `_Package`)."""

from __future__ import annotations

import importlib
import sys
import types

from tasks.old_paths import warn_moved


class _MovedModule(types.ModuleType):
    """An old module path: each name comes from its new home, with a warning that names the new import."""

    _home: str

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        value = getattr(importlib.import_module(self._home), name)
        import pipeline

        warn_moved(f"{self.__name__}.{name}", f"from pipeline import {name}" if name in pipeline.__all__ else
                   f"{self._home}.{name} (internal: it may move again)")
        return value


def moved(module_name: str, home: str) -> None:
    """Make the module `module_name` (being imported) an old path to `home`."""
    module = sys.modules[module_name]
    module.__class__ = _MovedModule
    module._home = home
