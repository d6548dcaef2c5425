"""Recipes: the rules of `configs/recipes.toml` applied to a checkpoint's keys, giving the list of device targets.

A layout (`tt-n16`: what tt-metal's GR00T N1.6 port builds; `tt-port`: its conventions for N1.5 and N1.7;
`generic`: the original unpadded layout) picks the
rule sets, the kinds (device layout and dtype per kind of tensor), the profiles it accepts and how targets are
named. Every source key ends up in exactly one target or in `skipped` with a reason; a key no rule consumes is
an error that names it. Pure: takes the key list and shapes, returns values.
"""

from __future__ import annotations

import re
import tomllib
from functools import cache
from typing import Mapping

from pipeline.layout import dims_of, short_key
from pipeline.versions import CONFIG_DIR, load_config
from tasks.errors import ConfigError, RecipeError
from tasks.plan import HOST, Plan, Target
from tasks.transforms import output_shape, padded_dim

RECIPES_PATH = CONFIG_DIR / "recipes.toml"
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
    cfg, layouts = load_config(version), recipes()["layouts"]
    layout = layout or cfg.default_layout
    cfg.rule_sets(layout)  # unknown for this version: an error listing the known ones
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


def build_plan(version: str, shapes: Mapping[str, tuple[int, ...]], profile: str | None = None,
               layout: str | None = None) -> Plan:
    """Targets for a checkpoint whose keys and shapes are `shapes` (state-dict order is kept)."""
    layout, profile = resolve(version, layout, profile)
    cfg, book = load_config(version), recipes()
    spec, prof = book["layouts"][layout], book["profiles"][profile]
    dims = dims_of(version, shapes)
    rules = []
    for name in cfg.rule_sets(layout):
        if name not in book["rules"]:
            raise ConfigError(f"configs/{version}.toml names rule set {name!r}, which {RECIPES_PATH} does not define")
        rules += book["rules"][name]
    consumed: dict[str, str] = {}
    targets: list[Target] = []
    skipped: dict[str, str] = {}
    names = "components" if spec["naming"] == "component" else "containers"

    def make_target(rule: dict, name: str, sources: tuple[str, ...]) -> Target:
        kind = spec["kinds"][rule["kind"]]
        dtype = kind["dtype"]
        if dtype in ("rule", "profile"):  # a matmul weight: the profile's dtype, else the consumer's (the rule's)
            dtype = prof.get("matmul") or rule.get("dtype")
            if dtype is None:
                raise ConfigError(f"{RECIPES_PATH}: the rule for {sources[0]!r} gives no dtype and profile "
                                  f"{profile!r} none either")
        source_shapes = [shapes[s] for s in sources]
        params: tuple[int, ...] = ()
        if "padded_head_dim" in rule:
            params = (int(dims[rule["heads"]]), int(dims[rule["head_dim"]]), int(rule["padded_head_dim"]))
            split = padded_dim(rule["transform"], source_shapes)
            if split != params[0] * params[1] or params[2] < params[1]:
                raise RecipeError(f"{version}: {sources[0]!r} has shape {list(source_shapes[0])}, but the rule pads "
                                  f"{params[0]} heads of {params[1]} to {params[2]} (expected a dim of "
                                  f"{params[0] * params[1]}); the checkpoint does not have {version}'s attention shapes")
        shape = output_shape(rule["transform"], source_shapes, params)
        keep = kind["layout"] != HOST and (bool(prof.get("device_files", False)) or dtype != "bfloat16")
        embodiment = bool(rule.get("embodiment", False))
        return Target(name, sources, rule["transform"], rule["kind"], dtype, kind["layout"], shape, embodiment,
                      keep, float(book["min_pcc"][dtype]), params, source_shapes[0][0] if embodiment else 0,
                      rule.get("mirrors", ""))

    for rule in rules:  # fused rules claim keys first, whatever their position
        if "sources" not in rule:
            continue
        first = _pattern(rule["sources"][0], cfg.containers)
        for key in shapes:
            m = first.match(key)
            if not m or key in consumed or not _parity_ok(rule, m.groupdict().get("n")):
                continue
            sources = tuple(_fill(s, cfg.containers, m.groupdict()) for s in rule["sources"])
            missing = [s for s in sources if s not in shapes]
            if missing:
                raise RecipeError(f"rule for {rule['target']!r} fuses {key!r} with {missing[0]!r}, which the checkpoint lacks")
            name = _fill(rule["target"], {}, m.groupdict())
            targets.append(make_target(rule, name, sources))
            consumed.update({s: name for s in sources})
    compiled = [(_pattern(r["match"], cfg.containers), r) for r in rules if "match" in r]
    for key in shapes:
        if key in consumed:
            continue
        m, rule = next(((m, r) for p, r in compiled if (m := p.match(key))), (None, None))
        if rule is None:
            raise RecipeError(f"{version}: no {layout} recipe rule consumes {key!r} (shape {list(shapes[key])}); add "
                              f"a rule or a skip with a reason to {RECIPES_PATH}")
        if "skip" in rule:
            skipped[key] = rule["skip"]
        else:
            name = _fill(rule["target"], {}, m.groupdict()) if "target" in rule else short_key(version, key, names)
            targets.append(make_target(rule, name, (key,)))
        consumed[key] = rule.get("skip", "")
    order = {k: i for i, k in enumerate(shapes)}
    targets.sort(key=lambda t: order[t.sources[0]])
    return Plan(version, profile, tuple(targets), skipped, layout)
