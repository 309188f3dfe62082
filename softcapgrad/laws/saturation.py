"""The two facts every law here rests on: tanh's slope, and where tanh rounds to 1.0.

softcapgrad.md, "The exact gradient identity": d/dx tanh(x) = sech²(x) = 1/cosh²(x).
softcapgrad.md, "The bf16 dead-zone": in a format whose spacing just below 1.0 is ε₋, round-to-nearest
gives tanh(x) = 1.0 exactly from x_knee = atanh(1 − ε₋/2) = ½·ln((2 − ε₋/2)/(ε₋/2)) on; the spacing form
½·ln(4/ε₋) drops the 2 − ε₋/2, and the document's (ln2/2)(p + 2) takes half the spacing above 1.0.
For the sigmoid the same midpoint gives logit(1 − ε₋/2).
"""

from __future__ import annotations

import math

import numpy as np

MAX_A_OVER_C = 350.0  # sech²(350) ≈ 4e-304 is still a normal float64; cosh²(350) is finite


def sech2(x: np.ndarray) -> np.ndarray:
    """sech²(x) = 1/cosh²(x); 0 once cosh overflows."""
    with np.errstate(over="ignore"):
        return 1.0 / np.cosh(x) ** 2


def knee_doc_formula(p: int) -> float:
    """(ln2/2)(p + 2): the document's analytic knee."""
    return math.log(2.0) / 2.0 * (p + 2)


def knee_spacing(epsneg: float, fn: str = "tanh") -> float:
    """From the tail 1 − f(x) reaching half the real spacing below 1.0, ε₋/2.

    tanh: 1 − tanh(x) ≈ 2e^{−2x}, so ½·ln(4/ε₋); sigmoid: 1 − σ(x) ≈ e^{−x}, so ln(2/ε₋).
    """
    return 0.5 * math.log(4.0 / epsneg) if fn == "tanh" else math.log(2.0 / epsneg)


def knee_exact(epsneg: float, fn: str = "tanh") -> float:
    """The smallest real x whose f(x) rounds to 1.0: f⁻¹(1 − ε₋/2), float64-accurate.

    tanh: atanh(1 − h) = ½·ln((2 − h)/h); sigmoid: logit(1 − h) = ln((1 − h)/h); h = ε₋/2.
    """
    h = epsneg / 2.0
    if fn == "tanh":
        return 0.5 * (math.log(2.0 - h) - math.log(h))
    return math.log1p(-h) - math.log(h)
