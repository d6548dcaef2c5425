"""Version configs: `configs/<version>.toml` read into one frozen value, plus the facts derived from it.

A config is data (repo, pinned revision, expected counts, container prefixes, architecture families, dims,
embodiment tag table). Everything else — the key list, the shard assignment, the units — is derived in
`pipeline.model.state_dict`, so the tables cannot drift from the numbers they come from.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from functools import cache
from types import MappingProxyType
from typing import Mapping

from tasks.config_files import CONFIG_DIR
from tasks.errors import ConfigError

# The modules whose tensors are `[32, in, out]` embodiment banks (W) and `[32, out]` biases (b).
EMBODIMENT_MODULES = (
    "state_encoder.layer1", "state_encoder.layer2",
    "action_encoder.W1", "action_encoder.W2", "action_encoder.W3",
    "action_decoder.layer1", "action_decoder.layer2",
)


@dataclass(frozen=True, kw_only=True)
class VersionConfig:
    version: str
    title: str
    repo_id: str
    revision: str
    dtype: str
    max_shard_size: int
    expected: Mapping[str, object]
    containers: Mapping[str, str]
    architecture: Mapping[str, str]
    dims: Mapping[str, int]
    scaled_dims: Mapping[str, Mapping[str, int | str]]  # scale -> the dims it overrides, and its based_on
    layouts: Mapping[str, tuple[str, ...]]        # layout -> rule sets of configs/recipes.toml, tried in order
    default_layout: str
    components: Mapping[str, str]                 # the port's weight groups: component -> key prefix
    embodiment_ids: Mapping[str, int] = field(default_factory=dict)  # the built-in table ([embodiments])
    lerobot: Mapping[str, object] = field(default_factory=dict)  # LeRobot's own table, as its release ships it
    port: Mapping[str, object] = field(default_factory=dict)  # the consumer's code: configs/<version>.toml [port]

    def dims_for(self, scale: str) -> Mapping[str, int]:
        """The real dims (`full`), or stand-ins: `tiny` keeps every key and count with small dims, `attn` keeps the
        real attention shapes with one or two layers per stack, `micro` is tiny with one or two layers per stack
        (a scale's `based_on` names the scale it overrides, else `full`)."""
        if scale == "full":
            return self.dims
        if scale in self.scaled_dims:
            scaled = dict(self.scaled_dims[scale])
            base = self.dims_for(str(scaled.pop("based_on"))) if "based_on" in scaled else self.dims
            return MappingProxyType({**base, **scaled})
        raise ConfigError(f"unknown scale {scale!r}: expected one of {', '.join(SCALES)}")

    @property
    def embodiment_keys(self) -> tuple[str, ...]:
        """The 14 embodiment-indexed keys (7 banks W and their biases b)."""
        head = self.containers["action_head"]
        return tuple(f"{head}{m}.{p}" for m in EMBODIMENT_MODULES for p in ("W", "b"))

    @property
    def num_slots(self) -> int:
        return int(self.dims["embodiments"])


VERSIONS = tuple(sorted(p.stem for p in CONFIG_DIR.glob("n*.toml")))
SCALES = ("full", "tiny", "attn", "micro")


@cache
def load_config(version: str) -> VersionConfig:
    """Read `configs/<version>.toml`; an unknown version is an error that lists the known ones."""
    path = CONFIG_DIR / f"{version}.toml"
    if version not in VERSIONS:
        raise ConfigError(f"unknown version {version!r}: expected one of {', '.join(VERSIONS)} (files in {CONFIG_DIR})")
    raw = tomllib.loads(path.read_text())
    dims = dict(raw["dims"])
    scaled = {scale: MappingProxyType(dims.pop(scale)) for scale in SCALES[1:] if scale in dims}
    return VersionConfig(
        version=raw["version"], title=raw["title"], repo_id=raw["repo_id"], revision=raw["revision"],
        dtype=raw["dtype"], max_shard_size=int(raw["max_shard_size"]),
        expected=MappingProxyType(raw["expected"]), containers=MappingProxyType(raw["containers"]),
        architecture=MappingProxyType(raw["architecture"]),
        dims=MappingProxyType(dims), scaled_dims=MappingProxyType(scaled),
        layouts=MappingProxyType({k: tuple(v) for k, v in raw["layouts"].items()}),
        default_layout=raw["default_layout"], components=MappingProxyType(raw["components"]),
        port=MappingProxyType(raw.get("port", {})),
        embodiment_ids=MappingProxyType(raw.get("embodiments", {})),
        lerobot=MappingProxyType(raw.get("lerobot", {})),
    )
