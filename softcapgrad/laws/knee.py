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

from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from softcapgrad.laws import formats
from softcapgrad.laws.formats import Switch
from softcapgrad.laws.horizon import first_zero_in_format
from softcapgrad.laws.saturation import knee_doc_formula, knee_exact, knee_spacing
from softcapgrad.core.report import Report, Table

BACKENDS = ("exact", "numpy", "torch")


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


def varies_with_cpu(backend: str, dtype: np.dtype, fn: str) -> bool:
    """Whether this backend's answer depends on the CPU it runs on, not only on its version.

    torch's float64 tanh on a build with MKL is MKL's vector math, whose code path MKL picks per CPU:
    with torch 2.13.0 setting MKL_CBWR (AVX2 or AVX512) moves the float64 knee by thousands of ulps,
    while float32 tanh and float64 sigmoid stay bit for bit (tests/test_cpu_independence.py measures both).
    """
    if backend != "torch" or fn != "tanh" or dtype != np.dtype(np.float64):
        return False
    import torch

    return torch.backends.mkl.is_available()


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
    varies_with_cpu: bool = False  # the same versions may answer otherwise on another CPU (see varies_with_cpu())


StackKnee = Callable[[np.dtype, str, list[float], str], BackendKnee]


def backend_knee(dtype: np.dtype, backend: str, caps: list[float], fn: str = "tanh",
                 stack_knee: StackKnee | None = None) -> BackendKnee:
    """Where ``backend`` first stores f(x) as 1.0 in ``dtype``: searched here for the format-level backends
    (exact, numpy, torch); a real stack's answer comes from ``stack_knee`` (softcapgrad.stacks.knees)."""
    if backend not in BACKENDS:
        if stack_knee is None:
            raise ValueError(f"{backend} is a real stack: its knee needs stack_knee")
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
        varies_with_cpu=varies_with_cpu(backend, dtype, fn),
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


# --- reports ---------------------------------------------------------------------------------


BACKWARD_LAW = {"tanh": "1 − y²", "sigmoid": "y(1 − y)"}  # autograd's backward from the stored output y


def knee_answer(rows: list[dict], horizon_rows: list[dict]) -> tuple[str, ...]:
    tanh_rows = [r for r in rows if r["fn"] == "tanh"] or rows
    if len(tanh_rows) > 1:
        lo = min(tanh_rows, key=lambda r: r["knee_exact"])
        hi = max(tanh_rows, key=lambda r: r["knee_exact"])
        return (
            f"Across these {len(tanh_rows)} formats {tanh_rows[0]['fn']}(x) rounds to exactly 1.0 from x = "
            f"{lo['knee_exact']:.4g} ({lo['dtype']}) up to x = {hi['knee_exact']:.4g} ({hi['dtype']}); past it the "
            f"gradient {BACKWARD_LAW[tanh_rows[0]['fn']]} read from the stored output is exactly 0.",
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


def knee_report(dtypes: list[np.dtype], caps: list[float], backends: list[str], fns: list[str],
                stack_knee: StackKnee | None = None) -> Report:
    rows, backend_rows, horizon_rows = [], [], []
    real = any(b not in BACKENDS for b in backends)  # real stacks: where the run of 1.0s starts (monotone when it is
    # where the first 1.0 is), and the source
    for dtype in dtypes:
        for fn in fns:
            row, search = knee(dtype, caps, fn)
            rows.append(asdict(row))
            for backend in backends:
                found = search if backend == "exact" else backend_knee(dtype, backend, caps, fn, stack_knee)
                backend_rows.append(asdict(found))
            if fn != "tanh":
                continue
            for c in caps:
                zero = first_zero_in_format(c, dtype, row.first_saturating_input)
                horizon_rows.append({"dtype": row.dtype, "fn": fn, "cap": c, "horizon": c * row.knee_exact,
                                     "first_zero_grad_input": None if zero is None else zero.first_true})
    absent: dict[str, list[str]] = {}  # why a real stack has no figure here, once per reason
    for b in backend_rows:
        if b["source"] == "not measured" and b["reason"]:
            absent.setdefault(b["reason"], []).append(b["backend"])
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
            *(f"{', '.join(dict.fromkeys(paths))}: {why}" for why, paths in absent.items()),
            *(("torch float64 tanh is MKL's vector math here, whose code path MKL picks by CPU (MKL_CBWR sets it):"
               " that row is this CPU's answer, another CPU's may differ",)
              if any(b["varies_with_cpu"] for b in backend_rows) else ()),
        ),
        answer=(*knee_answer(rows, horizon_rows)[:2], *stacks_sentence(backend_rows)),
    )
