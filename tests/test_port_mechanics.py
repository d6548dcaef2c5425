"""The hand-off's mechanics (pipeline/port_n16/: trace.py, build.py, kept.py) against a small fake port defined here,
so they are held without the pinned port tree: `ttnn.from_torch` is intercepted however it is called and always put
back; every placeholder the port was handed ends up replaced, or the build stops by name; a kept model comes back as
it was (shared objects, cycles, tables, the tensors the port made), a damaged one does not, and one holding anything
else is not kept."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

ttnn = pytest.importorskip("ttnn")

from pipeline.port_n16 import PortCode, PortError, trace  # noqa: E402
from pipeline.port_n16.build import Fill, check_filled, fill_in  # noqa: E402
from pipeline.port_n16.trace import Listing, intercepted  # noqa: E402

FAKE_PORT = PortCode(Path("/fake/tt-metal"), __name__.split(".")[0], "fake")  # this module's classes are "the port"


@dataclass
class Traced:
    """What the interception looks at on a traced weight."""
    sources: tuple
    slot: int | None
    shape: tuple


class Block:  # a port module: the walk fills what it holds
    def __init__(self, **attributes):
        self.__dict__.update(attributes)


def _weight(key: str) -> Traced:
    return Traced((key,), None, (32, 64))


def test_from_torch_is_put_back_however_the_constructors_end():
    real = ttnn.from_torch
    with pytest.raises(ValueError):
        with intercepted(Listing(), Traced):
            assert ttnn.from_torch is not real
            raise ValueError("the port's constructor failed")
    assert ttnn.from_torch is real


def test_arguments_are_read_by_name_however_they_are_passed():
    listing = Listing()
    with intercepted(listing, Traced):
        ttnn.from_torch(_weight("a"), ttnn.bfloat8_b, layout=ttnn.TILE_LAYOUT)
        ttnn.from_torch(tensor=_weight("b"), dtype=ttnn.bfloat16)
        ttnn.from_torch(_weight("c"), dtype=ttnn.bfloat4_b, layout=ttnn.TILE_LAYOUT, device=object())
        with pytest.raises(TypeError):  # ttnn's own parameters are keyword-only: refused as ttnn refuses them
            ttnn.from_torch(_weight("d"), ttnn.bfloat16, ttnn.TILE_LAYOUT)
        with pytest.raises(PortError, match=r"from e with tile=; the entry's device files are made without it"):
            ttnn.from_torch(_weight("e"), ttnn.bfloat16, tile=ttnn.Tile((16, 32)))
    got = [(r.sources[0], r.dtype, r.layout, r.on_device) for r in listing.requests]
    assert got == [("a", "bfloat8_b", "TILE", False), ("b", "bfloat16", "ROW_MAJOR", False),
                   ("c", "bfloat4_b", "TILE", True)]


def _built(hide_one: bool):
    """A fake port's model holding three weights: in an attribute, a dict and a list, and (when `hide_one`) one
    more in a set, where no walk can replace it."""
    listing = Listing()
    with intercepted(listing, Traced):
        model = Block(proj=ttnn.from_torch(_weight("proj")),
                      by_slot={0: ttnn.from_torch(_weight("bank"))},
                      layers=[Block(fc=ttnn.from_torch(_weight("fc")))])
        if hide_one:
            model.hidden = {ttnn.from_torch(_weight("hidden"))}
    return model, listing


def test_every_placeholder_is_replaced_by_its_loaded_tensor():
    model, listing = _built(hide_one=False)
    fill = Fill(traced=Traced, filled=[f"loaded {r.sources[0]}" for r in listing.requests], host={}, code=FAKE_PORT)
    model = fill_in(model, fill)
    check_filled(fill, listing.requests)
    assert (model.proj, model.by_slot[0], model.layers[0].fc) == ("loaded proj", "loaded bank", "loaded fc")


def test_a_placeholder_the_walk_cannot_reach_stops_the_build_by_name():
    model, listing = _built(hide_one=True)
    fill = Fill(traced=Traced, filled=[f"loaded {r.sources[0]}" for r in listing.requests], host={}, code=FAKE_PORT)
    fill_in(model, fill)
    with pytest.raises(PortError, match=r"keeps 1 weight\(s\) where the hand-off cannot put the loaded tensor "
                                        r"\(the first: a \[32, 64\] bfloat16 ROW_MAJOR tensor from hidden\)"):
        check_filled(fill, listing.requests)


def test_a_constructor_error_that_is_not_about_weight_values_keeps_its_own_words(monkeypatch):
    class Broken:
        def __init__(self, config, loader, device):
            raise TypeError("__init__() got an unexpected keyword argument 'cfg'")

    monkeypatch.setattr(trace, "_traced_loader", lambda code, shapes, banks: (None, Traced))
    monkeypatch.setattr(PortCode, "attr", lambda self, ref: Broken)
    with pytest.raises(PortError, match=r"its constructor failed on the traced weights \(TypeError: __init__\(\) got "
                                        r"an unexpected keyword argument 'cfg'\)"):
        trace.construct(FAKE_PORT, None, {}, None, Listing())


def _model_to_keep():
    """A fake port's model as its constructors leave it: placeholders, a config shared by two modules, a cycle, an
    int-keyed dict holding a tuple, a torch table it computed, and a ttnn tensor it made itself (the causal mask)."""
    import torch

    listing = Listing()
    with intercepted(listing, Traced):
        config = Block(eps=1e-6, name="cfg", dims=(64, 32))
        model = Block(config=config, proj=ttnn.from_torch(_weight("proj")),
                      by_slot={0: ttnn.from_torch(_weight("bank")), 1: (2, "x")},
                      layers=[Block(config=config, fc=ttnn.from_torch(_weight("fc")))],
                      rope=torch.arange(12, dtype=torch.float32).reshape(3, 4), scale=torch.tensor(0.5),
                      mask=ttnn.from_torch(torch.full((32, 32), -1e9, dtype=torch.bfloat16), dtype=ttnn.bfloat16,
                                           layout=ttnn.TILE_LAYOUT, memory_config=ttnn.DRAM_MEMORY_CONFIG))
        model.layers[0].parent = model
    return model, listing


def test_a_kept_model_is_rebuilt_as_it_was_and_a_damaged_one_is_not(tmp_path):
    import torch

    from pipeline.port_n16.kept import NotKept, keep, restore

    model, listing = _model_to_keep()
    path = tmp_path / "kept.json"
    assert keep(path, FAKE_PORT, model, Traced, listing, None)
    again, _, kept_listing = restore(path, FAKE_PORT, None)
    assert kept_listing.requests == listing.requests
    assert type(again) is Block and again.layers[0].config is again.config and again.layers[0].parent is again
    assert (again.config.eps, again.config.name, again.config.dims) == (1e-6, "cfg", (64, 32))
    assert [type(x).__name__ for x in (again.proj, again.by_slot[0], again.layers[0].fc)] == ["Pending"] * 3
    assert [x.index for x in (again.proj, again.by_slot[0], again.layers[0].fc)] == [0, 1, 2]
    assert again.by_slot[1] == (2, "x") and sorted(again.by_slot) == [0, 1]
    assert torch.equal(again.rope, model.rope) and torch.equal(again.scale, model.scale) and again.scale.dim() == 0
    assert (again.mask.dtype, again.mask.layout, list(again.mask.shape)) == (ttnn.bfloat16, ttnn.TILE_LAYOUT, [32, 32])
    assert torch.equal(ttnn.to_torch(again.mask), ttnn.to_torch(model.mask))
    data = bytearray(path.with_suffix(".bin").read_bytes())
    data[5] ^= 0x01
    path.with_suffix(".bin").write_bytes(bytes(data))
    with pytest.raises(NotKept):
        restore(path, FAKE_PORT, None)


def test_a_model_holding_what_the_format_does_not_write_is_not_kept(tmp_path):
    import threading

    from pipeline.port_n16.kept import keep

    model, listing = _model_to_keep()
    model.layers[0].lock = threading.Lock()  # not the port's, not data
    assert not keep(tmp_path / "kept.json", FAKE_PORT, model, Traced, listing, None)
    assert list(tmp_path.iterdir()) == []
