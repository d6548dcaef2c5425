"""Matching: each tensor the port asked for held to a target of the entry (sources, shape, dtype, layout), and the
layout revisions whose plan serves a port revision."""

from __future__ import annotations

from typing import Mapping

from pipeline.port_n16.code import N16, VERSION, PortCode, PortError
from pipeline.port_n16.trace import Listing, Request, construct, port_config
from pipeline.model.recipe import build_plan
from tasks.entries.entry import Entry


def _by_sources(entry: Entry) -> dict[tuple[str, ...], str]:
    return {tuple(a.attributes["sources"]): name for name, a in entry.manifest.arrays.items()}


def first_unserved(requests: list[Request], entry: Entry) -> Request | None:
    """The first request no target of the entry serves (sources, shape, dtype, layout, bank), or None."""
    arrays, by_sources = entry.manifest.arrays, _by_sources(entry)
    for r in requests:
        a = arrays.get(by_sources.get(r.sources, ""))
        if a is None or tuple(a.logical_shape) != r.shape or a.device_dtype != r.dtype or \
                a.device_layout != r.layout or a.bank != (r.slot is not None):
            return r
    return None


def match_targets(requests: list[Request], entry: Entry, code: PortCode) -> dict[tuple[str, ...], str]:
    """sources -> target name for every request, each held to its target's shape, dtype and layout; the first
    that no target serves is a PortError naming the layout revision that would (or that none does)."""
    by_sources = _by_sources(entry)
    r = first_unserved(requests, entry)
    if r is None:
        return by_sources
    name = by_sources.get(r.sources)
    a = entry.manifest.arrays.get(name) if name else None
    have = (f"its target {name} is a {a.logical_shape} {a.device_dtype} {a.device_layout}" if a else
            "no target of it has those sources")
    fits = layouts_serving(requests, entry.manifest.source_shapes, entry.manifest.profile)
    remedy = (f"convert with --layout {fits[0]} for this port revision" if fits else
              f"no supported layout revision ({', '.join(N16.port['layouts'])}) has it; "
              "this port revision is not supported")
    raise PortError(f"{code.root} (port revision {code.revision}) builds {r.describe()}, but entry "
                    f"{entry.name} ({entry.manifest.layout}) cannot hand it over: {have}; {remedy}")


def layouts_serving(requests: list[Request], source_shapes: Mapping[str, list[int]], profile: str) -> list[str]:
    """The layout revisions whose plan, for this checkpoint, has a target for every request."""
    shapes = {k: tuple(v) for k, v in source_shapes.items()}
    fits = []
    for layout in N16.port["layouts"]:
        plan = build_plan(VERSION, shapes, profile, layout)
        targets = {t.sources: t for t in plan.targets}
        if all(_serves(targets.get(r.sources), r) for r in requests):
            fits.append(layout)
    return fits


def _serves(target, request: Request) -> bool:
    """Whether a planned target is the tensor a request asks for (a bank's target: one slot of it)."""
    return target is not None and target.shape == request.shape and target.device_dtype == request.dtype and \
        target.device_layout == request.layout and target.embodiment == (request.slot is not None)



def serving_layout(code: PortCode) -> str:
    """The layout revision whose targets this port's constructors ask for, found by listing what they build for
    the published N1.6 shapes (no bytes: a fraction of a second)."""
    from pipeline.model.state_dict import tensor_specs as key_specs

    shapes = {s.key: list(s.shape) for s in key_specs(VERSION, "full")}
    listing = Listing()
    construct(code, port_config(code, shapes), shapes, None, listing)
    fits = layouts_serving(listing.requests, shapes, "port")
    if not fits:
        plan = {t.sources: t for t in build_plan(VERSION, {k: tuple(v) for k, v in shapes.items()}, "port",
                                                  N16.port["layouts"][0]).targets}
        first = next(r for r in listing.requests if not _serves(plan.get(r.sources), r))
        raise PortError(f"{code.root} (port revision {code.revision}) builds {first.describe()}: no supported "
                        f"layout revision ({', '.join(N16.port['layouts'])}) has it; this port "
                        "revision is not supported")
    return fits[0]
