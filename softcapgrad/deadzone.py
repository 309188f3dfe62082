"""Where tanh (or a sigmoid) saturates in a float format, and where the soft-cap gradient is exactly zero.

softcapgrad.md, "The bf16 dead-zone". Round-to-nearest turns tanh(x) into exactly 1.0 once
tanh(x) passes the midpoint m between 1.0 and its lower neighbour 1 − ε₋ (ε₋ = ``epsneg``):

    m       = 1 − ε₋/2
    x_knee  = atanh(m) = ½·ln((2 − ε₋/2)/(ε₋/2))            (exact)
            ≈ ½·ln(4/ε₋) = (ln2/2)(p + 3)  for a normal neighbour, ε₋ = 2^−(p+1)   (spacing form)

The document's form (ln2/2)(p + 2) uses half the spacing *above* 1.0, 2^−(p+1), as the
criterion. Past the knee autograd's tanh backward 1 − y² sees y = 1.0 and returns 0.0 exactly,
so for z = c·tanh(a/c) the pre-cap horizon is a = c·x_knee.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from softcapgrad import formats
from softcapgrad.formats import Switch
from softcapgrad.report import Report, Table
from softcapgrad.names import KNEE_FUNCTIONS as FUNCTIONS

BACKENDS = ("exact", "numpy", "torch")


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


def _exceeds(values: np.ndarray, epsneg: float, fn: str) -> np.ndarray:
    """f(x) > 1 − ε₋/2, decided exactly: float64 where the margin is clear, else mpmath.

    tanh and σ of a non-zero dyadic rational are transcendental, so they never equal the
    midpoint and the tie rule of the rounding never matters.
    """
    x = values.astype(np.float64)
    f64 = np.tanh(x) if fn == "tanh" else 1.0 / (1.0 + np.exp(-x))
    margin = f64 - (1.0 - epsneg / 2.0)
    decided = np.abs(margin) > 1e-14  # float64 tanh and σ are good to a few 1e-16 near 1
    out = margin > 0
    if decided.all():
        return out
    import mpmath

    with mpmath.workprec(160):
        m = 1 - mpmath.mpf(epsneg) / 2
        f = mpmath.tanh if fn == "tanh" else (lambda t: 1 / (1 + mpmath.exp(-t)))
        for i in np.flatnonzero(~decided):
            out[i] = f(mpmath.mpf(float(x[i]))) > m
    return out


def saturation_predicate(backend: str, dtype: np.dtype, fn: str = "tanh"):
    """A vectorised 'f(x) is stored as 1.0' test over values of ``dtype`` for one backend.

    numpy has no sigmoid: its backend evaluates 1/(1 + exp(−x)) in the format, as users write it.
    """
    epsneg = formats.facts(dtype).spacing_below_one
    if backend == "exact":
        return lambda v: _exceeds(v, epsneg, fn)
    if backend == "numpy":
        one = np.ones((), dtype=dtype)
        f = np.tanh if fn == "tanh" else (lambda v: one / (one + np.exp(-v)))
        return lambda v: f(v).astype(np.float64) == 1.0
    if backend == "torch":
        import torch

        if formats.torch_dtype(dtype) is None:
            raise TypeError(f"torch has no {dtype.name}")
        f = torch.tanh if fn == "tanh" else torch.sigmoid
        return lambda v: (f(formats.to_torch(v, dtype)).double() == 1.0).numpy()
    raise ValueError(backend)


@dataclass(frozen=True)
class BackendKnee:
    dtype: str
    backend: str
    fn: str
    supported: bool
    last_unsaturated_input: float | None = None
    first_saturating_input: float | None = None
    monotone: bool | None = None
    method: str = ""
    checked: int = 0
    reason: str = ""  # why unsupported
    horizons: list[dict] = field(default_factory=list)  # cap·first_saturating_input
    saturated_run_start: float | None = None  # where the run of 1.0s up to the searched end begins
    source: str = "measured"  # or "recorded on <device>", "not measured"


def stack_knee(dtype: np.dtype, backend: str, caps: list[float], fn: str = "tanh") -> BackendKnee:
    """A real stack's knee (stacks.py): live where it runs here, else recorded, else not measured."""
    from softcapgrad import stacks

    stack = stacks.STACKS[backend]
    if dtype.name not in stack.formats:
        return BackendKnee(dtype.name, backend, fn, False, source="not measured",
                           reason=f"{backend} takes {', '.join(stack.formats)}")
    r = stacks.knee(backend, dtype.name, fn)
    found = r.source != "not measured"
    return BackendKnee(
        dtype=dtype.name, backend=backend, fn=fn, supported=found, first_saturating_input=r.value,
        monotone=r.monotone, method=r.reason if found else "", reason="" if found else r.reason,
        horizons=[{"cap": c, "horizon": None if r.value is None else c * r.value} for c in caps],
        saturated_run_start=r.saturated_run_start, source=r.source,
    )


def backend_knee(dtype: np.dtype, backend: str, caps: list[float], fn: str = "tanh") -> BackendKnee:
    if backend not in BACKENDS:
        return stack_knee(dtype, backend, caps, fn)
    try:
        predicate = saturation_predicate(backend, dtype, fn)
        switch: Switch = formats.find_switch(dtype, predicate, window=64 if backend == "exact" else 4096)
    except (TypeError, RuntimeError, NotImplementedError) as err:
        return BackendKnee(dtype.name, backend, fn, False, reason=str(err).splitlines()[0])
    first = switch.first_true
    return BackendKnee(
        dtype=dtype.name,
        backend=backend,
        fn=fn,
        supported=True,
        last_unsaturated_input=switch.last_false,
        first_saturating_input=first,
        monotone=switch.monotone,
        method=switch.method,
        checked=switch.checked,
        horizons=[{"cap": c, "horizon": None if first is None else c * first} for c in caps],
        saturated_run_start=switch.run_start,
    )


@dataclass(frozen=True)
class Knee:
    dtype: str
    fn: str
    bits: int
    mantissa_bits: int
    below_one: float
    below_one_is_subnormal: bool
    knee_doc_formula: float | None  # (ln2/2)(p+2), tanh only
    knee_spacing: float  # ½ ln(4/ε₋) for tanh, ln(2/ε₋) for sigmoid
    knee_exact: float  # f⁻¹(1 − ε₋/2)
    last_unsaturated_input: float | None
    first_saturating_input: float | None
    horizons: list[dict]  # {"cap", "horizon" = c·knee_exact}


def knee(dtype: np.dtype, caps: list[float], fn: str = "tanh") -> tuple[Knee, BackendKnee]:
    f = formats.facts(dtype)
    exact = knee_exact(f.spacing_below_one, fn)
    search = backend_knee(dtype, "exact", caps, fn)
    row = Knee(
        dtype=f.dtype,
        fn=fn,
        bits=f.bits,
        mantissa_bits=f.mantissa_bits,
        below_one=f.below_one,
        below_one_is_subnormal=f.below_one_is_subnormal,
        knee_doc_formula=knee_doc_formula(f.mantissa_bits) if fn == "tanh" else None,
        knee_spacing=knee_spacing(f.spacing_below_one, fn),
        knee_exact=exact,
        last_unsaturated_input=search.last_unsaturated_input,
        first_saturating_input=search.first_saturating_input,
        horizons=[{"cap": c, "horizon": c * exact} for c in caps],
    )
    return row, search


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
    from softcapgrad.attenuation import sech2

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


# --- reports ---------------------------------------------------------------------------------


def cap_arithmetic(dtype: np.dtype) -> type:
    """The float type ``a / c`` is computed in: float64 for fp64, float32 (then rounded) for every narrower format.

    Eager torch on the CPU computes bf16 and fp16 arithmetic in fp32 and rounds the result once;
    ml_dtypes does the same for the fp8, fp6 and fp4 formats.
    """
    return np.float64 if dtype.itemsize >= 8 else np.float32


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


def knee_answer(rows: list[dict], horizon_rows: list[dict]) -> tuple[str, ...]:
    tanh_rows = [r for r in rows if r["fn"] == "tanh"] or rows
    if len(tanh_rows) > 1:
        lo = min(tanh_rows, key=lambda r: r["knee_exact"])
        hi = max(tanh_rows, key=lambda r: r["knee_exact"])
        return (
            f"Across these {len(tanh_rows)} formats {tanh_rows[0]['fn']}(x) rounds to exactly 1.0 from x = "
            f"{lo['knee_exact']:.4g} ({lo['dtype']}) up to x = {hi['knee_exact']:.4g} ({hi['dtype']}); past it the "
            "gradient 1 − y² read from the stored output is exactly 0.",
            "Each format's knee, its first value there and the pre-cap horizon per cap are in the tables below.",
        )
    r = tanh_rows[0]
    first = r["first_saturating_input"]
    sentences = [
        f"In {r['dtype']}, {r['fn']}(x) rounds to exactly 1.0 from x = {r['knee_exact']:.6g} on; "
        + (f"the first {r['dtype']} value there is {first:.8g}." if first is not None
           else f"no {r['dtype']} value gets there.")
    ]
    mine = [h for h in horizon_rows if h["dtype"] == r["dtype"] and h["fn"] == r["fn"]]
    if mine:
        parts = []
        for h in mine:
            zero = h["first_zero_grad_input"]
            parts.append(
                f"at c = {h['cap']:g} from a = {zero:.8g} (pre-cap horizon c·x_knee = {h['horizon']:.5g})" if zero is not None
                else f"at c = {h['cap']:g} never: no {r['dtype']} input reaches c·x_knee = {h['horizon']:.5g}")
        sentences.append(f"The gradient through z = c·tanh(a/c), computed in {r['dtype']}, is exactly 0 "
                         + "; ".join(parts) + ".")
    return tuple(sentences)


def stacks_sentence(backend_rows: list[dict]) -> tuple[str, ...]:
    """One sentence on the real stacks' knees: the range over backends, and which saturate non-monotonically."""
    found = [b for b in backend_rows if b["backend"] not in BACKENDS and b["first_saturating_input"] is not None]
    if not found:
        return ()
    dtype = found[0]["dtype"]
    mine = [b for b in found if b["dtype"] == dtype]
    lo = min(mine, key=lambda b: b["first_saturating_input"])
    hi = max(mine, key=lambda b: b["first_saturating_input"])
    odd = [f"{b['backend']} (a run of 1.0s only from {b['saturated_run_start']:.8g})" for b in mine if b["monotone"] is False]
    span = (f"x = {lo['first_saturating_input']:.8g} ({lo['backend']}, {lo['source']})" if lo is hi else
            f"x = {lo['first_saturating_input']:.8g} ({lo['backend']}, {lo['source']}) to "
            f"{hi['first_saturating_input']:.8g} ({hi['backend']}, {hi['source']})")
    return (f"On the real stacks, {lo['fn']}(x) in {dtype} first comes back as exactly 1.0 at {span}"
            + (f"; not monotone: {', '.join(odd)}." if odd else "."),)


def knee_report(dtypes: list[np.dtype], caps: list[float], backends: list[str], fns: list[str]) -> Report:
    rows, backend_rows, horizon_rows = [], [], []
    real = any(b not in BACKENDS for b in backends)  # real stacks: where the run of 1.0s starts (monotone when it is
    # where the first 1.0 is), and the source
    for dtype in dtypes:
        for fn in fns:
            row, search = knee(dtype, caps, fn)
            rows.append(asdict(row))
            for backend in backends:
                found = search if backend == "exact" else backend_knee(dtype, backend, caps, fn)
                backend_rows.append(asdict(found))
            if fn != "tanh":
                continue
            for c in caps:
                zero = first_zero_in_format(c, dtype, row.first_saturating_input)
                horizon_rows.append({"dtype": row.dtype, "fn": fn, "cap": c, "horizon": c * row.knee_exact,
                                     "first_zero_grad_input": None if zero is None else zero.first_true})
    return Report(
        command="knee",
        params={"dtypes": [d.name for d in dtypes], "caps": caps, "backends": backends, "fns": fns},
        tables=(
            Table(
                "rows",
                "where f(x) is stored as exactly 1.0",
                rows,
                ("dtype", *(("fn",) if len(fns) > 1 else ()), "knee_exact", "first_saturating_input", "knee_doc_formula"),
                wide=("mantissa_bits", "below_one", "knee_spacing", "last_unsaturated_input"),
            ),
            Table(
                "horizon_rows",
                "pre-cap inputs: the horizon c·x_knee, and the first input whose gradient through the cap is exactly 0",
                horizon_rows,
                ("dtype", "cap", "horizon", "first_zero_grad_input"),
            ),
            Table(
                "backends",
                "first input whose f a backend returns as 1.0 (searched over the format's own values)",
                backend_rows,
                (*(("dtype",) if len(dtypes) > 1 or not real else ()), *(("fn",) if len(fns) > 1 else ()), "backend",
                 "first_saturating_input",
                 *(("saturated_run_start", "source") if real else ("monotone", "reason"))),
                wide=("last_unsaturated_input", "method", "supported", *(("monotone", "reason") if real else ())),
            ),
        ),
        notes=(
            "exact knee = f⁻¹(1 − ε₋/2): f correctly rounded to nearest reaches 1.0 there; ε₋ is the spacing just below 1.0",
            "document formula = (ln2/2)(p + 2): its criterion is half the spacing above 1.0, 2^−(p+1), which is too early",
            "first zero-grad input: a/c computed in fp32 (fp64 for fp64) and rounded to the format, tanh correctly rounded"
            " (torch autograd measures the same in `horizon`); — means no input of the format gets there",
            "backend 'exact' decides f(x) > 1 − ε₋/2 in float64 and, near the midpoint, in 160-bit mpmath; numpy's"
            " sigmoid is 1/(1 + exp(−x)) in the format",
            "monotone: every searched value past the switch also saturates (whole format when enumerated, ±4096 values"
            " when bisected)",
        ),
        answer=(*knee_answer(rows, horizon_rows)[:2], *stacks_sentence(backend_rows)),
    )


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
