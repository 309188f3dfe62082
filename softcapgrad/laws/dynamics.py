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

import bisect
import math
import struct
import sys
from dataclasses import asdict, dataclass
from functools import cache, lru_cache
from typing import Callable

import numpy as np

from softcapgrad.core.report import Report, Table
from softcapgrad.laws.saturation import sech2


@dataclass(frozen=True)
class Setting:
    cap: float
    lr: float = 1.0
    threshold: float = 1e-3
    classes: int = 2
    correct: float = 0.0  # the correct class's fixed logit
    max_steps: int = 100_000
    confident: float = 0.5  # p above this counts as the confident phase

    @property
    def log_rest(self) -> float:
        """ln(e^y + K − 2): the log softmax mass of every class but the wrong one, without overflow."""
        return float(np.logaddexp(self.correct, math.log(self.classes - 2))) if self.classes > 2 else self.correct


def wrong_probability(z: np.ndarray, s: Setting) -> np.ndarray:
    """p = e^z/(e^z + rest) = 1/(1 + e^{−(z − ln rest)}), without overflow or cancellation."""
    return np.exp(-np.logaddexp(0.0, s.log_rest - np.asarray(z)))


@dataclass(frozen=True)
class Runs:
    """Per-start results of vectorised descent: one entry per a0."""

    a0: np.ndarray
    steps: np.ndarray  # updates until p < threshold
    status: np.ndarray  # "converged" | "stalled" | "not converged"
    confident_steps: np.ndarray
    confident_mean_attenuation: np.ndarray
    boundary_mean_attenuation: np.ndarray
    log_g_variation: np.ndarray  # Σ (exp|Δ ln g| − 1) along the path: bound on |steps − integral|


def _sech2(x: float) -> float:
    """1/cosh(x)², as :func:`attenuation.sech2` computes it in float64; 0 once cosh overflows."""
    try:
        ch = math.cosh(x)
    except OverflowError:
        return 0.0
    return 1.0 / (ch * ch)


def _wrong_probability(z: float, log_rest: float) -> float:
    """:func:`wrong_probability` for one value: numpy's logaddexp(0, t), t = ln(rest) − z, written out."""
    t = log_rest - z
    if t == 0.0:
        softplus = math.log(2.0)
    elif t > 0.0:
        softplus = t + math.log1p(math.exp(-t))
    else:
        softplus = math.log1p(math.exp(t))
    return math.exp(-softplus)


def _variation(log_g: float, log_g_prev: float) -> float:
    """exp|Δ ln g| − 1 with numpy's nan_to_num: NaN counts 0, overflow the largest float."""
    try:
        v = math.expm1(abs(log_g - log_g_prev))
    except OverflowError:
        return sys.float_info.max
    return 0.0 if math.isnan(v) else min(v, sys.float_info.max)


def descend(a0: np.ndarray, s: Setting, capped: bool) -> Runs:
    """Plain gradient descent on a, float64, one start at a time in Python floats.

    Value for value the arithmetic of the numpy formulas (:func:`wrong_probability`,
    :func:`attenuation.sech2`): tanh is numpy's, whose float64 tanh differs from the math module's
    in the last bit; exp, log1p, cosh, log and expm1 come from the math module, which numpy's
    agree with. A step costs a few microseconds instead of a numpy call per operation.
    """
    starts = np.asarray(a0, dtype=np.float64)
    n = starts.size
    steps, conf_steps = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    conf_att, bound_att, variation = np.zeros(n), np.zeros(n), np.zeros(n)
    status = np.full(n, "not converged", dtype=object)
    c, lr, log_rest, tanh = s.cap, s.lr, s.log_rest, np.tanh
    for j, a in enumerate(starts.tolist()):
        taken = conf = 0
        att_conf = att_bound = var = 0.0
        log_g_prev = math.nan
        for n_step in range(s.max_steps + 1):
            p = _wrong_probability(c * float(tanh(a / c)) if capped else a, log_rest)
            if p < s.threshold:
                status[j] = "converged"
                break
            if n_step == s.max_steps:
                break
            att = _sech2(a / c) if capped else 1.0
            g = p * att
            log_g = math.log(g) if g > 0.0 else -math.inf
            var += _variation(log_g, log_g_prev)
            log_g_prev = log_g
            if p > s.confident:
                conf += 1
                att_conf += att
            else:
                att_bound += att
            a -= lr * g
            taken += 1
        steps[j], conf_steps[j], conf_att[j], bound_att[j], variation[j] = taken, conf, att_conf, att_bound, var
    with np.errstate(invalid="ignore", divide="ignore"):
        return Runs(
            a0=starts,
            steps=steps,
            status=status.astype(str),
            confident_steps=conf_steps,
            confident_mean_attenuation=conf_att / conf_steps,
            boundary_mean_attenuation=bound_att / (steps - conf_steps),
            log_g_variation=variation,
        )


def eager_cap(x, c: float):
    """z = c·tanh(x/c) op by op in x's format, autograd's own backward."""
    import torch

    return c * torch.tanh(x / c)


@dataclass(frozen=True)
class Backward:
    """The cap as a low-precision step computes it: a name for reports and z = cap(x, c) in torch.

    The default is autograd's own; a caller that owns another (the remedy, softcapgrad.softcap) passes
    it in as ``Backward("remedy", softcap)``.
    """

    name: str
    cap: Callable = eager_cap


EAGER = Backward("eager")


def _capped_loss(x, s: Setting, capped: bool, backward: Backward):
    """The step's forward from the logit x (in its format): margin z − ln(rest) in fp32, and the loss."""
    import torch

    z = backward.cap(x, s.cap) if capped else x
    margin = z.float() - s.log_rest
    return margin, torch.nn.functional.softplus(margin).sum()  # −log(1 − p) = CE on the correct class + const


def descend_low_precision(a0: np.ndarray, s: Setting, capped: bool, dtype, backward: Backward = EAGER) -> Runs:
    """Mixed precision: fp32 master a; the cap forward and backward in ``dtype`` by torch autograd.

    The loss (softmax cross-entropy) is taken in fp32 from the low-precision logit. A start whose
    gradient is exactly 0 while p ≥ threshold can never move again: it is 'stalled'. With
    ``Backward("remedy", softcapgrad.softcap)`` the cap has the same forward and an fp32 sech² backward.
    16-bit formats run from a table of every value's step (:func:`descend_by_table`), wider ones
    step by step (:func:`descend_autograd`).
    """
    if np.dtype(dtype).itemsize == 2:
        return descend_by_table(a0, s, capped, dtype, backward)
    return descend_autograd(a0, s, capped, dtype, backward)


@dataclass(frozen=True)
class _Steps:
    """What one step does from each value of a 16-bit format, values ascending (±0 merged, ±inf kept)."""

    lower: list[float]  # the smallest fp32 master value that rounds to this value
    step: list[float]  # fp32(lr·grad): the update of the fp32 master value
    stalled: list[bool]  # the gradient is exactly 0
    done: list[bool]  # p < threshold
    confident: list[bool]  # p > s.confident
    attenuation: list[float]  # grad/p in float64, at least 0


@cache
def _steps(s: Setting, capped: bool, dtype_name: str, backward: Backward) -> _Steps:
    """One autograd call over every value of the format: the step each value would take."""
    import torch

    tdtype = getattr(torch, dtype_name)
    patterns = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(tdtype)
    values = patterns[~patterns.isnan() & (patterns.view(torch.int16) != torch.iinfo(torch.int16).min)]  # drop −0
    values = values.sort().values
    x = values.clone().requires_grad_(True)
    margin, loss = _capped_loss(x, s, capped, backward)
    (grad,) = torch.autograd.grad(loss, x)
    p = torch.sigmoid(margin.detach())
    # rounding to the format is monotone: value k takes the fp32 inputs from the midpoint with its lower
    # neighbour up (the midpoint itself when it rounds up); ±inf take everything past max ± ulp/2
    wide = values.double()
    beyond = 2 * wide[-2] - wide[-3]  # where a value past the largest would be, for the rounding to ±inf
    spaced = torch.cat([-beyond.view(1), wide[1:-1], beyond.view(1)])
    mids = ((spaced[:-1] + spaced[1:]) / 2).float()  # between consecutive values: exact in fp32
    up = mids.to(tdtype).double() == wide[1:]
    lower = torch.where(up, mids, torch.nextafter(mids, torch.tensor(math.inf)))
    return _Steps(
        lower=[-math.inf, *lower.tolist()],
        step=(s.lr * grad.float()).tolist(),
        stalled=(grad == 0).tolist(),
        done=(p < s.threshold).tolist(),
        confident=(p > s.confident).tolist(),
        attenuation=(grad.double() / p.double()).clamp(min=0).tolist(),
    )


_F32 = struct.Struct("<f")


def descend_by_table(a0: np.ndarray, s: Setting, capped: bool, dtype, backward: Backward = EAGER) -> Runs:
    """:func:`descend_autograd` for a 16-bit format, with the same arithmetic and bit-identical steps.

    Each step depends only on the value the fp32 master rounds to, so one autograd call over all
    65,536 values (:func:`_steps`) replaces one call per step; the descent then walks the table in
    Python floats, rounding the master value to fp32 after each update as torch does.
    """
    import torch

    table = _steps(s, capped, np.dtype(dtype).name, backward)
    starts = torch.tensor(np.asarray(a0, dtype=np.float64), dtype=torch.float32).tolist()
    n = len(starts)
    steps, conf_steps = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    conf_att, bound_att = np.zeros(n), np.zeros(n)
    status = np.full(n, "not converged", dtype=object)
    lower, step, stalled, done = table.lower, table.step, table.stalled, table.done
    confident, attenuation = table.confident, table.attenuation
    for j, a in enumerate(starts):
        taken = conf = 0
        att_conf = att_bound = 0.0
        for n_step in range(s.max_steps + 1):
            k = bisect.bisect_right(lower, a) - 1
            if done[k] or stalled[k]:
                status[j] = "converged" if done[k] else "stalled"
                break
            if n_step == s.max_steps:
                break
            if confident[k]:
                conf += 1
                att_conf += attenuation[k]
            else:
                att_bound += attenuation[k]
            a = _F32.unpack(_F32.pack(a - step[k]))[0]
            taken += 1
        steps[j], conf_steps[j], conf_att[j], bound_att[j] = taken, conf, att_conf, att_bound
    with np.errstate(invalid="ignore", divide="ignore"):
        return Runs(
            a0=np.asarray(a0, dtype=np.float64),
            steps=steps,
            status=status.astype(str),
            confident_steps=conf_steps,
            confident_mean_attenuation=conf_att / conf_steps,
            boundary_mean_attenuation=bound_att / (steps - conf_steps),
            log_g_variation=np.full(n, np.nan),
        )


def descend_autograd(a0: np.ndarray, s: Setting, capped: bool, dtype, backward: Backward = EAGER) -> Runs:
    """:func:`descend_low_precision` one autograd call per step, all starts at once (any format)."""
    import torch

    tdtype = getattr(torch, np.dtype(dtype).name)
    a = torch.tensor(np.asarray(a0, dtype=np.float64), dtype=torch.float32)
    n = a.numel()
    steps = torch.zeros(n, dtype=torch.int64)
    done = torch.zeros(n, dtype=torch.bool)
    stalled = torch.zeros(n, dtype=torch.bool)
    conf_steps = torch.zeros(n, dtype=torch.int64)
    conf_att = torch.zeros(n, dtype=torch.float64)
    bound_att = torch.zeros(n, dtype=torch.float64)
    for n_step in range(s.max_steps + 1):
        x = a.to(tdtype).requires_grad_(True)
        margin, loss = _capped_loss(x, s, capped, backward)
        (grad,) = torch.autograd.grad(loss, x)
        p = torch.sigmoid(margin.detach())
        done |= p < s.threshold
        stalled |= ~done & (grad == 0)
        active = ~done & ~stalled
        if not bool(active.any()) or n_step == s.max_steps:
            break
        att = (grad.double() / p.double()).clamp(min=0)  # the attenuation the format actually applied
        confident = p > s.confident
        conf_steps += (active & confident).long()
        conf_att += torch.where(active & confident, att, 0.0)
        bound_att += torch.where(active & ~confident, att, 0.0)
        a = torch.where(active, a - s.lr * grad.float(), a)
        steps += active.long()
    status = np.where(done.numpy(), "converged", np.where(stalled.numpy(), "stalled", "not converged"))
    cs = conf_steps.numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        return Runs(
            a0=np.asarray(a0, dtype=np.float64),
            steps=steps.numpy(),
            status=status,
            confident_steps=cs,
            confident_mean_attenuation=conf_att.numpy() / cs,
            boundary_mean_attenuation=bound_att.numpy() / (steps.numpy() - cs),
            log_g_variation=np.full(n, np.nan),
        )


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
