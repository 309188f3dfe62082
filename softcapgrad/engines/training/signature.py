"""The backward's own signature: where a precision cannot tell a cap's gradient from the wrong ones, its zeros can.

A bf16 step's gradients miss the float64 reference's by more than the wrong backwards of
engines/training/reference.py differ from the exact one on parity's tiny models (their weights scaled
so that each cap binds): the comparison leaves the row ``not bound``. The route's own dL/da at the
cap (each watched attention-cap call's scores, or the final cap's a, exposed or read from the head
rows of engines/training/zeros.py) separates them without a tolerance, by where it is exactly 0:

- straight-through passes dL/dz unchanged, and the gradient of a·tanh(a/c) is tanh(a/c) +
  (a/c)·sech²(a/c) ≥ tanh(a/c) > 0: at a positive a with dL/dz ≠ 0 neither is ever 0;
- a detached cap passes no gradient: dL/da is 0 at every a, none alive;
- the exact backward, dL/dz·sech²(a/c), is exactly 0 past the format's first zero and alive below it.

So a row whose forward applies the cap, whose dL/da is alive at a positive a and exactly 0 at a larger
one (where dL/dz is alive: zeros.py leaves a masked score or position out), and whose bracket (last
alive, first zero] holds the first zero of the exact backward in the route's format (the stack
agreement of engines/training/zeros.py) applied the cap forward and backward. The gradient of the rest
of the model is not what this reads: the row keeps the comparison's words beside it.
"""

from __future__ import annotations

from softcapgrad.engines.training import verdict as tv

WORDS = ("the gradients' comparison cannot decide in this precision, the backward's signature does: dL/da is "
         "alive at a = {alive:.6g} and exactly 0 from a = {dead:.6g}, a bracket holding {stack}'s first zero "
         "{first:.6g} (a straight-through cap and the gradient of a·tanh(a/c) are never 0 there, a detached cap's "
         "is 0 at every a)")


def decided(row: dict) -> dict:
    """The verdict and hint that replace an undecided row's, where its zeros show the exact backward; {} else."""
    cell = row.get("forward_cell")
    if row.get("verdict") != tv.NOT_BOUND or cell is None or row["cap"] not in tv.ON.get(cell, set()) \
            or (row.get("hint") or "").startswith(tv.UNBOUND):
        return {}
    alive, dead, first = row.get("last_alive"), row.get("first_dead"), row.get("stack_first_zero")
    if alive is None or dead is None or first is None or row.get("agrees") is not True or not 0 < alive < dead:
        return {}
    said = WORDS.format(alive=alive, dead=dead, stack=row.get("stack") or "the stack", first=first)
    return {"verdict": tv.APPLIED, "hint": f"{said}; {row.get('hint') or ''}".rstrip("; ")}
