"""A soft-cap whose gradient does not die in a low format.

Forward: exactly the eager formula ``cap·tanh(x/cap)`` in the input's format. Backward: from the
saved *input*, ``sech²(x/cap)`` in fp32, times the upstream gradient in fp32, rounded once to the
input's format. Eager autograd instead forms ``1 − y²`` from the rounded output y, which is exactly 0
once y rounds to 1.0 (past cap·x_knee of the format); here the gradient is zero only where the
fp32 sech² or its rounding to the format underflows.

Contract: any shape and float dtype; one saved tensor (the input); works under ``torch.compile``;
the gradient is within one unit in the last place of the input format of the exact value
wherever that value is a normal number of the format.
"""

from __future__ import annotations

import torch
from torch import nn


def sech2_fp32(x: torch.Tensor, cap: float) -> torch.Tensor:
    """sech²(x/cap) in fp32, in place on one fp32 buffer: (1/cosh)², so nothing overflows before cosh does."""
    u = x.float().mul_(1.0 / cap) if x.dtype != torch.float32 else x.mul(1.0 / cap)
    return u.cosh_().reciprocal_().square_()


class _CapFromInput(torch.autograd.Function):
    """cap·tanh(x/cap) saving only x; the backward recomputes the derivative from x.

    derivative "sech2": sech²(x/cap) in fp32 (the remedy). "one_minus_tanh2": 1 − t² with
    t = tanh(x/cap) recomputed in x's format, as fused kernels on fp32 scores do.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, cap: float, derivative: str) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.cap, ctx.derivative = cap, derivative
        return cap * torch.tanh(x / cap)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (x,) = ctx.saved_tensors
        if ctx.derivative == "sech2":
            return sech2_fp32(x, ctx.cap).mul_(grad).to(x.dtype), None, None
        t = torch.tanh(x / ctx.cap)
        return grad * (1 - t * t), None, None


def cap_from_input(x: torch.Tensor, cap: float, derivative: str = "sech2") -> torch.Tensor:
    return _CapFromInput.apply(x, float(cap), derivative)


def softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """cap·tanh(x/cap) with a gradient recomputed in fp32 from the input."""
    if not cap > 0:
        raise ValueError(f"cap must be > 0, got {cap!r}")
    return cap_from_input(x, cap, "sech2")


class SoftCap(nn.Module):
    """Module form of :func:`softcap`."""

    def __init__(self, cap: float) -> None:
        super().__init__()
        if not cap > 0:
            raise ValueError(f"cap must be > 0, got {cap!r}")
        self.cap = float(cap)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return softcap(x, self.cap)

    def extra_repr(self) -> str:
        return f"cap={self.cap:g}"
