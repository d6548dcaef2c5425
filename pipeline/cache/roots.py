"""Where the cache is and where entries are built: the root (`--cache`, $GR00T_CACHE, the checkout's `cache/`, else
the user's cache folder), the store over it, and the temporary folder an entry is built in (adopting a dead
process's work on the same entry: resume)."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from tasks.entries.entry import Entry, open_entry
from tasks.entries.names import ENTRIES, HF, TMP_MARK, tmp_name, tmp_owner
from tasks.entries.cache_root import open_store
from tasks.entries.store import LocalStore, Store, is_url
from tasks.errors import CacheError
from tasks.old_paths import names_moved


def _default_root() -> Path:
    """The source checkout's `cache/` when running from one (its cache/README.md is there), else, installed from a
    wheel, the user's cache folder ($XDG_CACHE_HOME/gr00t-tt, ~/.cache/gr00t-tt): never site-packages."""
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "cache" / "README.md").is_file() and (checkout / "pyproject.toml").is_file():
        return checkout / "cache"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gr00t-tt"


DEFAULT_ROOT = _default_root()


def cache_root(root: Path | str | None = None) -> Path:
    """The local cache: `--cache`, else $GR00T_CACHE when it names a folder, else the project's `cache/` folder.
    (An object-store $GR00T_CACHE is handled by convert/load, which build locally here and push there.)"""
    env = os.environ.get("GR00T_CACHE")
    return Path(root or (env if env and not is_url(env) else None) or DEFAULT_ROOT)



def synthetic_hf_cache(cache_dir: Path | str | None = None) -> Path:
    """Where `synth` writes by default and `make demo` synthesizes, read only for --synthetic: `hf/` under the
    cache root (`--cache`, $GR00T_CACHE when it is a folder, else the project's `cache/`)."""
    return cache_root(cache_dir if cache_dir is not None and not is_url(str(cache_dir)) else None) / HF


def entries_dir(root: Path) -> Path:
    return root / ENTRIES


def pid_alive(pid: int) -> bool:
    """Whether a process of this id runs on this machine (one owned by another user counts)."""
    import psutil

    return psutil.pid_exists(pid)


def claim_tmp(root: Path, name: str) -> Path:
    """A fresh temporary directory for `name`, adopting the work of a dead process that was building the same
    entry (resume), and removing other orphans of dead processes."""
    base = entries_dir(root)
    base.mkdir(parents=True, exist_ok=True)
    mine = base / tmp_name(name, os.getpid(), uuid.uuid4().hex[:8])
    for orphan in sorted(base.glob(f"*{TMP_MARK}*"), key=lambda p: p.stat().st_mtime, reverse=True):
        owner = tmp_owner(orphan.name)
        if owner is None or pid_alive(owner):
            continue
        try:
            if orphan.name.startswith(name + TMP_MARK) and not mine.exists():
                os.rename(orphan, mine)  # resume: rename is atomic, so two resumers cannot both adopt it
            else:
                shutil.rmtree(orphan)
        except FileNotFoundError:
            pass  # another process adopted or removed it first
    mine.mkdir(exist_ok=True)
    return mine


def writable_folder(root: Path, what: str) -> None:
    """Refuse, before anything is read, a cache (or HF cache) folder that is a file or cannot be written."""
    if root.exists() and not root.is_dir():
        raise CacheError(f"{root}: the {what} is a file, not a folder; pass a folder (it is made if missing)")
    probe = root / f".write-probe-{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe.touch()
        probe.unlink()
    except OSError as e:
        raise CacheError(f"{root}: cannot write to this {what} folder ({e.strerror}); pass one you can write "
                         f"({'--cache DIR or $GR00T_CACHE' if what == 'cache' else '--hf-cache DIR'})") from None


def cache_store(root: Store | Path | str | None = None, stall: float | None = None) -> Store:
    """The cache `--cache` names, else $GR00T_CACHE (a folder or an object-store URL), else the project's folder
    (`stall`: an object store's stall limit, `--stall-seconds`; None: the default)."""
    return open_store(root if root is not None else os.environ.get("GR00T_CACHE") or DEFAULT_ROOT, stall)


def entry_at(path: Path) -> Entry:
    """The published entry in a local folder `<root>/entries/<name>`."""
    return open_entry(LocalStore(path.parent.parent), path.name)




# Names that left this module (deprecated, CHANGELOG.md): where entries are built is the cache's home's
__getattr__ = names_moved("pipeline.cache.roots", dict.fromkeys(("build_root", "build_store"), "pipeline.cache.homes"))
