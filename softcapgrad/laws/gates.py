"""Where a sigmoid or softplus gate saturates in a float format, and where its gradient is exactly 0.

softmax-softplus-gates.md §5: softplus' = σ, σ' = σ(1 − σ). Autograd's sigmoid backward reads the stored
output y, so g·y(1 − y) is exactly 0 where y is stored as 1.0 or as 0; for an upstream g = 1 and a stored
0 < y < 1 it rounds to a non-zero value in every format but fp4, whose 0.5·0.5 ties down to 0 (checked per format).
A smaller g underflows first: ``torch_backward_values`` is torch's backward for any g. Each point is
the first value of the format, going out from 0, past which the stored result is the named one, found by
searching the format's own values; beside it the real threshold, where a closed form exists:

    σ stored as 1.0              x = logit(1 − ε₋/2)                    (ε₋: the spacing just below 1.0)
    σ stored below the normals   x = logit(n − s/2)                     (n: smallest normal, s: smallest value > 0)
    σ stored as 0                x = logit(s/2) ≈ ln(s/2)
    softplus(x) stored as x      log1p(e^−x) = u(x)/2, per binade: x = −ln(expm1(u/2))   (u: spacing above x)
    softplus(x) stored as 0      x = ln(expm1(s/2)) ≈ ln(s/2)

Softplus' gradient σ(x) is stored as 1.0 and as 0 at the sigmoid's own points. σ, softplus and their
midpoint comparisons are transcendental at every non-zero dyadic input, so round-to-nearest never ties.

torch's CPU kernels do not round correctly: they evaluate 1/(1 + e^−x) (sigmoid) and e^x/(e^x + 1) (softplus'
backward, 1 past its threshold 20) in float32 for every narrower format, then round once. That formula is
searched too (``torch formula``); where e^−x overflows float32 (x < −88.72) its σ is 0 although the correctly
rounded σ is not.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from fractions import Fraction
from typing import Callable

import numpy as np

from softcapgrad.core.report import Report, Table
from softcapgrad.laws import formats
from softcapgrad.laws.horizon import cap_arithmetic
from softcapgrad.laws.knee import StackKnee, backend_knee, knee_report
from softcapgrad.laws.saturation import knee_exact

GATES = ("sigmoid", "softplus")
SOFTPLUS_THRESHOLD = 20.0  # torch.nn.functional.softplus's default: above it, forward x and backward 1
TOLERANCE = 1e-12  # float64 decides a margin wider than this, mpmath (200 bits) the rest: every margin here is a
# difference of logarithms below 1e3 in size, each within a few ulps (< 2.3e-13 each)


@dataclass(frozen=True)
class Point:
    """One saturation point of a gate in one format."""

    dtype: str
    fn: str
    point: str  # one | subnormal | zero (sigmoid); equals_x | grad_one | grad_zero | output_zero (softplus)
    stored: str  # what the format stores past it, in words
    side: str  # "+" (searched over x > 0) or "−" (x < 0)
    formula: float | None  # the real threshold; None where the format never gets there
    first_input: float | None  # the first value of the format, from 0 outward, past which it holds; None: never
    last_before: float | None  # the value just inside it
    monotone: bool | None  # every value past first_input holds too
    method: str  # enumeration | bisection
    torch_formula: float | None  # the same point under torch's float32 formula (None: never, or not a torch point)


# point -> (fn, side, what is stored past it, whether torch's formula has a figure for it)
POINTS: dict[str, tuple[str, str, str, bool]] = {
    "one": ("sigmoid", "+", "σ(x) = 1.0: gradient σ(1 − σ) exactly 0", True),
    "subnormal": ("sigmoid", "−", "σ(x) subnormal or 0", True),
    "zero": ("sigmoid", "−", "σ(x) = 0: gradient σ(1 − σ) exactly 0", True),
    "equals_x": ("softplus", "+", "softplus(x) = x", False),
    "grad_one": ("softplus", "+", "gradient σ(x) = 1.0", True),
    "grad_zero": ("softplus", "−", "gradient σ(x) = 0", True),
    "output_zero": ("softplus", "−", "softplus(x) = 0", False),
}


def _smallest(dtype: np.dtype) -> tuple[Fraction, Fraction]:
    """(s, n): the smallest positive value and the smallest normal of the format, exactly."""
    info = formats.finfo(dtype)
    return Fraction(float(info.smallest_subnormal)), Fraction(float(info.smallest_normal))


def signed(dtype: np.dtype) -> bool:
    return float(formats.finfo(dtype).min) < 0


# --- exact comparisons ------------------------------------------------------------------------


def _decide(x: np.ndarray, margin64: Callable[[np.ndarray], np.ndarray], margin_mp: Callable) -> np.ndarray:
    """margin(x) < 0, decided in float64 where |margin| > TOLERANCE, else in 200-bit mpmath."""
    with np.errstate(over="ignore", under="ignore", divide="ignore"):
        m = margin64(x)
    out = m < 0
    undecided = ~(np.abs(m) > TOLERANCE)
    if undecided.any():
        import mpmath

        with mpmath.workprec(200):
            for i in np.flatnonzero(undecided):
                out[i] = margin_mp(mpmath.mpf(float(x[i]))) < 0
    return out


def _ln(t: Fraction) -> float:
    """ln of an exact threshold, which may lie below float64's smallest value (fp64's s/2)."""
    return math.log(t.numerator) - math.log(t.denominator)


def _mp(t: Fraction):
    import mpmath

    return mpmath.mpf(t.numerator) / t.denominator


def _log_sigmoid(x: np.ndarray) -> np.ndarray:
    """ln σ(x) in float64, accurate for both signs: −log1p(e^−x) (x ≥ 0), x − log1p(eˣ) (x < 0)."""
    return np.minimum(x, 0.0) - np.log1p(np.exp(-np.abs(x)))


def sigmoid_below(x: np.ndarray, t: Fraction) -> np.ndarray:
    """σ(x) < t exactly, for 0 < t < 1/2 (compared as logarithms: σ can be far below float64's normals)."""
    import mpmath

    log_t = _ln(t)
    return _decide(x, lambda v: _log_sigmoid(v) - log_t,
                   lambda v: -mpmath.log1p(mpmath.exp(-v)) - mpmath.log(_mp(t)))


def _log_softplus(x: np.ndarray) -> np.ndarray:
    """ln softplus(x) in float64: for eˣ < 1e-300 softplus(x) = eˣ(1 − eˣ/2 + …), so ln is x to float64's precision."""
    e = np.exp(x)
    return np.where(e > 1e-300, np.log(np.log1p(e)), x)


def softplus_below(x: np.ndarray, t: Fraction) -> np.ndarray:
    """softplus(x) < t exactly, for t > 0."""
    import mpmath

    log_t = _ln(t)
    return _decide(x, lambda v: _log_softplus(v) - log_t,
                   lambda v: mpmath.log(mpmath.log1p(mpmath.exp(v))) - mpmath.log(_mp(t)))


def spacing_exponent(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """k with 2^k the spacing of the format from each positive value to the next (the binade's; the largest value's own)."""
    info = formats.finfo(dtype)
    _, exponent = np.frexp(values.astype(np.float64))  # v = m·2^e, m in [0.5, 1): the binade is 2^(e − 1)
    return np.maximum(exponent - 1, int(info.minexp)) - int(info.nmant)


def rounds_to_x(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """softplus(x) is stored as x itself: the excess log1p(e^−x) is below half the spacing above x."""
    import mpmath

    x = values.astype(np.float64)
    half = spacing_exponent(x, dtype) - 1
    out = np.empty(x.shape, dtype=bool)
    for k in np.unique(half):  # one exact threshold per binade
        mine = half == k
        log_h = int(k) * math.log(2.0)
        out[mine] = _decide(x[mine], lambda v: np.log(np.log1p(np.exp(-v))) - log_h,
                            lambda v: mpmath.log(mpmath.log1p(mpmath.exp(-v))) - mpmath.log(mpmath.ldexp(1, int(k))))
    return out


# --- the formulas beside the searches -----------------------------------------------------------


def logit(p: Fraction) -> float:
    """ln p − ln(1 − p) for an exact 0 < p < 1/2."""
    return _ln(p) - math.log1p(-float(p))


def ln_expm1(t: Fraction) -> float:
    """ln(expm1(t)) for an exact t > 0: ln t + ln(expm1(t)/t), the second t/2 to float64's precision below 1e-8."""
    return _ln(t) + t_over_2 if (t_over_2 := float(t) / 2.0) < 5e-9 else math.log(math.expm1(float(t)))


def equals_x_formula(dtype: np.dtype) -> float | None:
    """The smallest real x > 0 whose softplus rounds to x: per binade [2^e, 2^(e+1)) with spacing u, log1p(e^−x) < u/2
    from x_e = −ln(expm1(u/2)) on; the first binade where max(2^e, x_e) lies inside it."""
    info = formats.finfo(dtype)
    for e in range(int(info.minexp), int(info.maxexp)):
        x_e = -ln_expm1(Fraction(2) ** (e - int(info.nmant) - 1))
        start = max(math.ldexp(1.0, e), x_e)
        if start < math.ldexp(1.0, e + 1):
            return start
    return None


def formula(dtype: np.dtype, point: str) -> float | None:
    s, n = _smallest(dtype)
    if point in ("one", "grad_one"):
        return knee_exact(formats.facts(dtype).spacing_below_one, "sigmoid")
    if point == "subnormal":
        return logit(n - s / 2) if s < n else None
    if point in ("zero", "grad_zero"):
        return logit(s / 2)
    if point == "equals_x":
        return equals_x_formula(dtype)
    if point == "output_zero":
        return ln_expm1(s / 2)
    raise ValueError(point)


# --- the searches -------------------------------------------------------------------------------


def exact_predicate(dtype: np.dtype, point: str) -> Callable[[np.ndarray], np.ndarray]:
    """Over positive values v of the format: whether the point holds at x = v (side +) or x = −v (side −)."""
    s, n = _smallest(dtype)
    if point == "subnormal":
        return lambda v: sigmoid_below(-v.astype(np.float64), n - s / 2)
    if point in ("zero", "grad_zero"):
        return lambda v: sigmoid_below(-v.astype(np.float64), s / 2)
    if point == "equals_x":
        return lambda v: rounds_to_x(v, dtype)
    if point == "output_zero":
        return lambda v: softplus_below(-v.astype(np.float64), s / 2)
    raise ValueError(point)


def torch_formula_values(x: np.ndarray, dtype: np.dtype, what: str) -> np.ndarray:
    """torch's CPU formula in float32 (float64 for fp64), rounded once to the format, as float64.

    what = "sigmoid": 1/(1 + e^−x); "softplus_grad": e^x/(e^x + 1), exactly 1 past the threshold."""
    op = cap_arithmetic(dtype)
    v = x.astype(op)
    one = op(1.0)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        if what == "sigmoid":
            y = one / (one + np.exp(-v))
        else:
            z = np.exp(v)
            y = np.where(v > op(SOFTPLUS_THRESHOLD), one, z / (z + one))
    return y.astype(dtype).astype(np.float64)


def torch_backward_values(x: np.ndarray, dtype: np.dtype, fn: str, g: float) -> np.ndarray:
    """torch's CPU backward of the gate at ``x`` for an upstream gradient ``g`` (a value of the format), as float64:
    the sigmoid's (g·(1 − y))·y from its stored output y (torch's formula above), softplus' (g·eˣ)/(eˣ + 1) (g past
    the threshold 20), each product in float32 (float64 for fp64) in that order, rounded once to the format (the fp16
    sigmoid's rounded to fp16 after each product, as torch's CPU kernel does: measured over every fp16 value). For g = 1
    its zeros are the points above; for a small g the product underflows first (fp16, g = 1e-6: σ's from |x| ≈ 3.5)."""
    op = cap_arithmetic(dtype)
    v, a, one = x.astype(op), op(g), op(1.0)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        if fn == "sigmoid" and dtype == np.float16:  # measured: torch's fp16 kernel rounds each product to fp16
            y, a = torch_formula_values(x, dtype, "sigmoid").astype(dtype), dtype.type(g)
            out = a * (dtype.type(1.0) - y) * y
        elif fn == "sigmoid":
            y = torch_formula_values(x, dtype, "sigmoid").astype(op)
            out = a * (one - y) * y
        else:
            z = np.exp(v)
            out = np.where(v > op(SOFTPLUS_THRESHOLD), a, a * z / (z + one))
    return out.astype(dtype).astype(np.float64)


def torch_predicate(dtype: np.dtype, point: str) -> Callable[[np.ndarray], np.ndarray]:
    what = "sigmoid" if POINTS[point][0] == "sigmoid" else "softplus_grad"
    _, n = _smallest(dtype)
    if point in ("one", "grad_one"):
        return lambda v: torch_formula_values(v, dtype, what) == 1.0
    if point == "subnormal":
        return lambda v: torch_formula_values(-v, dtype, what) < float(n)
    return lambda v: torch_formula_values(-v, dtype, what) == 0.0


def gate_point(dtype: np.dtype, point: str) -> Point:
    fn, side, stored, has_torch = POINTS[point]
    sign = 1.0 if side == "+" else -1.0

    def out(v: float | None) -> float | None:
        return None if v is None else sign * v

    if side == "−" and not signed(dtype):
        return Point(dtype.name, fn, point, stored, side, None, None, None, None, "no negative values", None)
    if point in ("one", "grad_one"):  # the sigmoid knee: the exact search knee already runs
        found = backend_knee(dtype, "exact", [], "sigmoid")
        first, last, monotone, method = (found.first_saturating_input, found.last_unsaturated_input, found.monotone,
                                         found.method)
    else:
        switch = formats.find_switch(dtype, exact_predicate(dtype, point))
        first, last, monotone, method = switch.first_true, switch.last_false, switch.monotone, switch.method
    if first is None:
        monotone = None
    torch_first = None
    if has_torch and not (point == "subnormal" and formula(dtype, point) is None):
        torch_first = out(formats.find_switch(dtype, torch_predicate(dtype, point)).first_true)
    value = formula(dtype, point)
    return Point(dtype.name, fn, point, stored, side, value, out(first), out(last), monotone, method, torch_first)


def gate_points(dtype: np.dtype, fn: str) -> list[Point]:
    return [gate_point(dtype, p) for p, spec in POINTS.items() if spec[0] == fn]


def backward_never_zero_inside(dtype: np.dtype) -> bool:
    """Whether y(1 − y), computed in the format from every stored 0 < y < 1, is non-zero (formats of 16 bits or fewer:
    every such y; wider ones: the 4096 smallest and the 4096 largest below 1, where it is smallest)."""
    if dtype.itemsize <= 2:
        y = formats.positive_values(dtype)
        y = y[y.astype(np.float64) < 1.0]
    else:
        below = formats.neighbours_below(dtype, 1.0, 4096)[:-1]
        tiny = formats.neighbours_below(dtype, float(formats.finfo(dtype).smallest_subnormal), 0, 4095)
        y = np.concatenate([tiny, below])
    one = np.ones((), dtype=dtype)
    with np.errstate(under="ignore"):
        return bool(((one - y) * y).astype(np.float64).min() > 0)


# --- the report, for knee --fn sigmoid / softplus ----------------------------------------------


def gate_rows(dtypes: list[np.dtype], fns: list[str]) -> list[dict]:
    return [asdict(p) for d in dtypes for fn in fns if fn in GATES for p in gate_points(d, fn)]


def gate_sentence(rows: list[dict]) -> tuple[str, ...]:
    """One sentence per gate function on its points in the first format (the tables have every format)."""
    sentences = []
    dtype = rows[0]["dtype"] if rows else ""
    for fn in dict.fromkeys(r["fn"] for r in rows):
        mine = {r["point"]: r for r in rows if r["fn"] == fn and r["dtype"] == dtype}

        def at(key: str, column: str = "first_input") -> str:
            v = mine[key][column]
            return "never" if v is None else f"x = {v:.6g}"

        if fn == "sigmoid":
            sentences.append(
                f"In {dtype}, σ(x) is stored as 0 from {at('zero')} (subnormal from {at('subnormal')}), and its "
                "gradient σ(1 − σ), read from the stored output, is exactly 0 only where σ is stored as 1.0 or 0; "
                f"torch's formula 1/(1 + e^−x) stores σ as 1.0 from {at('one', 'torch_formula')} and as 0 from "
                f"{at('zero', 'torch_formula')}.")
        else:
            sentences.append(
                f"In {dtype}, softplus(x) is stored as x itself from {at('equals_x')} and as 0 from "
                f"{at('output_zero')}; its gradient σ(x) is exactly 1.0 from {at('grad_one')} and exactly 0 from "
                f"{at('grad_zero')}, never 0 for x > 0.")
    return tuple(sentences)


GATE_COLUMNS = ("dtype", "point", "stored", "first_input", "formula", "torch_formula")


def gate_table(rows: list[dict], several_formats: bool) -> Table:
    return Table(
        "gate_rows",
        "gate laws: from which input (going out from 0) the format stores each result",
        rows,
        tuple(c for c in GATE_COLUMNS if c != "dtype" or several_formats),
        wide=("fn", "last_before", "monotone", "method"),
    )


GATE_NOTES = (
    "gate laws: first input = the first value of the format past which the stored result is the one named, by search "
    "over the format's values (exact: float64, then 200-bit mpmath near a threshold); formula = the real threshold "
    "(logit(1 − ε₋/2), logit(n − s/2), logit(s/2), −ln(expm1(u/2)), ln(expm1(s/2)))",
    "torch formula: the same point when σ is 1/(1 + e^−x), and softplus' gradient e^x/(e^x + 1) (1 past 20), in "
    "float32 (float64 for fp64), rounded once, as torch's CPU kernels compute; — where it never gets there",
)


def _inside_note(dtypes: list[np.dtype]) -> tuple[str, ...]:
    """Where y(1 − y) from a stored 0 < y < 1 can itself round to 0 (the format's smallest value is too coarse)."""
    odd = [d.name for d in dtypes if not backward_never_zero_inside(d)]
    return (f"in {', '.join(odd)} y(1 − y) rounds to 0 for some stored 0 < y < 1 too (the product is not above half "
            "the format's smallest value)",) if odd else ()


def knee_with_gates(dtypes: list[np.dtype], caps: list[float], backends: list[str], fns: list[str],
                    stack_knee: StackKnee | None = None) -> Report:
    """``knee``: the knee report for tanh and the sigmoid, with the gate laws of the sigmoid and softplus beside it
    (softplus alone: the gate laws only; it is never stored as 1.0)."""
    rows = gate_rows(dtypes, fns)
    table = gate_table(rows, len(dtypes) > 1)
    notes = (*GATE_NOTES, *_inside_note(dtypes))
    knee_fns = [f for f in fns if f != "softplus"]
    if not knee_fns:
        return Report(command="knee", params={"dtypes": [d.name for d in dtypes], "caps": caps, "backends": backends,
                                              "fns": fns},
                      tables=(table,), notes=notes, answer=gate_sentence(rows))
    base = knee_report(dtypes, caps, backends, knee_fns, stack_knee)
    if not rows:
        return base
    return replace(base, params={**base.params, "fns": fns}, tables=(*base.tables, table), notes=(*base.notes, *notes),
                   answer=(*base.answer, *gate_sentence(rows))[:3])
