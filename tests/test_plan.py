"""The plan contract (tasks/plan.py), without a convert: what a target is, and the work a plan makes of it."""

from __future__ import annotations

from tasks.plan import HOST, Target, work_units


def _target(name: str, bank: bool = False, layout: str = "TILE") -> Target:
    return Target(name=name, sources=(name + ".src",), transform="slot" if bank else "transpose", kind="matmul",
                  device_dtype="bfloat16", device_layout=layout, shape=(4, 4), embodiment=bank, bank_slots=32 if bank else 0)


def test_a_bank_is_one_unit_of_work_per_selected_slot_and_everything_else_one():
    targets = [_target("a"), _target("W", bank=True), _target("b")]
    assert list(work_units(targets, (3, 10))) == [(targets[0], None), (targets[1], 3), (targets[1], 10),
                                                  (targets[2], None)]
    assert list(work_units(targets[1:2], ())) == []  # no slot selected: no bank work


def test_host_targets_are_the_ones_laid_out_on_the_host():
    assert _target("q_norm", layout=HOST).host and not _target("q_proj").host
