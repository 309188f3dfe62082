"""What the attenuation costs end to end: gradient descent correcting a confidently wrong logit.

softcapgrad.md, "What the attenuation does not do". One wrong class with pre-cap logit a, the
correct class fixed at logit y, K − 2 further classes at 0, cross-entropy on the correct class:

    z = c·tanh(a/c)           p = e^z / (e^z + e^y + K − 2)
    dL/da = p · sech²(a/c)     (uncapped: z = a, dL/da = p)
    a ← a − lr · dL/da          until p < threshold

The step count is the Euler discretisation of the flow da/dt = −lr·p·sech², so

    N ≈ ∫_{a_end}^{a0} da / (lr · p(a) · sech²(a/c)),   p(a_end) = threshold,

and the pointwise factor 1/sech²(a0/c) applies only while p ≈ 1 — the short confident phase.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import lru_cache

import numpy as np

from softcapgrad.core.report import Report, Table
from softcapgrad.laws.saturation import sech2
from softcapgrad.laws.descent import Runs, Setting, descend, wrong_probability
from softcapgrad.laws.lowprecision import EAGER, Backward, descend_low_precision


def end_point(s: Setting, capped: bool) -> float | None:
    """a where p = threshold; None when the cap keeps z above the needed logit, inf when any a will do."""
    z_end = s.log_rest + math.log(s.threshold) - math.log1p(-s.threshold)
    if not capped:
        return z_end
    if z_end >= s.cap:
        return math.inf  # every capped logit already has p below the threshold
    return s.cap * math.atanh(z_end / s.cap) if z_end > -s.cap else None


def integral_steps(a0: float, s: Setting, capped: bool, points: int = 400_001) -> float | None:
    """∫ da / (lr·p·sech²) from a_end to a0: the continuous-time step count."""
    a_end = end_point(s, capped)
    if a_end is None:
        return None
    if a0 <= a_end:
        return 0.0
    a = np.linspace(a_end, a0, points)
    z = s.cap * np.tanh(a / s.cap) if capped else a
    g = s.lr * wrong_probability(z, s) * (sech2(a / s.cap) if capped else 1.0)
    return float(np.trapezoid(1.0 / g, a))


def run(a0: np.ndarray, s: Setting, capped: bool, dtype=None, backward: Backward = EAGER) -> Runs:
    if dtype is None or np.dtype(dtype) == np.float64:
        return descend(a0, s, capped)
    return descend_low_precision(a0, s, capped, dtype, backward)


def pointwise_factor(a0: float, cap: float) -> float:
    """1/sech²(a0/c): the attenuation's slowdown at the start alone."""
    return float(1.0 / sech2(np.float64(a0 / cap)))


def _steps_or_none(runs: Runs, i: int = 0) -> int | None:
    return int(runs.steps[i]) if runs.status[i] == "converged" else None


def _ratio(capped: Runs, uncapped: Runs, i: int = 0) -> float | None:
    a, b = _steps_or_none(capped, i), _steps_or_none(uncapped, i)
    return a / b if a is not None and b else None


@dataclass(frozen=True)
class Headline:
    status: str
    steps_capped: int | None
    steps_uncapped: int | None
    ratio: float | None
    pointwise_factor: float
    integral_capped: float | None
    integral_uncapped: float | None
    integral_ratio: float | None


@lru_cache(maxsize=32)  # the ledger and make reproduce's figure ask for the same runs
def headline(a0: float, s: Setting, dtype=None, backward: Backward = EAGER) -> tuple[Headline, Runs, Runs]:
    capped = run(np.array([a0]), s, True, dtype, backward)
    uncapped = run(np.array([a0]), s, False, dtype)
    i_capped, i_uncapped = integral_steps(a0, s, True), integral_steps(a0, s, False)
    return (
        Headline(
            status=str(capped.status[0]),
            steps_capped=_steps_or_none(capped),
            steps_uncapped=_steps_or_none(uncapped),
            ratio=_ratio(capped, uncapped),
            pointwise_factor=pointwise_factor(a0, s.cap),
            integral_capped=i_capped,
            integral_uncapped=i_uncapped,
            integral_ratio=i_capped / i_uncapped if i_capped is not None and i_uncapped else None,
        ),
        capped,
        uncapped,
    )


def sweep(a0s: list[float], s: Setting, dtype=None, backward: Backward = EAGER) -> list[dict]:
    starts = np.asarray(a0s, dtype=np.float64)
    capped, uncapped = run(starts, s, True, dtype, backward), run(starts, s, False, dtype)
    return [
        {
            "a0": float(a0),
            "status": str(capped.status[i]),
            "steps_capped": _steps_or_none(capped, i),
            "steps_uncapped": _steps_or_none(uncapped, i),
            "ratio": _ratio(capped, uncapped, i),
            "pointwise_factor": pointwise_factor(a0, s.cap),
        }
        for i, a0 in enumerate(starts)
    ]


def _phase_rows(label: str, runs: Runs, s: Setting) -> list[dict]:
    """Steps and mean attenuation per phase; a phase with no steps has no mean (None, not NaN)."""
    total = int(runs.steps[0])
    conf = int(runs.confident_steps[0])

    def mean(value: float, steps: int) -> float | None:
        return float(value) if steps and math.isfinite(float(value)) else None

    return [
        {"run": label, "phase": f"confident (p > {s.confident:g})", "steps": conf,
         "share": conf / total if total else None, "mean_attenuation": mean(runs.confident_mean_attenuation[0], conf)},
        {"run": label, "phase": "near the boundary", "steps": total - conf,
         "share": (total - conf) / total if total else None,
         "mean_attenuation": mean(runs.boundary_mean_attenuation[0], total - conf)},
    ]


def unreachable_threshold(s: Setting) -> str | None:
    """Why the capped run can never converge, or None: the cap keeps z above −c, so p ≥ p(−c)."""
    if end_point(s, True) is not None:
        return None
    floor = float(wrong_probability(np.float64(-s.cap), s))
    return (f"--threshold {s.threshold:g}: the cap keeps the wrong logit above −c = {-s.cap:g}, where its probability "
            f"is still {floor:.3g} (classes {s.classes}, correct logit {s.correct:g}); choose a threshold above that")


def dynamics_answer(a0: float, s: Setting, name: str, head: Headline, capped: Runs, sweep_rows: list[dict] | None,
                    backward: Backward) -> tuple[str, ...]:
    setting = f"c = {s.cap:g}, lr = {s.lr:g}, {name}" + ("" if backward.name == "eager" else f", {backward.name} backward")
    if head.status == "stalled":
        first = (f"Starting from pre-cap a0 = {a0:g} ({setting}) the wrong logit never moves: the gradient through the "
                 f"cap is exactly 0 there in {name}, so gradient descent stalls at step 0.")
    elif head.status != "converged":
        first = (f"Starting from pre-cap a0 = {a0:g} ({setting}) gradient descent did not push the wrong class below "
                 f"p = {s.threshold:g} within {s.max_steps:,} steps.")
    elif head.steps_capped == 0 or head.ratio is None:
        first = (f"At pre-cap a0 = {a0:g} ({setting}) the wrong class's probability is already below {s.threshold:g}: "
                 f"{head.steps_capped} steps with the cap, {head.steps_uncapped} without.")
    else:
        first = (f"Correcting a wrong logit from pre-cap a0 = {a0:g} ({setting}) takes {head.steps_capped:,} steps with "
                 f"the cap against {head.steps_uncapped:,} without: {head.ratio:.3g}× as many, although the gradient "
                 f"at the start is {head.pointwise_factor:.3g}× smaller.")
    sentences = [first]
    if head.status == "converged" and head.steps_capped:
        conf, total = int(capped.confident_steps[0]), int(capped.steps[0])
        rows = _phase_rows("capped", capped, s)
        boundary = rows[1]["mean_attenuation"]
        sentences.append(f"Only {conf:,} of the capped steps run while the wrong class is confident (p > {s.confident:g}); "
                         f"the other {total - conf:,} run near the boundary"
                         + (f" at a mean attenuation of {boundary:.2f}." if boundary is not None else "."))
    if sweep_rows:
        done = [r for r in sweep_rows if r["ratio"] is not None]
        stalled = [r["a0"] for r in sweep_rows if r["status"] == "stalled"]
        if done:
            sentences.append(f"Over the sweep the ratio runs from {done[0]['ratio']:.3g} (a0 = {done[0]['a0']:g}) to "
                             f"{done[-1]['ratio']:.3g} (a0 = {done[-1]['a0']:g})"
                             + (f"; starts from a0 = {min(stalled):g} stall." if stalled else "."))
    return tuple(sentences)


def dynamics_report(a0: float, s: Setting, dtype, sweep_a0: list[float] | None, backward: Backward = EAGER) -> Report:
    from softcapgrad.core.checks import InputError

    why = unreachable_threshold(s)
    if why:
        raise InputError(why)
    head, capped, uncapped = headline(a0, s, dtype, backward)
    name = np.dtype(dtype).name if dtype is not None else "float64"
    sweep_rows = sweep(sweep_a0, s, dtype, backward) if sweep_a0 else None
    tables = [
        Table("rows", f"correcting a wrong logit from a0 = {a0:g} (cap {s.cap:g}, {name})", [asdict(head)],
              ("status", "steps_capped", "steps_uncapped", "ratio", "pointwise_factor"),
              wide=("integral_capped", "integral_uncapped", "integral_ratio")),
        Table("phases", "where the steps go", _phase_rows("capped", capped, s) + _phase_rows("uncapped", uncapped, s)),
    ]
    if sweep_rows:
        tables.append(Table("sweep", "slowdown ratio by starting point", sweep_rows))
    notes = [
        "ratio = capped steps / uncapped steps; pointwise_factor = 1/sech²(a0/c), the slowdown at the start alone",
        "integral_* = ∫ da/(lr·p·sech²) from p = threshold to a0: the step count of the continuous flow",
        "most steps are spent near the boundary, where the attenuation is close to 1",
    ]
    if head.status == "not converged":
        notes.append(f"did not converge within {s.max_steps} steps" + (
            "; the threshold needs a logit below −c, which the cap never reaches" if end_point(s, True) is None else ""))
    if dtype is not None and name != "float64":
        notes.append(f"{name}: fp32 master value; cap forward and backward in {name}; 'stalled' = gradient exactly 0")
        if backward.name == "remedy":
            notes.append("backward=remedy: softcapgrad.softcap, the cap's gradient recomputed as sech²(a/c) in fp32 from the input")
    return Report(
        command="dynamics",
        params={"a0": a0, "dtype": name, "backward": backward.name, **asdict(s), "sweep": sweep_a0},
        tables=tuple(tables),
        notes=tuple(notes),
        figures={k: getattr(head, k) for k in ("status", "steps_capped", "steps_uncapped", "ratio", "pointwise_factor")},
        answer=dynamics_answer(a0, s, name, head, capped, sweep_rows, backward),
    )
