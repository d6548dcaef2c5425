"""Recipes: the rules of `configs/recipes.toml` applied to a checkpoint's keys, giving the list of device targets.

Every source key ends up in exactly one target or in `skipped` with a reason; a key no rule consumes is an error
that names it. Pure: takes the key list and shapes, returns values.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from functools import cache
from typing import Mapping

from pipeline.layout import canonical_key
from pipeline.versions import CONFIG_DIR, load_config
from tasks.errors import ConfigError, RecipeError
from tasks.transforms import output_shape

RECIPES_PATH = CONFIG_DIR / "recipes.toml"


@dataclass(frozen=True)
class Target:
    """One array in the cache and one tensor on the device."""

    name: str                  # canonical name, e.g. llm.layers.5.self_attn.qkv.weight
    sources: tuple[str, ...]   # checkpoint keys, in concatenation order
    transform: str
    kind: str                  # matmul | bias | norm | table
    device_dtype: str          # bfloat16 | bfloat8_b
    layout: str                # TILE | ROW_MAJOR
    shape: tuple[int, ...]     # logical shape of one target (one slot for embodiment banks)
    embodiment: bool = False   # stored as [slots, *shape], one chunk per slot
    device_file: bool = False  # keep ttnn's .tensorbin of it too (packed dtypes always do)
    min_pcc: float = 1.0       # recipes.toml [min_pcc]: below it, the conversion fails


@dataclass(frozen=True)
class Plan:
    version: str
    profile: str
    targets: tuple[Target, ...]
    skipped: Mapping[str, str]  # key -> reason


@cache
def _recipes() -> dict:
    return tomllib.loads(RECIPES_PATH.read_text())


def _pattern(template: str, containers: Mapping[str, str]) -> re.Pattern[str]:
    out = []
    for token in re.split(r"(\{\w+\}|\*\*|\*)", template):
        if token == "{n}":
            out.append(r"(?P<n>\d+)")
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


def _expand(template: str, containers: Mapping[str, str], n: str) -> str:
    """A fused rule's source template with its container prefixes and layer number filled in."""
    out = template.replace("{n}", n)
    for role, prefix in containers.items():
        out = out.replace("{" + role + "}", prefix)
    return out


def _parity_ok(rule: dict, n: str | None) -> bool:
    parity = rule.get("parity")
    return parity is None or (n is not None and int(n) % 2 == (1 if parity == "odd" else 0))


def build_plan(version: str, shapes: Mapping[str, tuple[int, ...]], profile: str = "bf16") -> Plan:
    """Targets for a checkpoint whose keys and shapes are `shapes` (state-dict order is kept)."""
    cfg, recipes = load_config(version), _recipes()
    if profile not in recipes["profiles"]:
        raise ConfigError(f"unknown profile {profile!r}: expected one of {', '.join(recipes['profiles'])} ({RECIPES_PATH})")
    rules = []
    for name in cfg.recipe:
        if name not in recipes["rules"]:
            raise ConfigError(f"configs/{version}.toml names rule set {name!r}, which {RECIPES_PATH} does not define")
        rules += recipes["rules"][name]
    consumed: dict[str, str] = {}
    targets: list[Target] = []
    skipped: dict[str, str] = {}

    def make_target(rule: dict, name: str, sources: tuple[str, ...]) -> Target:
        kind = recipes["kinds"][rule["kind"]]
        dtype = recipes["profiles"][profile]["matmul"] if kind["dtype"] == "matmul" else kind["dtype"]
        shape = output_shape(rule["transform"], [shapes[s] for s in sources])
        keep = bool(recipes["profiles"][profile].get("device_files", False)) or dtype != "bfloat16"
        return Target(name, sources, rule["transform"], rule["kind"], dtype, kind["layout"], shape,
                      bool(rule.get("embodiment", False)), keep, float(recipes["min_pcc"][dtype]))

    for rule in rules:  # fused rules claim keys first, whatever their position
        if "sources" not in rule:
            continue
        first = _pattern(rule["sources"][0], cfg.containers)
        for key in shapes:
            m = first.match(key)
            if not m or key in consumed or not _parity_ok(rule, m.groupdict().get("n")):
                continue
            n = m.groupdict().get("n", "")
            sources = tuple(_expand(s, cfg.containers, n) for s in rule["sources"])
            missing = [s for s in sources if s not in shapes]
            if missing:
                raise RecipeError(f"rule for {rule['target']!r} fuses {key!r} with {missing[0]!r}, which the checkpoint lacks")
            name = rule["target"].replace("{n}", n)
            targets.append(make_target(rule, name, sources))
            consumed.update({s: name for s in sources})
    compiled = [(_pattern(r["match"], cfg.containers), r) for r in rules if "match" in r]
    for key in shapes:
        if key in consumed:
            continue
        rule = next((r for p, r in compiled if p.match(key)), None)
        if rule is None:
            raise RecipeError(f"{version}: no recipe rule consumes {key!r} (shape {list(shapes[key])}); add a rule "
                              f"or a skip with a reason to {RECIPES_PATH}")
        if "skip" in rule:
            skipped[key] = rule["skip"]
        else:
            targets.append(make_target(rule, canonical_key(version, key), (key,)))
        consumed[key] = rule.get("skip", "")
    order = {k: i for i, k in enumerate(shapes)}
    targets.sort(key=lambda t: order[t.sources[0]])
    return Plan(version, profile, tuple(targets), skipped)
