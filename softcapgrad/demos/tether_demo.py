"""`tether-demo`: TetherGate doing what tethergate.md says, measured.

Sections: collapse (a plain learned gate drifts closed, the tethered one holds near g_target),
wd (the equilibrium offset (1 − lr·wd)/wd ≈ 1/wd under a steady push, whatever the LR), clamp
(zero loss gradient past the clamp; the spring brings θ back), floor (the schedules; no loss
gradient while F = 1), anchors (global versus local).
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
import torch

from softcapgrad.core.report import Report, Table
from softcapgrad.training.tether import FloorSchedule, TetherGate, anchor_targets, floor_schedule, tethergate_step
from softcapgrad.core.names import TETHER_SECTIONS as SECTIONS

PUSH_LRS = [1e-3, 1e-2, 1.5e-1]  # a 150× range
PUSH_WDS = [20.0, 5.0, 0.5]
BETA = 6.0
# The collapse run is float64: in float32 the CPU's vector kernels (sigmoid, the pow of Adam's bias
# correction, randn's Box–Muller) differ in the last place between AVX-512, AVX2 and ATen's scalar
# code, and a hundred Adam steps carry that into the 7th digit, enough to move a line of the figure
# by a pixel. In float64 the same differences stay near 1e-16. (The wd section is float32 numpy,
# one rounding per operation: the same bits everywhere.)
DTYPE = torch.float64
# ... but not at 0: float64 sigmoid is SLEEF's exp in the vector kernels and libm's in the scalar ones,
# a few ulps apart, so the run's means differ in their 16th–17th digit between CPUs (measured over all
# 2,001 steps, two seeds: at most 9e-16 relative, not growing with the steps). The rows keep
# ROW_DIGITS significant digits: five orders of magnitude above that spread, so two CPUs print the
# same bytes unless a value lies within ~1e-15 of a rounding boundary (about 1 in 10^5 values).
ROW_DIGITS = 10


def _signal(gen: torch.Generator, tokens: int, means: torch.Tensor) -> torch.Tensor:
    return means + torch.randn(tokens, means.numel(), generator=gen, dtype=DTYPE)


def _adam(params: list[torch.Tensor], lr: float):
    """``step(grads)``: torch's Adam update (``torch.optim.adam.adam``, the function ``Adam.step``
    calls, bit for bit, with Adam's defaults) without the Optimizer wrapper, whose per-call
    bookkeeping costs more than the update of a few values."""
    from torch.optim.adam import adam

    state = [(torch.zeros_like(p), torch.zeros_like(p), torch.tensor(0.0)) for p in params]
    m, v, t = (list(x) for x in zip(*state))

    @torch.no_grad()
    def step(grads: list[torch.Tensor]) -> None:
        adam(params, grads, m, v, [], t, foreach=False, capturable=False, differentiable=False, fused=None,
             grad_scale=None, found_inf=None, has_complex=False, amsgrad=False, beta1=0.9, beta2=0.999, lr=lr,
             weight_decay=0.0, eps=1e-8, maximize=False)

    return step


# --- collapse ---------------------------------------------------------------------------------


def _digits(value: torch.Tensor) -> float:
    """The value to ROW_DIGITS significant digits (see ROW_DIGITS)."""
    return float(f"{float(value):.{ROW_DIGITS}g}")


def collapse(steps: int, lr: float, wd: float, g_target: float, seed: int, checkpoints: list[int]) -> list[dict]:
    """A branch that only adds noise: loss = mean((g·b)²) closes any gate the optimizer controls."""
    means = torch.tensor([-0.5, 0.0, 0.5, 1.0], dtype=DTYPE)
    tether = TetherGate(4, beta=BETA).to(DTYPE)
    plain_theta = torch.zeros(4, dtype=DTYPE, requires_grad=True)
    # one Adam and one gradient call for both gates: Adam is per parameter and neither loss reaches
    # the other gate, so each θ moves exactly as under its own optimizer
    thetas = [tether.theta, plain_theta]
    adam = _adam(thetas, lr)
    schedule = FloorSchedule("exp", ramp_start=steps // 20, tau=steps / 10)
    gen = torch.Generator().manual_seed(seed)
    wanted = set(checkpoints)
    rows = []
    for step in range(steps + 1):
        s = _signal(gen, 256, means)
        branch = torch.randn(256, 4, generator=gen, dtype=DTYPE)
        g_t = tether(s)
        g_p = torch.sigmoid(BETA * (s - plain_theta))
        if step in wanted:
            offset = tether.theta.detach() - anchor_targets(tether, g_target, "global")
            # the floor is F(step) from Python's math, the same on every CPU: kept whole
            rows.append({"step": step, "plain_mean_gate": _digits(g_p.detach().mean()),
                         "tether_mean_gate": _digits(g_t.detach().mean()), "tether_floor": float(tether.floor.mean()),
                         "tether_theta_minus_anchor": _digits(offset.mean())})
        adam(list(torch.autograd.grad(((g_t * branch) ** 2).mean() + ((g_p * branch) ** 2).mean(), thetas)))
        tethergate_step(tether, step, schedule, lr=lr, wd=wd, g_target=g_target)
    return rows


# --- choosing wd ------------------------------------------------------------------------------


def steady_push(lrs: list[float], wds: list[float], steps: int | None = None) -> list[dict]:
    """Adam under a constant closing gradient, the spring after each step (float32, as a training step
    computes it, but the same bits on every CPU: :func:`adam_push_updates`).

    Computed once per process for each argument list (the ledger and the figure share it).
    """
    return [dict(r) for r in _steady_push(tuple(lrs), tuple(wds), steps)]


def adam_push_updates(lr: float, n: int) -> np.ndarray:
    """The first ``n`` updates Adam (β₁ = 0.9, β₂ = 0.999, ε = 1e-8) makes under a constant gradient of −1.

    Adam's state never sees θ, so under a constant gradient its updates are one sequence, the same
    for every element: m ← m + (1 − β₁)(g − m), v ← β₂v + (1 − β₂)g², θ ← θ − (lr/(1 − β₁ᵗ))·m/(√v/√(1 − β₂ᵗ) + ε),
    written out as torch's single-tensor Adam writes it, in float32 with every operation rounded once
    (numpy's), so that the figure is the same on every CPU. torch's own kernels fuse the m update into
    one rounding on AVX2/AVX-512 but not in their scalar build, and their float32 √ is not always the
    correctly rounded one, so torch's Adam itself differs between CPUs in the last bits.
    """
    f32 = np.float32
    w, b2, s2, eps, g = f32(1 - 0.9), f32(0.999), f32(1 - 0.999), f32(1e-8), f32(-1.0)
    m = v = f32(0.0)
    out = np.empty(n, dtype=np.float32)
    for t in range(1, n + 1):
        m = f32(m + f32(w * f32(g - m)))
        v = f32(f32(v * b2) + f32(f32(s2 * g) * g))
        denom = f32(f32(np.sqrt(v) / f32((1 - 0.999**t) ** 0.5)) + eps)
        out[t - 1] = f32(f32(f32(-lr / (1 - 0.9**t)) * m) / denom)
    return out


@cache
def _steady_push(lrs: tuple[float, ...], wds: tuple[float, ...], steps: int | None) -> list[dict]:
    rows = []
    for lr in lrs:
        # TetherGate's anchor with the EMA at 0 is θ* = −logit(0.5)/β = 0; the spring is θ ← θ − k(θ − θ*)
        k = np.array([lr * wd for wd in wds], dtype=np.float32)
        n = steps or int(min(20_000, math.ceil(8 / float(k.min()))))
        updates = adam_push_updates(lr, n)  # ∂L/∂θ = −1: descent raises θ, closing the gate
        theta = np.zeros(len(wds), dtype=np.float32)
        history = np.empty((n, len(wds)), dtype=np.float32)
        with np.errstate(over="ignore", invalid="ignore"):  # lr·wd ≥ 2 diverges, as the table says
            for step in range(n):
                theta = theta + updates[step]
                theta = theta - k * theta
                history[step] = theta
        final = history[-1]
        for j, wd in enumerate(wds):
            kj = lr * wd
            reach = np.flatnonzero(history[:, j] >= (1 - math.exp(-1)) * final[j])
            stable = bool(np.isfinite(history[:, j]).all()) and abs(float(final[j])) < 10 / max(wd, 1e-12)
            rows.append({
                "lr": lr, "wd": wd, "lr_wd": kj, "steps": n,
                "offset": float(final[j]), "one_over_wd": 1 / wd, "exact_offset": (1 - kj) / wd,
                "shift": BETA * float(final[j]), "beta_over_wd": BETA / wd,
                "time_constant": int(reach[0]) + 1 if stable and len(reach) else None,
                "one_over_lr_wd": 1 / kj,
                "regime": "ok" if kj <= 0.1 else ("lr·wd not ≪ 1" if kj < 1 else ("overshoots" if kj < 2 else "diverges")),
            })
    return rows


def stability_boundary(lr: float = 0.01, wd_grid: int = 400, steps: int = 400) -> float:
    """Smallest lr·wd on a grid at which the pushed spring no longer settles (|θ| grows); float64 numpy,
    whose grid and steps round the same on every CPU."""
    ks = np.linspace(0.05, 4.0, wd_grid, dtype=np.float64)
    d = np.zeros_like(ks)
    with np.errstate(over="ignore", invalid="ignore"):
        for _ in range(steps):
            d = (d + lr) * (1 - ks)  # Adam's step under a constant push is lr; then the spring
        unsettled = ~(np.abs(d) < 10 * lr / ks)
    return float(ks[np.flatnonzero(unsettled)[0]]) if unsettled.any() else math.inf


# --- the clamp --------------------------------------------------------------------------------


def clamp_recovery(lr: float, wd: float, start_theta: float) -> dict:
    gate = TetherGate(1, beta=BETA, theta_init=start_theta)
    s = torch.zeros(8, 1)
    gate(s)  # first observation: EMA = 0, θ* = 0
    g = gate.eval()(s)
    (grad,) = torch.autograd.grad(g.sum(), gate.theta)
    schedule = FloorSchedule("exp", ramp_start=0, f_min=0.0, tau=1.0)
    steps = 0
    while BETA * (0.0 - float(gate.theta.detach()[0])) < gate.arg_min:
        tethergate_step(gate, steps + 1, schedule, lr=lr, wd=wd)
        steps += 1
    k = lr * wd
    return {"theta_start": start_theta, "arg_start": -BETA * start_theta, "arg_min": gate.arg_min,
            "loss_grad_on_theta": float(grad[0]), "spring_steps_to_reenter": steps,
            "closed_form_steps": math.ceil(math.log((-gate.arg_min / BETA) / start_theta) / math.log(1 - k))}


# --- floor schedules --------------------------------------------------------------------------


def floor_table(steps: list[int], ramp_start: int, ramp_end: int, tau: float, f_min: float) -> list[dict]:
    return [{"step": t, "exp": floor_schedule(t, "exp", ramp_start, f_min, tau),
             "cos": floor_schedule(t, "cos", ramp_start, f_min, ramp_end=ramp_end)} for t in steps]


def asleep_gradient() -> list[dict]:
    rows = []
    for floor in (1.0, 0.5):
        gate = TetherGate(3, beta=BETA)
        gate.floor.fill_(floor)
        s = torch.tensor([[-0.3, 0.0, 0.4]])
        (grad,) = torch.autograd.grad(gate(s).sum(), gate.theta)
        rows.append({"floor": floor, "max_abs_theta_grad": float(grad.abs().max())})
    return rows


# --- anchors ----------------------------------------------------------------------------------


def anchors(means: list[float], steps: int, lr: float, wd: float, g_target: float) -> list[dict]:
    rows = []
    m = torch.tensor(means)
    for anchor in ("global", "local"):
        gate = TetherGate(len(means), beta=BETA)
        gate(m.unsqueeze(0))  # EMA = the means
        schedule = FloorSchedule("exp", ramp_start=0, tau=1.0)
        for step in range(1, steps + 1):
            before = gate.theta.detach().clone()
            tethergate_step(gate, step, schedule, lr=lr, wd=wd, g_target=g_target, anchor=anchor)
            if step > 1 and torch.equal(before, gate.theta):  # a fixed point: every later step is this one
                break
        theta = gate.theta.detach()
        opening = torch.sigmoid(BETA * (m - theta))
        for i, mu in enumerate(means):
            rows.append({"anchor": anchor, "gate": i, "signal_mean": mu, "theta": float(theta[i]),
                         "opening_at_mean_signal": float(opening[i])})
    return rows


def spring_regime(lr_wd: float) -> str:
    """How θ ← (θ + lr)(1 − lr·wd) behaves: monotone below 1, oscillating below 2, divergent from 2."""
    return "monotone" if lr_wd < 1 else ("oscillating" if lr_wd < 2 else "unstable")


def tether_demo_answer(tables: dict[str, list[dict]], boundary: float | None) -> tuple[str, ...]:
    sentences = []
    if "collapse" in tables:
        rows = tables["collapse"]
        first, last = rows[0], rows[-1]
        sentences.append(
            f"On a branch the loss never pays for, a plain learned gate closes from {first['plain_mean_gate']:.2f} to "
            f"{last['plain_mean_gate']:.2g} in {last['step']:,} steps while TetherGate holds it at "
            f"{last['tether_mean_gate']:.2f} (wd = 20, g_target = 0.5).")
    if "wd" in tables:
        settled = [r for r in tables["wd"] if r["regime"] != "unstable"]
        small = [r for r in settled if r["lr_wd"] <= 0.02]
        text = "Under a steady closing push θ settles at the spring's fixed point (1 − lr·wd)/wd from its anchor"
        if settled:
            fit = max(abs(r["offset"] / r["exact_offset"] - 1) for r in settled)
            text += f" (measured to a relative {fit:.1g})"
        if small:
            near = max(abs(r["offset"] * r["wd"] - 1) for r in small)
            text += f", within {near:.1%} of 1/wd for lr·wd ≤ 0.02"
        if boundary is not None:
            text += (f"; it diverges only from lr·wd = {boundary:.3g} (the 'unstable' rows), so lr·wd ≪ 1 buys "
                     "accuracy, not stability")
        sentences.append(text + ".")
    rest = []
    if "clamp" in tables:
        r = tables["clamp"][0]
        rest.append(f"past the clamp the loss gives θ a gradient of exactly {r['loss_grad_on_theta']:g} and the spring "
                    f"alone brings it back in {r['spring_steps_to_reenter']} steps")
    if "anchors" in tables:
        local = [r["opening_at_mean_signal"] for r in tables["anchors"] if r["anchor"] == "local"]
        glob = [r["opening_at_mean_signal"] for r in tables["anchors"] if r["anchor"] == "global"]
        rest.append(f"a local anchor opens every gate near {sum(local) / len(local):.2f} at its own signal mean, where a "
                    f"global one leaves them between {min(glob):.2g} and {max(glob):.2g}")
    if "floor" in tables and not rest:
        rest.append("while the floor is 1 the loss gives θ no gradient; the exp and cos schedules lower it after ramp_start")
    if rest:
        text = "; ".join(rest)
        sentences.append(text[0].upper() + text[1:] + ".")
    return tuple(sentences)


def tether_demo_report(sections: list[str], seed: int, curve: bool = False) -> Report:
    tables: list[Table] = []
    figures: dict = {}
    if "collapse" in sections:
        shown = [0, 100, 250, 500, 1000, 1500, 2000]
        rows = collapse(2000, 1e-2, 20.0, 0.5, seed, sorted(set(shown) | set(range(0, 2001, 20))) if curve else shown)
        tables.append(Table("collapse", "a branch the loss never pays for: mean gate opening (plain learned gate vs TetherGate, wd = 20, g_target = 0.5)",
                            [r for r in rows if r["step"] in shown]))
        if curve:
            tables.append(Table("collapse_curve", "mean gate opening every 20 steps", rows, show=False))
    if "wd" in sections:
        push = [{**r, "regime": spring_regime(r["lr_wd"])} for r in steady_push(PUSH_LRS, PUSH_WDS)]
        tables.append(Table("wd", "steady closing push with Adam: θ − θ* vs 1/wd, gate shift vs β/wd (β = 6)", push,
                            ("lr", "wd", "lr_wd", "regime", "offset", "exact_offset", "one_over_wd", "time_constant"),
                            wide=("steps", "shift", "beta_over_wd")))
        figures["stability_boundary_lr_wd"] = stability_boundary()
    if "clamp" in sections:
        tables.append(Table("clamp", "past the clamp the loss gives θ exactly 0; the spring alone brings it back",
                            [clamp_recovery(1e-2, 20.0, 3.0)]))
    if "floor" in sections:
        tables.append(Table("floor", "floor schedules (ramp_start 100, ramp_end 1100, τ 250, f_min 0.05)",
                            floor_table([0, 100, 200, 350, 600, 850, 1100, 2000], 100, 1100, 250.0, 0.05)))
        tables.append(Table("asleep", "loss gradient on θ: none while F = 1", asleep_gradient()))
    if "anchors" in sections:
        tables.append(Table("anchors", "gates with different signal means: global vs local anchor (spring only)",
                            anchors([-1.0, 0.0, 2.0], 3000, 1e-2, 20.0, 0.5)))
    answer = tether_demo_answer({t.key: t.rows for t in tables}, figures.get("stability_boundary_lr_wd"))
    first = tables[0]
    tables[0] = Table("rows", first.title, first.rows, first.columns, first.show, first.wide)
    return Report(
        command="tether-demo",
        params={"sections": sections, "seed": seed, "beta": BETA},
        tables=tuple(tables),
        notes=(
            "offset = θ − θ* at the end; exact offset = (1 − lr·wd)/wd is the fixed point of θ ← (θ + lr)(1 − lr·wd)",
            "time constant: steps to reach 1 − 1/e of the final offset, beside 1/(lr·wd); — where the spring diverges",
            "regime: the spring recurrence is monotone for lr·wd < 1, oscillating below 2 and unstable from 2",
        ),
        figures=figures,
        answer=answer,
    )
