"""TetherGate: an anchored, floored residual gate that resists collapse (tethergate.md).

Forward, differentiable, the same formula in forward and backward:

    g_raw = σ( clamp( β·(s − θ), arg_min, arg_max ) )
    g     = F + (1 − F)·g_raw

After each optimizer step, outside the graph (``tethergate_step``):

    F  = floor_schedule(step)
    θ* = EMA(s) − logit(g_target)/β            (per gate, or the mean over gates)
    k  = κ_sleep if F == 1 else lr·wd
    θ ← θ − k·(θ − θ*)

θ is the only parameter; F and the EMA are buffers. Gates whose EMA is still NaN are skipped.
Under a steady closing push Adam moves θ by lr per step, so θ settles where lr = k·(θ − θ* + lr):
θ − θ* = (1 − lr·wd)/wd ≈ 1/wd, and the gate argument shifts by β(1 − lr·wd)/wd ≈ β/wd.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import torch
from torch import nn
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

from softcapgrad.core import chunks
from softcapgrad.core.checks import InputError

MODES = ("exp", "cos")
ANCHORS = ("global", "local")


@dataclass(frozen=True)
class FloorSchedule:
    """F(step): 1 until ramp_start, then exp decay (τ) or a cosine to f_min at ramp_end."""

    mode: str = "exp"
    ramp_start: int = 0
    f_min: float = 0.0
    tau: float = 1000.0
    ramp_end: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise InputError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if not 0.0 <= self.f_min < 1.0:
            raise InputError(f"f_min must lie in [0, 1), got {self.f_min!r}")
        if self.mode == "exp" and not self.tau > 0:
            raise InputError(f"tau must be > 0, got {self.tau!r}")
        if self.mode == "cos" and (self.ramp_end is None or self.ramp_end <= self.ramp_start):
            raise InputError(f"ramp_end must be > ramp_start ({self.ramp_start}), got {self.ramp_end!r}")

    def __call__(self, step: int) -> float:
        return floor_schedule(step, self.mode, self.ramp_start, self.f_min, self.tau, self.ramp_end)


def floor_schedule(step: int, mode: str = "exp", ramp_start: int = 0, f_min: float = 0.0,
                   tau: float = 1000.0, ramp_end: int | None = None) -> float:
    """The floor at a training step: driven by the step only, never by the loss."""
    if step <= ramp_start:
        return 1.0
    if mode == "exp":
        return f_min + (1.0 - f_min) * math.exp(-(step - ramp_start) / tau)
    if step >= ramp_end:
        return f_min
    frac = (step - ramp_start) / (ramp_end - ramp_start)
    return f_min + (1.0 - f_min) * 0.5 * (1.0 + math.cos(math.pi * frac))


class TetherGate(nn.Module):
    """One gate per entry of the last axis of the signal ``s`` (shape ``(..., num_gates)``)."""

    def __init__(self, num_gates: int, beta: float = 6.0, arg_min: float = -8.0, arg_max: float = 8.0,
                 ema_decay: float = 0.99, detach_signal: bool = True, theta_init: float = 0.0) -> None:
        super().__init__()
        if num_gates < 1:
            raise InputError(f"num_gates must be >= 1, got {num_gates!r}")
        if not (math.isfinite(beta) and beta > 0):
            raise InputError(f"beta must be a finite number > 0, got {beta!r}")
        if not arg_min < arg_max:
            raise InputError(f"arg_min must be < arg_max, got {arg_min!r}, {arg_max!r}")
        if not 0.0 <= ema_decay < 1.0:
            raise InputError(f"ema_decay must lie in [0, 1), got {ema_decay!r}")
        if not math.isfinite(theta_init):
            raise InputError(f"theta_init must be a finite number, got {theta_init!r}")
        self.beta, self.arg_min, self.arg_max = float(beta), float(arg_min), float(arg_max)
        self.ema_decay, self.detach_signal = float(ema_decay), detach_signal
        self.theta = nn.Parameter(torch.full((num_gates,), float(theta_init)))
        self.register_buffer("floor", torch.ones(num_gates))
        self.register_buffer("ema_s", torch.full((num_gates,), float("nan")))

    def forward(self, s: torch.Tensor) -> torch.Tensor:
        if self.detach_signal and s.requires_grad:
            s = s.detach()
        theta, floor = self.theta, self.floor
        if self.training:
            self._observe(s)
        if _chunked(s, theta, floor):
            return _Gate.apply(s, theta, floor, self.beta, self.arg_min, self.arg_max)
        a = torch.clamp(self.beta * (s - theta), self.arg_min, self.arg_max)
        return floor + (1.0 - floor) * torch.sigmoid(a)

    def _observe(self, s: torch.Tensor) -> None:
        """EMA of the per-gate mean of s; the first observation initialises it (no tensor branching).

        Few operations, as it runs on every training forward: no autograd context (the signal is
        detached here when it needs a graph, and the buffers never do), the mask from NaN ≠ NaN and
        the blend written straight into the buffer.
        """
        ema = self.ema_s
        if s.requires_grad:
            s = s.detach()
        mean = s.reshape(-1, ema.numel()).mean(0)
        if mean.dtype != ema.dtype:
            mean = mean.to(ema.dtype)
        blended = self.ema_decay * ema + (1.0 - self.ema_decay) * mean
        torch.where(ema != ema, mean, blended, out=ema)

    def anchor_shift(self, g_target: float) -> float:
        """The link's inverse at g_target: θ* = EMA(s) − anchor_shift/β (logit for this sigmoid gate)."""
        return logit_target(g_target)

    def anchor_argument(self, g_target: float | None):
        """The argument β(EMA − θ*) the spring holds: link⁻¹(g_target) (an anchored gate may hold its own)."""
        if g_target is None:
            raise InputError("g_target=None holds each gate's own measured opening: an anchored gate's (patch) only")
        return self.anchor_shift(g_target)


def logit_target(g_target: float) -> float:
    """logit(g_target), for a target opening of a sigmoid gate in (0, 1)."""
    if not 0.0 < g_target < 1.0:
        raise InputError(f"g_target must lie in (0, 1), got {g_target!r}")
    return math.log(g_target / (1.0 - g_target))


def _chunked(s: torch.Tensor, theta: torch.Tensor, floor: torch.Tensor) -> bool:
    """The chunked CPU path: fp32 throughout, a detached signal, not while torch.compile traces and
    not under a dispatch mode (a monitor or a FLOP counter sees the formula's ops, once each)."""
    return (s.dtype == theta.dtype == floor.dtype == torch.float32 and s.numel() >= chunks.CHUNK
            and s.device.type == "cpu" and not s.requires_grad and not torch.compiler.is_compiling()
            and not is_in_torch_dispatch_mode())


class _Gate(torch.autograd.Function):
    """The forward formula of :class:`TetherGate` run chunk by chunk, the gradient to θ alone.

    Per value, forward and backward are the operations autograd runs on the formula, in its
    order: s − θ, ·β, clamp, σ, (1 − F)·σ, F + ·; backward σ'·g where arg_min ≤ β(s − θ) ≤ arg_max
    (clamp passes the gradient at its bounds), else 0. Two differences: the sum over the batch
    runs chunk by chunk into float64 (one partial sum per thread, added in order), and ·(1 − F)·(−β)
    is applied once per gate after the sum, so the gradient of θ agrees with autograd's to float32
    rounding, not bit for bit. The backward recomputes β(s − θ) from the signal, which the caller
    holds anyway, instead of saving it.
    """

    @staticmethod
    def forward(ctx, s, theta, floor, beta: float, lo: float, hi: float):
        ctx.save_for_backward(s, theta, floor)
        ctx.constants = (beta, lo, hi)
        width = theta.numel()
        s2 = chunks.rows_view(s, width)
        out = torch.empty(s2.shape, dtype=s.dtype)
        open_ = 1.0 - floor

        def work(spans: list[slice]) -> None:
            a = chunks.scratch(s2.shape[0], width)
            for span in spans:
                x, y = a[:s2[span].shape[0]], out[span]
                torch.sub(s2[span], theta, out=x).mul_(beta).clamp_(lo, hi).sigmoid_()
                torch.mul(open_, x, out=y).add_(floor)

        chunks.each_share(s2.shape[0], width, work)
        return out.view(s.shape)

    @staticmethod
    def backward(ctx, grad):
        s, theta, floor = ctx.saved_tensors
        beta, lo, hi = ctx.constants
        width = theta.numel()
        s2, g2 = chunks.rows_view(s, width), chunks.rows_view(grad, width)
        zero = torch.zeros((), dtype=s.dtype)

        def work(spans: list[slice]) -> torch.Tensor:
            a, y = chunks.scratch(s2.shape[0], width), chunks.scratch(s2.shape[0], width)
            inside = chunks.scratch(s2.shape[0], width, torch.bool)
            total, part = torch.zeros(width, dtype=torch.float64), torch.empty(width, dtype=s.dtype)
            for span in spans:
                rows = s2[span].shape[0]
                x, c, m = a[:rows], y[:rows], inside[:rows]
                torch.sub(s2[span], theta, out=x).mul_(beta)
                torch.clamp(x, lo, hi, out=c)
                torch.eq(x, c, out=m)  # inside the clamp (NaN: outside, as autograd's mask)
                torch.ops.aten.sigmoid_backward.grad_input(g2[span], c.sigmoid_(), grad_input=x)
                torch.where(m, x, zero, out=x)
                total.add_(torch.sum(x, 0, out=part))
            return total

        total = sum(chunks.each_share(s2.shape[0], width, work))  # float64 partial sums, in share order
        return None, total.mul_(1.0 - floor).mul_(-beta).to(theta.dtype), None, None, None, None


def _as_list(gates: TetherGate | Iterable[TetherGate]) -> list[TetherGate]:
    return [gates] if isinstance(gates, TetherGate) else list(gates)


def _check_step_args(lr: float, wd: float, g_target: float, kappa_sleep: float, anchor: str) -> None:
    if not lr > 0:
        raise InputError(f"lr must be > 0, got {lr!r}")
    if not wd >= 0:
        raise InputError(f"wd must be >= 0, got {wd!r}")
    if not 0.0 <= kappa_sleep <= 1.0:
        raise InputError(f"kappa_sleep must lie in [0, 1], got {kappa_sleep!r}")
    if anchor not in ANCHORS:
        raise InputError(f"anchor must be one of {', '.join(ANCHORS)}, got {anchor!r}")


def anchor_targets(gate: TetherGate, g_target: float, anchor: str) -> torch.Tensor:
    """θ* per gate: EMA(s) − logit(g_target)/β, or its mean over the gates with an EMA."""
    return _targets(gate.ema_s, gate, g_target, anchor, None).expand_as(gate.ema_s)


def _targets(ema: torch.Tensor, gate: TetherGate, g_target: float | None, anchor: str,
             valid: torch.Tensor | None, shift=None) -> torch.Tensor:
    """θ* per gate, or the global one as a single value (it broadcasts); ``valid``: the gates with an EMA;
    ``shift``: the gate's anchor_argument(g_target), when already computed."""
    local = ema - (gate.anchor_argument(g_target) if shift is None else shift) / gate.beta
    if anchor == "local":
        return local
    if valid is None:
        valid = local == local
    # NaN → 0 keeps every other value, infinities included: the sum of torch.where(valid, local, 0)
    return local.nan_to_num(0.0, math.inf, -math.inf).sum() / valid.sum()


@torch.no_grad()
def tethergate_step(gates: TetherGate | Iterable[TetherGate], step: int, schedule: FloorSchedule, lr: float, wd: float,
                    g_target: float | None = 0.5, kappa_sleep: float = 0.1, anchor: str = "global") -> float:
    """Floor update and spring, as tensor operations over all gates at once: no host read-back.

    ``g_target`` None: each anchored gate's own measured opening (AnchoredGate.anchor_argument). Returns the
    scheduled floor F (a Python float computed from ``step`` alone).
    """
    _check_step_args(lr, wd, g_target, kappa_sleep, anchor)
    gates = _as_list(gates)
    shifts = [gate.anchor_argument(g_target) for gate in gates]  # every gate's target checked before any moves
    F = schedule(step)
    k = kappa_sleep if F == 1.0 else lr * wd
    for gate, shift in zip(gates, shifts):
        theta, ema = gate.theta, gate.ema_s
        valid = ema == ema  # not NaN
        target = _targets(ema, gate, g_target, anchor, valid, shift)
        torch.where(valid, theta - k * (theta - target), theta, out=theta)
        gate.floor.masked_fill_(valid, F)
    return F


@torch.no_grad()
def tethergate_step_per_gate(gates: TetherGate | Iterable[TetherGate], step: int, schedule: FloorSchedule, lr: float,
                             wd: float, g_target: float = 0.5, kappa_sleep: float = 0.1, anchor: str = "global") -> float:
    """The document's form: one host read of each gate's EMA per step. Reference and benchmark only."""
    _check_step_args(lr, wd, g_target, kappa_sleep, anchor)
    F = schedule(step)
    k = kappa_sleep if F == 1.0 else lr * wd
    shift = logit_target(g_target)
    for gate in _as_list(gates):
        n = gate.theta.numel()
        alive = [not math.isnan(float(gate.ema_s[i])) for i in range(n)]  # the per-gate sync
        local = [gate.ema_s[i] - shift / gate.beta for i in range(n)]
        if anchor == "global":
            zero = torch.zeros((), dtype=gate.ema_s.dtype)
            kept = torch.stack([t if ok else zero for t, ok in zip(local, alive)])
            mean = kept.sum() / torch.tensor(sum(alive), dtype=gate.ema_s.dtype)
        for i in range(n):
            if not alive[i]:
                continue
            target = mean if anchor == "global" else local[i]
            gate.theta[i] = gate.theta[i] - k * (gate.theta[i] - target)
            gate.floor[i] = F
    return F
