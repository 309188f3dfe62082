"""The gate laws' claims: where a document states a number a gate law decides.

tethergate.md ("Gradient and clamp") clamps TetherGate's argument to [arg_min, +8] and says that
inside that range the gradient stays alive. σ's backward σ(1 − σ) is read from the stored output, so
it is exactly 0 wherever σ is stored as 1.0 (softcapgrad.laws.gates, point ``one``): from
logit(1 − ε₋/2), the first value of the format past it found by search. The clamp's top +8 lies
below that point in float32 (the gradient is alive up to the clamp) and above it in bfloat16 (from
there to +8 the gradient is already exactly 0, before the clamp stops it).
"""

from __future__ import annotations

from functools import cache


@cache
def stuck_open(dtype: str) -> float:
    """The first input of the format whose correctly rounded σ is stored as 1.0 (its gradient exactly 0)."""
    from softcapgrad.laws import formats
    from softcapgrad.laws.gates import gate_point

    return gate_point(formats.resolve(dtype), "one").first_input


def _law(dtype: str) -> float:
    from softcapgrad.laws import formats
    from softcapgrad.laws.gates import formula

    return formula(formats.resolve(dtype), "one")


def _why_bf16() -> str:
    return (f"σ is stored as 1.0 in bfloat16 from x = {stuck_open('bf16'):g} (logit(1 − 2^−9) = {_law('bf16'):.5g}), "
            "so σ(1 − σ) is exactly 0 from there: between it and the clamp's +8 the gate is already stuck open, "
            "before the clamp's own zero gradient begins; torch's own first zero: softcapgrad horizon --fn sigmoid "
            "--dtype bf16")


def gate_claims(claim, doc: str) -> tuple:
    """The claims, built with the ledger's Claim class (passed in: the ledger imports this module)."""
    section = "Gradient and clamp"
    return (
        claim("tether-clamp-alive-fp32", doc, section,
              "the gradient stays alive inside the clamp [arg_min, +8]: σ's first input with σ stored as 1.0 "
              "(gradient exactly 0), float32, lies above", "8", "at_least", lambda: stuck_open("fp32"),
              "reproduced", lambda: f"logit(1 − 2^−25) = {_law('fp32'):.6g}, the first float32 value past it; torch's own "
              "first zero: softcapgrad horizon --fn sigmoid --dtype fp32"),
        claim("tether-clamp-alive-bf16", doc, section,
              "the same in bfloat16: σ's first input with σ stored as 1.0 lies above", "8", "at_least",
              lambda: stuck_open("bf16"), "differs", _why_bf16),
    )
