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

import numpy as np

from softcapgrad.report import Report, Table
from softcapgrad.attenuation import sech2


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
    def rest(self) -> float:
        """e^y + K − 2: the softmax mass of every class but the wrong one."""
        return math.exp(self.correct) + self.classes - 2


def wrong_probability(z: np.ndarray, s: Setting) -> np.ndarray:
    """p = e^z/(e^z + rest) = 1/(1 + e^{−(z − ln rest)}), without overflow or cancellation."""
    return np.exp(-np.logaddexp(0.0, math.log(s.rest) - np.asarray(z)))


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


def descend(a0: np.ndarray, s: Setting, capped: bool) -> Runs:
    """Plain gradient descent on a, float64, all starts at once (one Python loop over steps)."""
    a = np.array(a0, dtype=np.float64)
    n = a.size
    steps = np.zeros(n, dtype=np.int64)
    done = np.zeros(n, dtype=bool)
    conf_steps = np.zeros(n, dtype=np.int64)
    conf_att = np.zeros(n)
    bound_att = np.zeros(n)
    variation = np.zeros(n)
    log_g_prev = np.full(n, np.nan)
    for n_step in range(s.max_steps + 1):
        z = s.cap * np.tanh(a / s.cap) if capped else a
        p = wrong_probability(z, s)
        done |= p < s.threshold
        active = ~done
        if not active.any() or n_step == s.max_steps:
            break
        att = sech2(a / s.cap) if capped else np.ones(n)
        g = p * att
        log_g = np.log(g)
        step_var = np.expm1(np.abs(log_g - log_g_prev))
        variation[active] += np.nan_to_num(step_var[active])
        log_g_prev = log_g
        confident = p > s.confident
        conf_steps[active & confident] += 1
        conf_att[active & confident] += att[active & confident]
        bound_att[active & ~confident] += att[active & ~confident]
        a[active] -= s.lr * g[active]
        steps[active] += 1
    status = np.where(done, "converged", "not converged")
    boundary_steps = steps - conf_steps
    with np.errstate(invalid="ignore", divide="ignore"):
        return Runs(
            a0=np.asarray(a0, dtype=np.float64),
            steps=steps,
            status=status,
            confident_steps=conf_steps,
            confident_mean_attenuation=conf_att / conf_steps,
            boundary_mean_attenuation=bound_att / boundary_steps,
            log_g_variation=variation,
        )


def descend_low_precision(a0: np.ndarray, s: Setting, capped: bool, dtype, backward: str = "eager") -> Runs:
    """Mixed precision: fp32 master a; the cap forward and backward in ``dtype`` by torch autograd.

    The loss (softmax cross-entropy) is taken in fp32 from the low-precision logit. A start whose
    gradient is exactly 0 while p ≥ threshold can never move again: it is 'stalled'. With
    ``backward="remedy"`` the cap is ``softcapgrad.softcap``: same forward, fp32 sech² backward.
    """
    import torch

    from softcapgrad.remedy import softcap

    tdtype = getattr(torch, np.dtype(dtype).name)
    a = torch.tensor(np.asarray(a0, dtype=np.float64), dtype=torch.float32)
    n = a.numel()
    steps = torch.zeros(n, dtype=torch.int64)
    done = torch.zeros(n, dtype=torch.bool)
    stalled = torch.zeros(n, dtype=torch.bool)
    conf_steps = torch.zeros(n, dtype=torch.int64)
    conf_att = torch.zeros(n, dtype=torch.float64)
    bound_att = torch.zeros(n, dtype=torch.float64)
    shift = math.log(s.rest)
    for n_step in range(s.max_steps + 1):
        x = a.to(tdtype).requires_grad_(True)
        if not capped:
            z = x
        else:
            z = softcap(x, s.cap) if backward == "remedy" else s.cap * torch.tanh(x / s.cap)
        margin = z.float() - shift
        loss = torch.nn.functional.softplus(margin).sum()  # −log(1 − p) = CE on the correct class + const
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
    """a where p = threshold; None when the cap keeps z above the needed logit."""
    z_end = math.log(s.rest) + math.log(s.threshold / (1.0 - s.threshold))
    if not capped:
        return z_end
    return s.cap * math.atanh(z_end / s.cap) if abs(z_end) < s.cap else None


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


def run(a0: np.ndarray, s: Setting, capped: bool, dtype=None, backward: str = "eager") -> Runs:
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


def headline(a0: float, s: Setting, dtype=None, backward: str = "eager") -> tuple[Headline, Runs, Runs]:
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


def sweep(a0s: list[float], s: Setting, dtype=None, backward: str = "eager") -> list[dict]:
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
    total = int(runs.steps[0])
    conf = int(runs.confident_steps[0])
    return [
        {"run": label, "phase": f"confident (p > {s.confident:g})", "steps": conf,
         "share": conf / total if total else None, "mean_attenuation": float(runs.confident_mean_attenuation[0])},
        {"run": label, "phase": "near the boundary", "steps": total - conf,
         "share": (total - conf) / total if total else None, "mean_attenuation": float(runs.boundary_mean_attenuation[0])},
    ]


def dynamics_report(a0: float, s: Setting, dtype, sweep_a0: list[float] | None, backward: str = "eager") -> Report:
    head, capped, uncapped = headline(a0, s, dtype, backward)
    name = np.dtype(dtype).name if dtype is not None else "float64"
    tables = [
        Table("rows", f"correcting a wrong logit from a0 = {a0:g} (cap {s.cap:g}, {name})", [asdict(head)]),
        Table("phases", "where the steps go", _phase_rows("capped", capped, s) + _phase_rows("uncapped", uncapped, s)),
    ]
    if sweep_a0:
        tables.append(Table("sweep", "slowdown ratio by starting point", sweep(sweep_a0, s, dtype, backward)))
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
        if backward == "remedy":
            notes.append("backward=remedy: softcapgrad.softcap, the cap's gradient recomputed as sech²(a/c) in fp32 from the input")
    return Report(
        command="dynamics",
        params={"a0": a0, "dtype": name, "backward": backward, **asdict(s), "sweep": sweep_a0},
        tables=tuple(tables),
        notes=tuple(notes),
        figures={k: getattr(head, k) for k in ("status", "steps_capped", "steps_uncapped", "ratio", "pointwise_factor")},
    )
