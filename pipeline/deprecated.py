"""Every deprecated spelling of the stable API, in one place, each working until tasks/old_paths.py's REMOVED_IN
with a DeprecationWarning that names the new one (CHANGELOG.md):

- the import paths of 0.1.0: `from pipeline.load import load`, `from pipeline.convert import convert, …` (modules
  with no file of their own: a finder on `sys.meta_path` answers them);
- `load`'s keywords of 0.1.0: `ttnn_host=True` is `into="ttnn"`, `device=D` is `into=D`.

The internal import paths of 0.2.0 (`tasks.convert`, `from tasks.source import read_weight`, …) are
tasks/old_paths.py's: `tasks/` cannot import from `pipeline/`, and a script may import them without `pipeline`.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types

from tasks.old_paths import warn_moved

OLD_MODULES = {"pipeline.load": "pipeline.jobs.load", "pipeline.convert": "pipeline.jobs.convert"}
OLD_LOAD_KEYWORDS = ("ttnn_host", "device")


class _OldModule(types.ModuleType):
    """An old module path: each name comes from its new home, with a warning said of the line that asked for it."""

    _home: str

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        value = getattr(importlib.import_module(self._home), name)
        import pipeline

        warn_moved(f"{self.__name__}.{name}", f"from pipeline import {name}" if name in pipeline.__all__ else
                   f"{self._home}.{name} (internal: it may move again)")
        return value


class _OldModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old module path (OLD_MODULES) and gives an `_OldModule` for it."""

    def find_spec(self, fullname, path=None, target=None):
        return importlib.util.spec_from_loader(fullname, self) if fullname in OLD_MODULES else None

    def create_module(self, spec):
        module = _OldModule(spec.name, f"Deprecated import path: `from pipeline import …` ({__name__}).")
        module._home = OLD_MODULES[spec.name]
        return module

    def exec_module(self, module) -> None:
        pass  # nothing to run: every name is its home's


class Package(types.ModuleType):
    """The `pipeline` package's class: importing an old path sets the package's attribute of that name to the
    module; `pipeline.load` stays the function `from pipeline import load` gives."""

    def __setattr__(self, name: str, value: object) -> None:
        if f"{self.__name__}.{name}" in OLD_MODULES and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


def answer_old_paths(package: types.ModuleType) -> None:
    """Make `package` (pipeline) keep its functions over old module paths, and answer those paths."""
    package.__class__ = Package
    if not any(isinstance(finder, _OldModules) for finder in sys.meta_path):
        sys.meta_path.append(_OldModules())


def into_of_old_keywords(into, old: dict, stacklevel: int = 4):
    """`load`'s `into` as 0.1.0's keywords said it (`ttnn_host=True`: "ttnn"; `device=D`: D), with a warning said of
    the caller's line; any other keyword is the TypeError Python gives."""
    unknown = set(old) - set(OLD_LOAD_KEYWORDS)
    if unknown:
        raise TypeError(f"load() got an unexpected keyword argument {sorted(unknown)[0]!r}")
    if old.get("device") is not None:
        warn_moved("load(device=D)", "load(into=D)", stacklevel=stacklevel)
        return old["device"]
    if old.get("ttnn_host"):
        warn_moved("load(ttnn_host=True)", 'load(into="ttnn")', stacklevel=stacklevel)
        return "ttnn"
    for name in old:  # ttnn_host=False, device=None: what the default was
        warn_moved(f"load({name}=...)", "load(into=...)", stacklevel=stacklevel)
    return into
