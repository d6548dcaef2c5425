"""Import paths of earlier versions, kept working for one minor version with a DeprecationWarning that names the
new one (CHANGELOG.md). Two kinds:

- a module that moved (`tasks.convert` is `tasks.device.host_tensors`): `MOVED_MODULES`, answered by a finder on
  `sys.meta_path` that gives the new module itself under the old name, so the old path needs no file of its own;
- a name that left its module (`S3Store` of `tasks.entries.store`): the module's `__getattr__`, made by
  `names_moved`, hands the name over from its new home.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from typing import Callable, Mapping

REMOVED_IN = "0.3.0"

# Where import machinery and this module sit in the stack: a warning is said of the first line outside them, the
# user's own import (a fixed stacklevel cannot say it: the import machinery's depth varies)
_NOT_THE_CALLER = ("<frozen importlib", __file__)

MOVED_MODULES = {
    "tasks.bulk_write": "tasks.io.bulk_write", "tasks.file_blocks": "tasks.io.file_blocks",
    "tasks.network": "tasks.io.network", "tasks.kernels": "tasks.numerics.kernels",
    "tasks.precision": "tasks.numerics.precision", "tasks.transforms": "tasks.numerics.transforms",
    "tasks.safetensors_file": "tasks.source.safetensors_file", "tasks.checkpoint": "tasks.source.checkpoint",
    "tasks.tensorbin": "tasks.device.tensorbin", "tasks.convert": "tasks.device.host_tensors",
    # `tasks.source` and `tasks.device` are rooms now: their old names are the rooms' (tasks/source/__init__.py,
    # tasks/device/__init__.py)
}


def _message(old: str, new: str) -> str:
    return f"{old} is deprecated and goes in {REMOVED_IN}: use {new}"


def warn_moved(old: str, new: str, stacklevel: int = 3) -> None:
    """Warn that `old` moved to `new`, of the frame `stacklevel` up from this one."""
    warnings.warn(_message(old, new), DeprecationWarning, stacklevel=stacklevel)


def _warn_at_importers_line(old: str, new: str) -> None:
    frame = sys._getframe(1)
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_NOT_THE_CALLER):
        frame = frame.f_back
    registry = frame.f_globals.setdefault("__warningregistry__", {})
    warnings.warn_explicit(_message(old, new), DeprecationWarning, frame.f_code.co_filename, frame.f_lineno,
                           module=frame.f_globals.get("__name__"), registry=registry)


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old module path and gives the module that now lives elsewhere, once imported, under both names."""

    def __init__(self) -> None:
        self.moved: dict[str, str] = {}

    def find_spec(self, fullname, path=None, target=None):
        return importlib.util.spec_from_loader(fullname, self) if fullname in self.moved else None

    def create_module(self, spec):
        new = self.moved[spec.name]
        _warn_at_importers_line(f"import {spec.name}", f"import {new} (internal: it may move again)")
        return importlib.import_module(new)  # its attributes are kept: only missing ones are set by the import

    def exec_module(self, module) -> None:
        pass  # already executed, under its new name


_FINDER = _MovedModules()


def modules_moved(moved: Mapping[str, str]) -> None:
    """Answer each old module path in `moved` (old -> new) with the new module, warning."""
    _FINDER.moved.update(moved)
    if _FINDER not in sys.meta_path:
        sys.meta_path.append(_FINDER)


def names_moved(module: str, homes: Mapping[str, str], renamed: Mapping[str, str] | None = None
                ) -> Callable[[str], object]:
    """A module `__getattr__` for `module`: each name in `homes` (name -> the module it lives in now; `renamed`:
    its new name there, if it has one) is handed over with a warning; any other is an AttributeError."""
    renamed = renamed or {}

    def __getattr__(name: str) -> object:
        if name not in homes:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        new = renamed.get(name, name)
        _warn_at_importers_line(f"{module}.{name}", f"from {homes[name]} import {new} (internal: it may move again)")
        return getattr(importlib.import_module(homes[name]), new)

    return __getattr__


modules_moved(MOVED_MODULES)
