"""The backward's signature (engines/training/signature.py): an undecided row whose own zeros are the exact
backward's is applied; a row whose zeros could be a wrong backward's, or that is decided, stays."""

from __future__ import annotations

from softcapgrad.engines.training import signature
from softcapgrad.engines.training import verdict as tv


def _row(**over):
    row = {"cap": "attention", "verdict": tv.NOT_BOUND, "forward_cell": "capped", "hint": "forward applied (capped)",
           "last_alive": 171.0, "first_dead": 174.0, "stack": "torch-eager-cpu (bfloat16)", "stack_first_zero": 174.0,
           "agrees": True}
    return {**row, **over}


def test_zeros_of_the_exact_backward_in_the_routes_format_decide_an_undecided_row():
    out = signature.decided(_row())
    assert out["verdict"] == tv.APPLIED
    assert "alive at a = 171 and exactly 0 from a = 174" in out["hint"]
    assert out["hint"].endswith("forward applied (capped)")


def test_no_zero_no_live_gradient_another_bracket_or_a_forward_without_the_cap_decide_nothing():
    assert signature.decided(_row(first_dead=None)) == {}  # straight-through's or a·tanh's: never 0
    assert signature.decided(_row(last_alive=None)) == {}  # a detached cap's: 0 everywhere
    assert signature.decided(_row(agrees=False)) == {}  # dies, but not where the exact backward does
    assert signature.decided(_row(forward_cell="attention off")) == {}
    assert signature.decided(_row(forward_cell=None)) == {}
    assert signature.decided(_row(verdict=tv.IGNORED)) == {}
    assert signature.decided(_row(hint=tv.UNBOUND + " (largest |a/c| 0.1)")) == {}
    assert signature.decided(_row(cap="final", forward_cell="final off")) == {}
