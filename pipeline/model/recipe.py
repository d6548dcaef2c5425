"""Recipes: the rules of `configs/recipes.toml` applied to a checkpoint's keys, giving the list of device targets.

A layout (`tt-n16`: what tt-metal's GR00T N1.6 port builds; `tt-port`: its conventions for N1.5 and N1.7;
`generic`: the original unpadded layout) picks the
rule sets, the kinds (device layout and dtype per kind of tensor), the profiles it accepts and how targets are
named. Every source key ends up in exactly one target or in `skipped` with a reason; a key no rule consumes is
an error that names it. Pure: takes the key list and shapes, returns values.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
import tomllib
from functools import cache
from typing import Mapping

from pipeline.model.state_dict import dims_of, short_key, unit_of
from pipeline.model.versions import VersionConfig, load_config
from tasks.config_files import CONFIG_DIR
from tasks.errors import ConfigError, RecipeError
from tasks.plan import HOST, Plan, Target
from tasks.numerics.transforms import output_shape, padded_dim

RECIPES_PATH = CONFIG_DIR / "recipes.toml"


def recipes_sha256() -> str:
    """The rules' identity: every entry, and every kept port verdict, is a function of them."""
    return hashlib.sha256(RECIPES_PATH.read_bytes()).hexdigest()


@cache
def recipes() -> dict:
    """configs/recipes.toml, with each layout that `extends` another completed from it (a port revision that
    changes a few rules keeps the rest: naming, profiles, kinds)."""
    book = tomllib.loads(RECIPES_PATH.read_text())
    for spec in book["layouts"].values():
        if "extends" in spec:
            for key, value in book["layouts"][spec["extends"]].items():
                spec.setdefault(key, value)
    return book


def resolve(version: str, layout: str | None = None, profile: str | None = None) -> tuple[str, str]:
    """The layout (default: the version's) and profile (default: the layout's) a request means, both checked."""
    return layout_and_profile(load_config(version), layout, profile)


def layout_and_profile(cfg: VersionConfig, layout: str | None, profile: str | None) -> tuple[str, str]:
    """`resolve`, for a caller that holds the version's config already."""
    layouts = recipes()["layouts"]
    layout = layout or cfg.default_layout
    if layout not in cfg.layouts:
        raise ConfigError(f"unknown layout {layout!r} for {cfg.version}: expected one of {', '.join(cfg.layouts)} "
                          f"(configs/{cfg.version}.toml [layouts])")
    known = layouts[layout]["profiles"]
    profile = profile or layouts[layout]["default_profile"]
    if profile not in known:
        raise ConfigError(f"unknown profile {profile!r} for layout {layout}: expected one of {', '.join(known)} "
                          f"({RECIPES_PATH})")
    return layout, profile


def _pattern(template: str, containers: Mapping[str, str]) -> re.Pattern[str]:
    out = []
    for token in re.split(r"(\{\w+\}|\*\*|\*)", template):
        if token == "{n}":
            out.append(r"(?P<n>\d+)")
        elif token == "{part}":
            out.append(r"(?P<part>[^.]+)")
        elif token.startswith("{"):
            role = token[1:-1]
            if role not in containers:
                return re.compile(r"(?!)")  # this version has no such container: the rule matches nothing
            out.append(re.escape(containers[role]))
        elif token == "**":
            out.append(r".*")
        elif token == "*":
            out.append(r"[^.]*")
        else:
            out.append(re.escape(token))
    return re.compile("".join(out) + r"\Z")


def _fill(template: str, containers: Mapping[str, str], groups: Mapping[str, str | None]) -> str:
    """A template with its container prefixes and captured `{n}` / `{part}` filled in."""
    out = template
    for name, value in groups.items():
        out = out.replace("{" + name + "}", value or "")
    for role, prefix in containers.items():
        out = out.replace("{" + role + "}", prefix)
    return out


def _parity_ok(rule: dict, n: str | None) -> bool:
    parity = rule.get("parity")
    return parity is None or (n is not None and int(n) % 2 == (1 if parity == "odd" else 0))


@dataclass(frozen=True, kw_only=True)
class _Making:
    """What every target of one plan is made with: the checkpoint's shapes and dims, the layout's kinds, the
    profile."""
    cfg: VersionConfig
    shapes: Mapping[str, tuple[int, ...]]
    dims: Mapping[str, int]
    kinds: Mapping[str, dict]
    profile: str
    profile_spec: Mapping[str, object]
    min_pcc: Mapping[str, float]
    dtypes: Mapping[str, str]

    def target(self, rule: dict, name: str, sources: tuple[str, ...]) -> Target:
        kind = self.kinds[rule["kind"]]
        dtype = kind["dtype"]
        if dtype in ("rule", "profile"):  # a matmul weight: the profile's dtype, else the consumer's (the rule's)
            dtype = self.profile_spec.get("matmul") or rule.get("dtype")
            if dtype is None:
                raise ConfigError(f"{RECIPES_PATH}: the rule for {sources[0]!r} gives no dtype and profile "
                                  f"{self.profile!r} none either")
        source_shapes = [self.shapes[s] for s in sources]
        params = self._padding(rule, sources[0], source_shapes)
        embodiment = bool(rule.get("embodiment", False))
        return Target(name=name, sources=sources, transform=rule["transform"], kind=rule["kind"], device_dtype=dtype,
                      device_layout=kind["layout"], shape=output_shape(rule["transform"], source_shapes, params),
                      embodiment=embodiment,
                      device_file=kind["layout"] != HOST and (bool(self.profile_spec.get("device_files", False))
                                                              or dtype != "bfloat16"),
                      min_pcc=float(self.min_pcc[dtype]), params=params,
                      bank_slots=source_shapes[0][0] if embodiment else 0, mirrors=rule.get("mirrors", ""),
                      unit=unit_of(self.cfg, sources[0]), source_dtypes=tuple(self.dtypes.get(s, "BF16") for s in sources))

    def _padding(self, rule: dict, key: str, source_shapes: list) -> tuple[int, ...]:
        """(heads, head_dim, padded_head_dim) of a head-padding rule, checked against the key's shape; else ()."""
        if "padded_head_dim" not in rule:
            return ()
        params = (int(self.dims[rule["heads"]]), int(self.dims[rule["head_dim"]]), int(rule["padded_head_dim"]))
        split = padded_dim(rule["transform"], source_shapes)
        if split != params[0] * params[1] or params[2] < params[1]:
            raise RecipeError(f"{self.cfg.version}: {key!r} has shape {list(source_shapes[0])}, but the rule pads "
                              f"{params[0]} heads of {params[1]} to {params[2]} (expected a dim of "
                              f"{params[0] * params[1]}); the checkpoint does not have {self.cfg.version}'s attention shapes")
        return params


def _rules(cfg: VersionConfig, layout: str) -> list[dict]:
    """The layout's rules for this version, its rule sets in order (the layout checked by `layout_and_profile`)."""
    book, rules = recipes(), []
    for name in cfg.layouts[layout]:
        if name not in book["rules"]:
            raise ConfigError(f"configs/{cfg.version}.toml names rule set {name!r}, which {RECIPES_PATH} does not define")
        rules += book["rules"][name]
    return rules


def _fused(making: _Making, rules: list[dict], containers: Mapping[str, str], consumed: dict) -> list[Target]:
    """The targets of the rules that fuse several keys (they claim their keys first, whatever their position)."""
    targets = []
    for rule in (r for r in rules if "sources" in r):
        first = _pattern(rule["sources"][0], containers)
        for key in making.shapes:
            m = first.match(key)
            if not m or key in consumed or not _parity_ok(rule, m.groupdict().get("n")):
                continue
            sources = tuple(_fill(s, containers, m.groupdict()) for s in rule["sources"])
            missing = [s for s in sources if s not in making.shapes]
            if missing:
                raise RecipeError(f"rule for {rule['target']!r} fuses {key!r} with {missing[0]!r}, which the checkpoint lacks")
            name = _fill(rule["target"], {}, m.groupdict())
            targets.append(making.target(rule, name, sources))
            consumed.update({s: name for s in sources})
    return targets


def build_plan(version: str, shapes: Mapping[str, tuple[int, ...]], profile: str | None = None,
               layout: str | None = None, dtypes: Mapping[str, str] | None = None) -> Plan:
    """Targets for a checkpoint whose keys and shapes are `shapes` (state-dict order is kept) and whose
    safetensors dtypes are `dtypes` (default: BF16 throughout, as every release)."""
    cfg, book = load_config(version), recipes()  # the one lookup: everything below takes cfg
    layout, profile = layout_and_profile(cfg, layout, profile)
    spec = book["layouts"][layout]
    making = _Making(cfg=cfg, shapes=shapes, dims=dims_of(cfg, shapes), kinds=spec["kinds"], profile=profile,
                     profile_spec=book["profiles"][profile], min_pcc=book["min_pcc"], dtypes=dtypes or {})
    names = "components" if spec["naming"] == "component" else "containers"
    rules, consumed, skipped = _rules(cfg, layout), {}, {}
    targets = _fused(making, rules, cfg.containers, consumed)
    compiled = [(_pattern(r["match"], cfg.containers), r) for r in rules if "match" in r]
    for key in (k for k in shapes if k not in consumed):  # then one key per target: the first rule that matches
        m, rule = next(((m, r) for p, r in compiled if (m := p.match(key))), (None, None))
        if rule is None:
            raise RecipeError(f"{version}: no {layout} recipe rule consumes {key!r} (shape {list(shapes[key])}); add "
                              f"a rule or a skip with a reason to {RECIPES_PATH}")
        if "skip" in rule:
            skipped[key] = rule["skip"]
        else:
            name = _fill(rule["target"], {}, m.groupdict()) if "target" in rule else short_key(cfg, key, names)
            targets.append(making.target(rule, name, (key,)))
        consumed[key] = rule.get("skip", "")
    order = {k: i for i, k in enumerate(shapes)}
    targets.sort(key=lambda t: order[t.sources[0]])
    return Plan(version=version, profile=profile, targets=tuple(targets), skipped=skipped, layout=layout)
