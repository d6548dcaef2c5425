"""Finding and importing the port: the tt-metal tree that holds it, its modules imported from that tree alone, and
its revision (sha256 of its files), which keys every verdict kept about it."""

from __future__ import annotations

import hashlib
import importlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.model.versions import load_config
from tasks.errors import PipelineError

VERSION = "n16"
N16 = load_config(VERSION)  # configs/n16.toml: its [port] table names the port's classes and layouts
TT_METAL_ENV = "TT_METAL_HOME"


class PortError(PipelineError):
    """The port's code cannot be found, or builds tensors this entry does not hold."""



@dataclass(frozen=True)
class PortCode:
    """The port's modules, imported from one tt-metal tree, and the revision of that code (sha256 of its files)."""

    root: Path
    package: str
    revision: str

    @classmethod
    def find(cls, tt_metal: str | Path | None = None) -> "PortCode":
        spec = N16.port
        where = tt_metal or os.environ.get(TT_METAL_ENV)
        if not where:
            raise PortError(f"no tt-metal tree given: pass tt_metal= (--tt-metal DIR) or set {TT_METAL_ENV} to the "
                            f"checkout holding {spec['package'].replace('.', '/')}/")
        root = Path(where).expanduser().resolve()
        folder = root / Path(*str(spec["package"]).split("."))
        if not (folder / "tt").is_dir():
            raise PortError(f"{root}: no GR00T N1.6 port there ({folder} is missing); point --tt-metal (or "
                            f"{TT_METAL_ENV}) at a tt-metal checkout that has {spec['package'].replace('.', '/')}/")
        digest = hashlib.sha256()
        for path in sorted(folder.rglob("*.py")):
            if "tests" not in path.relative_to(folder).parts:
                digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes())
        return cls(root, str(spec["package"]), digest.hexdigest()[:16])

    def attr(self, ref: str) -> Any:
        """`module.path:Name` below the port's package, imported from this tree (another tree's modules are
        dropped first: two revisions can be used in one process)."""
        top = self.package.split(".")[0]
        loaded = sys.modules.get(top)
        if loaded is not None and not any(Path(p).resolve().is_relative_to(self.root)
                                          for p in getattr(loaded, "__path__", [])):
            for name in [n for n in sys.modules if n == top or n.startswith(top + ".")]:
                del sys.modules[name]
        if sys.path[:1] != [str(self.root)]:  # this tree's `models` before any other's
            sys.path[:] = [str(self.root)] + [p for p in sys.path if p != str(self.root)]
        module, name = ref.split(":")
        try:
            return getattr(importlib.import_module(f"{self.package}.{module}"), name)
        except ImportError as e:
            raise PortError(self._import_failure(module, e)) from None

    def _import_failure(self, module: str, error: ImportError) -> str:
        """The port's file whose import failed (the innermost frame in this tree), and the hint that fits: a module
        of the port's own package missing means a tree of another layout or age; anything else, a package this
        Python lacks."""
        failed, tb = None, error.__traceback__
        while tb is not None:
            path = Path(tb.tb_frame.f_code.co_filename)
            failed = path if path.is_relative_to(self.root) else failed
            tb = tb.tb_next
        where = failed.relative_to(self.root) if failed else f"{self.package.replace('.', '/')}/{module}"
        missing = error.name or ""
        if missing.split(".")[0] == self.package.split(".")[0]:
            hint = (f"{missing} is not in this tree, so it is a port of another layout or age than this converter "
                    f"reads ({self.package}); point --tt-metal at a checkout of that port")
        else:
            hint = f"install {missing.split('.')[0] or 'what it imports'} in this Python (the port needs ttnn, torch and diffusers)"
        return f"{self.root}: the port's {where} does not import ({error}); {hint}"

