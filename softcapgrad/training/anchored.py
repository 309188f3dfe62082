"""The anchored gate that takes a model's own head gate's place (tethergate.md's forward, with the model's link).

A model's head gate is g = link(u), u = W·x its own projection (link: sigmoid, or softplus for
Laguna's per-head gate). The anchored gate computes, per head,

    g = F + (1 − F)·link( clamp( β·(u − θ), arg_min, arg_max ) )

and after each optimizer step the spring of tethergate.md moves θ towards θ* = EMA(u) − a*/β, a* the argument
the gate is held at for its mean input. By default a* is each gate's own: β·(m₀ − θ₀), m₀ its input's mean over the
first training-mode batch after patching (the EMA's first observation; with micro-batches, the first of them) and
θ₀ its θ then (0): the gate keeps the opening link(a*) it had learnt (in its own units: a softplus gate's may exceed
1), and θ moves only where the loss moves u. ``g_target=`` sets a* = link⁻¹(g_target) by hand, for every gate.

Equal to the model's gate at step 0, bit for bit: with θ = 0, β = 1, F = 0 and the clamp open
(±∞), every step of the formula is exact in IEEE arithmetic: u − 0 = u, 1·u = u, clamp(u, −∞, ∞) = u,
then the same link kernel on the same tensor, (1 − 0)·g = g and 0 + g = g. β = 1 because the model's
gate already has slope 1 in u (β = 6 would steepen it); F = 0 because a floor of 1 (tethergate.md's
"asleep") opens every gate fully; the open clamp because a bound at ±8 changes g wherever |u| > 8.
θ and F are cast to u's format before the arithmetic, so a bf16 gate stays a bf16 computation.

Unlike :class:`TetherGate` the signal is not detached by default: u is the gate's own projection,
and detaching it would freeze W.
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from softcapgrad.core.checks import InputError
from softcapgrad.training.tether import TetherGate

LINKS = ("sigmoid", "softplus")


class AnchoredGate(TetherGate):
    """One anchored gate per entry of the last axis of u; the model's gate at step 0 (see the module's text)."""

    def __init__(self, num_gates: int, link: str, beta: float = 1.0, arg_min: float = -math.inf,
                 arg_max: float = math.inf, ema_decay: float = 0.99, detach_signal: bool = False) -> None:
        if link not in LINKS:
            raise InputError(f"link must be one of {', '.join(LINKS)}, got {link!r}")
        super().__init__(num_gates, beta, arg_min, arg_max, ema_decay, detach_signal, theta_init=0.0)
        self.link = link
        self.floor.fill_(0.0)
        self.register_buffer("held_arg", torch.full((num_gates,), float("nan")))  # a* per gate, NaN until observed

    def _observe(self, s: torch.Tensor) -> None:
        """The EMA's update; on its first observation also a* = β·(EMA − θ), each gate's argument at its mean
        input (written where still NaN, with no branch on a tensor, as the EMA is)."""
        super()._observe(s)
        a = self.held_arg
        torch.where(a != a, self.beta * (self.ema_s - self.theta.detach()), a, out=a)

    def anchor_argument(self, g_target: float | None):
        """a*: each gate's measured one (a tensor; g_target None) or link⁻¹(g_target) for all."""
        return self.held_arg if g_target is None else self.anchor_shift(g_target)

    def held_openings(self) -> torch.Tensor:
        """link(a*) per gate: the opening at the mean input the default spring holds (NaN before the first batch)."""
        a = self.held_arg
        return torch.sigmoid(a) if self.link == "sigmoid" else F.softplus(a)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        s = u.detach() if self.detach_signal else u
        if self.training:
            self._observe(s)
        theta, floor = self.theta.to(s.dtype), self.floor.to(s.dtype)
        a = torch.clamp(self.beta * (s - theta), self.arg_min, self.arg_max)
        g = torch.sigmoid(a) if self.link == "sigmoid" else F.softplus(a)
        return floor + (1.0 - floor) * g

    def anchor_shift(self, g_target: float) -> float:
        """link⁻¹(g_target): logit for a sigmoid gate, log(e^g − 1) for a softplus one (any g > 0: its own units)."""
        if self.link == "softplus":
            if not (g_target > 0 and math.isfinite(g_target)):
                raise InputError(f"g_target must be a finite number > 0 for a softplus gate, got {g_target!r}")
            return math.log(math.expm1(g_target))
        return super().anchor_shift(g_target)

    def extra_repr(self) -> str:
        return f"{self.theta.numel()}, link={self.link}, beta={self.beta:g}"


class Awake:
    """The floor schedule of a gate patched into a running model: F = 0 at every step (never asleep)."""

    def __call__(self, step: int) -> float:
        return 0.0
