"""Find the snapshot to convert: `--snapshot DIR`; a synthetic stand-in, only when asked (`--synthetic SCALE`); else
the real release from the user's Hugging Face cache at `--revision` (default: the pinned one), fetched with
huggingface_hub's own `snapshot_download` when the hub is allowed. The user's cache is never swapped for the
project's folder, and a miss lists the revisions that are present.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

from pipeline.model.versions import VERSIONS, VersionConfig
from pipeline.inputs.trainer_files import HUB_FILES
from tasks.source.checkpoint import INDEX_NAME, SINGLE_NAME
from tasks.io.file_blocks import is_remote, is_url, source_path
from tasks.errors import CheckpointError, ConfigError

# Synthetic snapshots live under an org of their own (not a hub org; never NVIDIA's), one repo per scale.
SYNTHETIC_ORG = "gr00t-tt-synthetic"


def synthetic_repo_id(cfg: VersionConfig, scale: str) -> str:
    return f"{SYNTHETIC_ORG}/{cfg.repo_id.split('/')[-1]}-{scale}"


def default_hf_cache() -> Path:
    """HF_HUB_CACHE (or HF_HOME/hub, or ~/.cache/huggingface/hub), as huggingface_hub resolves it."""
    from huggingface_hub import constants  # lazy, as below: 0.1 s to import, and a folder's convert never needs it

    return Path(os.environ.get("HF_HUB_CACHE") or (Path(os.environ["HF_HOME"]) / "hub" if "HF_HOME" in os.environ
                                                   else constants.HF_HUB_CACHE))


def hf_cache_folder(where: str | os.PathLike) -> Path:
    """--hf-cache: a folder on this machine, where huggingface_hub keeps its snapshots. A URL is refused: as a path,
    `s3://bucket/x` is the local folder `s3:/bucket/x`, which a synth or a download would fill in silence."""
    if is_url(str(where)):
        raise ConfigError(f"{where}: the Hugging Face cache is a folder on this machine, not a URL; pass a folder, or "
                          "pass a checkpoint in an object store with --snapshot s3://bucket/prefix")
    return Path(where)


def repo_folder(repo_id: str, hf_cache: Path) -> Path:
    """`models--org--name` under the cache, as huggingface_hub names it."""
    return Path(hf_cache) / ("models--" + repo_id.replace("/", "--"))


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def _present(repo_id: str, cache_dir: Path) -> str:
    snaps = repo_folder(repo_id, cache_dir) / "snapshots"
    revs = sorted(p.name for p in snaps.iterdir()) if snaps.is_dir() else []
    return f"revisions present: {', '.join(revs)}" if revs else "no revision of it is present"


def _lookup(host: str, port: int, found: list) -> None:
    try:
        found.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
    except (OSError, UnicodeError):
        found.append(f"its name {host} does not resolve")


def hub_unreachable(endpoint: str | None = None, timeout: float = 4.0) -> str | None:
    """Why the hub cannot be reached from here (its name does not resolve, or nothing answers on its port), or None.
    huggingface_hub retries a dead route for about 30 s before it gives up; this asks once, within `timeout` in
    all, so a machine without network is answered at once."""
    from huggingface_hub import constants

    deadline = time.monotonic() + timeout
    url = urllib.parse.urlsplit(endpoint or constants.ENDPOINT)
    host, port = url.hostname, url.port or (443 if url.scheme == "https" else 80)
    if not host:
        return f"HF_ENDPOINT {endpoint or constants.ENDPOINT!r} names no host"
    proxy = urllib.request.getproxies().get(url.scheme)
    if proxy and not urllib.request.proxy_bypass(host):  # the route is the proxy's (HTTPS_PROXY, as the hub's client)
        via = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        host, port = via.hostname or host, via.port or (443 if via.scheme == "https" else 80)
    found: list = []
    lookup = threading.Thread(target=_lookup, args=(host, port, found), daemon=True)  # no timeout of its own:
    lookup.start()                                                                    # a hung one is left behind
    lookup.join(timeout / 2)
    if not found:
        return f"its name {host} did not resolve within {timeout / 2:g} s"
    if isinstance(found[0], str):
        return found[0]
    addresses, reason = found[0], "no address"
    for family, kind, proto, _, address in addresses:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.settimeout(max(0.1, deadline - time.monotonic()))
                probe.connect(address)
                return None
        except OSError as e:
            reason = e.strerror or type(e).__name__
    return f"{host}:{port} did not answer ({reason})"


def _not_cached(repo_id: str, revision: str, cache_dir: Path, why: str, offline_hint: str) -> CheckpointError:
    return CheckpointError(
        repo_folder(repo_id, cache_dir), f"{repo_id} at revision {revision} is not in the Hugging Face cache "
        f"({_present(repo_id, cache_dir)}) and {why}. Fetch it with `hf download {repo_id} --revision {revision} "
        f"--cache-dir {cache_dir}`, or pass --revision REV or --snapshot DIR{offline_hint}")


def _from_hub(repo_id: str, revision: str, cache_dir: Path, offline_hint: str = "") -> Path:
    """A repo's snapshot from the HF cache, else fetched with huggingface_hub (unless offline, or the hub cannot be
    reached); a miss names the `hf download` command (and `offline_hint`)."""
    from huggingface_hub import snapshot_download, try_to_load_from_cache

    for name in (INDEX_NAME, SINGLE_NAME):
        found = try_to_load_from_cache(repo_id, name, cache_dir=str(cache_dir), revision=revision)
        if isinstance(found, str):
            return Path(found).parent
    if hub_offline():
        raise _not_cached(repo_id, revision, cache_dir, "HF_HUB_OFFLINE is set", offline_hint)
    unreachable = hub_unreachable()
    if unreachable:
        raise _not_cached(repo_id, revision, cache_dir, f"the hub could not be reached ({unreachable})", offline_hint)
    try:
        return Path(snapshot_download(repo_id, revision=revision, cache_dir=str(cache_dir), allow_patterns=HUB_FILES))
    except Exception as e:  # auth, unknown revision, a dropped connection: say what failed and what to run
        raise CheckpointError(repo_folder(repo_id, cache_dir), f"{repo_id} at revision {revision} is not "
                              f"in the Hugging Face cache and could not be fetched ({type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''}); {_present(repo_id, cache_dir)}; "
                              "pass --snapshot DIR or --revision REV") from None


def resolve_snapshot(cfg: VersionConfig | None, snapshot: Path | None = None, hf_cache: Path | None = None,
                     revision: str | None = None, synthetic: str | None = None, model: str | None = None,
                     stall: float | None = None) -> Path:
    """The checkpoint to read: a folder (sharded with an index, or `*.safetensors` without one) or one file.
    `cfg` may be None with `snapshot` or `model` (the version is then found from the keys). `stall`: the stall
    limit of a snapshot in an object store (None: the default), carried by its path to every read."""
    named = [f"--{n} {v}" for n, v in (("snapshot", snapshot), ("synthetic", synthetic), ("model", model)) if v is not None]
    if len(named) > 1:
        raise ConfigError(f"{' and '.join(named)} name {'two' if len(named) == 2 else 'three'} sources: pass one (a "
                          "synthetic stand-in is found by its scale alone)")
    if synthetic is not None and revision is not None:
        raise ConfigError(f"--revision {revision} does not apply to --synthetic {synthetic}: a synthetic stand-in has "
                          "the revision of what was synthesized; leave out --revision (or convert the release)")
    if snapshot is not None and revision is not None:  # a folder is read as it is: a revision would be ignored
        raise ConfigError(f"--revision {revision} does not apply to --snapshot {snapshot}: a folder is read as it is; "
                          "leave out --revision, or name the repo with --model OWNER/NAME --revision REV")
    if snapshot is None:
        return _in_hf_cache(cfg, hf_cache, revision, synthetic, model)
    # found; what it holds is read once, by pipeline/inputs/folder.py `read_folder`
    return source_path(str(snapshot) if is_remote(snapshot) else snapshot, stall)


def _in_hf_cache(cfg: VersionConfig | None, hf_cache: Path | None, revision: str | None, synthetic: str | None,
                 model: str | None) -> Path:
    """The snapshot of a hub repo in an HF cache: `--model`'s, a synthetic stand-in, or the release (fetched when
    missing and the hub is allowed)."""
    from huggingface_hub import try_to_load_from_cache

    if model is not None:
        if model.count("/") != 1 or not all(model.split("/")):
            raise ConfigError(f"--model {model!r} is not a Hugging Face repo id: pass OWNER/NAME")
        return _from_hub(model, revision or "main", Path(hf_cache or default_hf_cache()))
    if cfg is None:
        raise ConfigError(f"pass --version (one of {', '.join(VERSIONS)}) to convert a release, or --snapshot DIR or "
                          "--model OWNER/NAME to convert a fine-tune")
    if synthetic is not None:
        repo_id, cache_dir = synthetic_repo_id(cfg, synthetic), Path(hf_cache)  # the caller's: cache.synthetic_hf_cache
        found = try_to_load_from_cache(repo_id, INDEX_NAME, cache_dir=str(cache_dir), revision=revision or "main")
        if isinstance(found, str):
            return Path(found).parent
        raise CheckpointError(repo_folder(repo_id, cache_dir), f"no synthetic {synthetic} {cfg.version} here; make one "
                              f"with `python -m pipeline synth --version {cfg.version} --scale {synthetic}"
                              f"{'' if hf_cache is None else f' --hf-cache {cache_dir}'}`")
    cache_dir, revision = Path(hf_cache or default_hf_cache()), revision or cfg.revision
    return _from_hub(cfg.repo_id, revision, cache_dir, f" (for a synthetic stand-in instead: --synthetic tiny after "
                                                        f"`python -m pipeline synth --version {cfg.version}`)")
