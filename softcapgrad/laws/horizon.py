"""From which pre-cap input the gradient through z = c·tanh(a/c) is exactly 0 in a float format.

softcapgrad.md, "The bf16 dead-zone": past the knee x_knee autograd's tanh backward 1 − y² sees y = 1.0
and returns 0.0 exactly, so the pre-cap horizon is a = c·x_knee (a real number). Where the gradient
really turns 0 is searched over the format's own values, with the cap's arithmetic done in the
format as autograd does it (a/c and c·t rounded), and compared with the exact sech²(a/c).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from softcapgrad.core.report import Report, Table
from softcapgrad.laws import formats
from softcapgrad.laws.formats import Switch
from softcapgrad.laws.saturation import knee_exact, sech2


# --- the gradient through the cap, as autograd computes it in a format ---------------------


def autograd_gradient(a: np.ndarray, c: float, dtype: np.dtype) -> np.ndarray:
    """d/da of c·tanh(a/c) by torch autograd, every op in ``dtype``; returned as float64."""
    import torch

    t = formats.to_torch(a, dtype).requires_grad_(True)
    z = c * torch.tanh(t / c)
    (grad,) = torch.autograd.grad(z.sum(), t)  # a scalar: an explicit grad_outputs makes torch import sympy
    return grad.double().numpy()


def first_zero_gradient(c: float, dtype: np.dtype) -> Switch:
    """The first input of the format whose autograd gradient through the cap is exactly 0."""
    return formats.find_switch(dtype, lambda v: autograd_gradient(v, c, dtype) == 0.0)


def exact_gradient(a: np.ndarray, c: float) -> np.ndarray:

    return sech2(np.asarray(a, dtype=np.float64) / c)


@dataclass(frozen=True)
class Horizon:
    cap: float
    dtype: str
    horizon: float  # c·x_knee, a real number
    first_zero_grad_input: float | None
    monotone: bool
    probes: list[dict]  # {"a", "a_stored", "grad_autograd", "grad_exact"}
    fp32_horizon: float
    fp32_first_zero_grad_input: float | None


def probe(a_values: list[float], c: float, dtype: np.dtype) -> list[dict]:
    stored = np.asarray(a_values, dtype=np.float64).astype(dtype)
    grads = autograd_gradient(stored, c, dtype)
    exact = exact_gradient(stored.astype(np.float64), c)
    return [
        {"a": float(a), "a_stored": float(s), "grad_autograd": float(g), "grad_exact": float(e)}
        for a, s, g, e in zip(a_values, stored.astype(np.float64), grads, exact)
    ]


def horizon(c: float, dtype: np.dtype, probes: list[float]) -> Horizon:
    f32 = np.dtype(np.float32)
    zero = first_zero_gradient(c, dtype)
    zero32 = zero if dtype == f32 else first_zero_gradient(c, f32)
    return Horizon(
        cap=c,
        dtype=dtype.name,
        horizon=c * knee_exact(formats.facts(dtype).spacing_below_one),
        first_zero_grad_input=zero.first_true,
        monotone=zero.monotone,
        probes=probe(probes, c, dtype),
        fp32_horizon=c * knee_exact(formats.facts(f32).spacing_below_one),
        fp32_first_zero_grad_input=zero32.first_true,
    )


def approach(c: float, dtype: np.dtype, first_zero: float, count: int, after: int = 0) -> list[dict]:
    """The last ``count`` representable inputs before ``first_zero``, the first zero one, and ``after`` more."""
    a = formats.neighbours_below(dtype, first_zero, count, after)
    grads = autograd_gradient(a, c, dtype)
    exact = exact_gradient(a.astype(np.float64), c)
    rows = []
    for ai, g, e in zip(a.astype(np.float64), grads, exact):
        rows.append(
            {
                "cap": c,
                "a": float(ai),
                "grad_autograd": float(g),
                "grad_exact": float(e),
                "rel_error": float((g - e) / e),
            }
        )
    return rows


def cap_arithmetic(dtype: np.dtype) -> type:
    """The float type ``a / c`` is computed in: float64 for fp64, float32 (then rounded) for every narrower format.

    Eager torch on the CPU computes bf16 and fp16 arithmetic in fp32 and rounds the result once;
    ml_dtypes does the same for the fp8, fp6 and fp4 formats.
    """
    return np.float64 if dtype.itemsize >= 8 else np.float32


@dataclass(frozen=True)
class CapRange:
    """The caps c a format's soft-cap arithmetic holds: lo <= c <= hi, and why."""

    lo: float
    hi: float
    why: str


def _edge(c: float, holds, outward: float) -> float:
    """The float64 farthest from ``c`` toward ``outward`` for which ``holds`` (true on the inner side) is true,
    starting near it: ``c`` is a rounded quotient, off by an ulp or two either way."""
    inward = -outward
    while not holds(c):
        c = math.nextafter(c, inward)
    while holds(step := math.nextafter(c, outward)):
        c = step
    return c


def cap_range(dtype: np.dtype, in_format: bool = True) -> CapRange:
    """Caps whose arithmetic neither overflows nor underflows, from the formats' own finfo.

    c must be a normal number of :func:`cap_arithmetic` (a/c; below, a/c loses its digits or c rounds to
    0; above, it rounds to inf) and, with ``in_format`` (the cap is stored in the format, as autograd
    does), of ``dtype`` too; and the horizon c·x_knee, kept as a float64, must stay a normal float64.
    """
    arithmetic = np.dtype(cap_arithmetic(dtype))
    holders = list(dict.fromkeys([arithmetic, *([dtype] if in_format else [])]))
    x_knee = float(knee_exact(formats.facts(dtype).spacing_below_one))  # a Python float: c·x_knee overflows quietly
    f64 = np.finfo(np.float64)
    horizon_lo = _edge(float(f64.smallest_normal) / x_knee, lambda c: c * x_knee >= f64.smallest_normal, -math.inf)
    horizon_hi = _edge(float(f64.max) / x_knee, lambda c: c * x_knee <= f64.max, math.inf)
    lo = max(horizon_lo, *(float(formats.finfo(d).smallest_normal) for d in holders))
    hi = min(horizon_hi, *(float(formats.finfo(d).max) for d in holders))
    names = " and ".join(d.name for d in holders)
    why = (f"{dtype.name}'s a/c divides by the cap in {names}, and its horizon c·x_knee = {x_knee:.4g}·c is kept as "
           "a float64: each must be a normal number")
    return CapRange(lo, hi, why)


def first_zero_in_format(c: float, dtype: np.dtype, first_saturating: float | None) -> Switch | None:
    """The first input a of the format whose eager soft-cap gradient is exactly 0, in the format's arithmetic.

    a/c is computed in :func:`cap_arithmetic` and rounded to the format; tanh of it is stored as 1.0
    from ``first_saturating`` on (the exact search), and then the backward 1 − y² is exactly 0. Only
    y = 1.0 gives 0: the largest value below 1 squares to 1 − 2ε₋, which is representable. No torch:
    ``horizon`` measures the same thing through autograd.
    """
    if first_saturating is None:
        return None
    op = cap_arithmetic(dtype)
    cap = op(c)
    with np.errstate(over="ignore", divide="ignore", under="ignore"):
        def saturated(v: np.ndarray) -> np.ndarray:
            q = (v.astype(op) / cap).astype(dtype).astype(np.float64)
            return q >= first_saturating

        return formats.find_switch(dtype, saturated)


def horizon_answer(rows: list[dict], approach_rows: list[dict], dtype: np.dtype) -> tuple[str, ...]:
    def at(r: dict) -> str:
        zero = r["first_zero_grad_input"]
        return (f"from a = {zero:.8g} at c = {r['cap']:g}" if zero is not None
                else f"never at c = {r['cap']:g} (no {dtype.name} input gets there)")

    horizons = " and ".join(f"{r['horizon']:.5g}" for r in rows)
    sentences = [
        f"In {dtype.name}, autograd's gradient through z = c·tanh(a/c) is exactly 0 "
        + "; ".join(at(r) for r in rows) + f" (horizons c·x_knee = {horizons}; a/c is rounded to {dtype.name} "
        "before the tanh, so the first zero can lie past c·x_knee)."
    ]
    before = [r for r in approach_rows if r["grad_autograd"] != 0.0 and r["cap"] == rows[0]["cap"]]
    if before:
        last = before[-1]
        sentences.append(f"Just before it (a = {last['a']:g}, c = {last['cap']:g}) autograd returns {last['grad_autograd']:.3g} "
                         f"where the exact gradient sech²(a/c) is {last['grad_exact']:.3g}.")
    if dtype.name != "float32":
        fp32 = "; ".join(f"{r['fp32_first_zero_grad_input']:.8g} at c = {r['cap']:g}" for r in rows
                         if r["fp32_first_zero_grad_input"] is not None)
        if fp32:
            sentences.append(f"Computed in float32 throughout, the gradient dies only from {fp32}.")
    return tuple(sentences)


def horizon_report(caps: list[float], dtype: np.dtype, probes: list[float] | None, sweep: int, curve: bool = False) -> Report:
    rows, approach_rows, curve_rows = [], [], []
    largest = float(formats.finfo(dtype).max)
    for c in caps:
        h = horizon(c, dtype, probes if probes else [a for a in (4.0 * c,) if a <= largest])
        rows.append(asdict(h))
        if h.first_zero_grad_input is not None and sweep > 0:
            approach_rows.extend(approach(c, dtype, h.first_zero_grad_input, sweep))
        if h.first_zero_grad_input is not None and curve:
            curve_rows.extend(approach(c, dtype, h.first_zero_grad_input, 160, after=24))
    probe_rows = [{"cap": r["cap"], **p} for r in rows for p in r["probes"]]
    return Report(
        command="horizon",
        params={"caps": caps, "dtype": dtype.name, "probes": probes, "sweep": sweep},
        tables=(
            Table(
                "rows",
                f"pre-cap horizon of z = c·tanh(a/c) in {dtype.name} (autograd, every op in the format)",
                rows,
                ("cap", "horizon", "first_zero_grad_input", "monotone", "fp32_first_zero_grad_input"),
                wide=("fp32_horizon",),
            ),
            Table("probe_rows", "the gradient at the probe inputs", probe_rows,
                  ("cap", "a", "grad_autograd", "grad_exact"), wide=("a_stored",)),
            Table("approach", "the last representable inputs before the first zero: format gradient vs exact sech²(a/c)",
                  approach_rows, ("cap", "a", "grad_autograd", "grad_exact", "rel_error")),
            *([Table("curve", "gradient across the horizon", curve_rows, show=False)] if curve else []),
        ),
        notes=(
            "horizon = c·atanh(1 − ε₋/2), a real number; the first zero-grad input is found by running autograd over"
            " the format's own inputs",
            "an autograd gradient of 0 is bit-exact zero: the stored tanh is 1.0 and the backward 1 − y² vanishes",
        ),
        answer=horizon_answer(rows, approach_rows, dtype),
    )
