"""Every bf16/fp16/fp32 tanh and sigmoid in someone else's model, with its derivative taken from the input.

softcapgrad.md, "The bf16 dead-zone": eager autograd forms the tanh derivative as 1 − y² from the
rounded output y, which is exactly 0 once y rounds to ±1 (the sigmoid's σ(1 − σ) likewise once σ
rounds to 1). Inside :func:`fp32_tanh_backward` (a ``TorchFunctionMode``) each ``torch.tanh`` /
``Tensor.tanh`` / ``torch.sigmoid`` / ``Tensor.sigmoid`` of a bf16, fp16 or fp32 tensor that needs
a gradient runs as an autograd Function instead:

    forward   the same aten op on the same input: bit-identical output
    saves     the input x (eager saves the output y, a tensor of the same size and format)
    backward  bf16, fp16: tanh    sech²(x) = (1/cosh x)² in fp32, times the upstream gradient in fp32
                          sigmoid σ(x)·σ(−x) in fp32 (σ(1 − σ) without the cancellation of 1 − σ)
              fp32:       the same derivatives in fp64, from e = exp(−2|x|) (tanh: 4e/(1 + e)²) or
                          e = exp(−|x|) (sigmoid: e/(1 + e)²), times the upstream gradient in fp64
              each rounded once to x's format

so the gradient is within one unit in the last place of the exact one wherever that is a normal
number of the format, and zero only where it underflows. fp32 takes the wider arithmetic because
(1/cosh x)² computed in fp32 is itself off by a few units in the last place (3.2 at most against
mpmath over 4,400 inputs in [0, 100]; the fp64 form 0.5), which would break that bound; eager's
1 − y² in fp32 is exactly 0 from |x| ≈ 9, where y rounds to 1. ``keep_fp32=True`` leaves fp32
(and, always, fp64) to eager autograd. :func:`patch` does the same for every call of one module.
Other ops (in-place ``tanh_``, ``F.gelu(approximate="tanh")``, ``silu``) are left as they are.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode

from softcapgrad.core import chunks
from softcapgrad.training.remedy import every_value, fast_path, lookup_backward, sech2_fp32, sech2_wide

LOW = (torch.bfloat16, torch.float16)
COVERED = (*LOW, torch.float32)


def sigmoid_slope(x32: torch.Tensor) -> torch.Tensor:
    """dσ/dx = σ(x)·σ(−x): σ(1 − σ) without the cancellation of 1 − σ once σ is near 1."""
    return torch.sigmoid(-x32).mul_(x32.sigmoid_())


def sigmoid_slope64(x: torch.Tensor) -> torch.Tensor:
    """σ(x)·σ(−x) = e/(1 + e)², e = exp(−|x|), in fp64 (out of place, like ``sech2_wide``)."""
    e = torch.exp(-x.double().abs())
    return e / (1.0 + e).square()


OPS = {"tanh": (torch.tanh, lambda x32: sech2_fp32(x32, 1.0)), "sigmoid": (torch.sigmoid, sigmoid_slope)}
WIDE = {"tanh": sech2_wide, "sigmoid": sigmoid_slope64}


class FromInput(torch.autograd.Function):
    """tanh or σ of x saving x; the backward is the derivative at x in fp32 times the upstream, rounded once."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, fn: str) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.fn = fn
        return OPS[fn][0](x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (x,) = ctx.saved_tensors
        if x.dtype == torch.float32:
            if fast_path(x) and grad.dtype == x.dtype and not torch.is_grad_enabled():
                return chunked_wide(x, grad, WIDE[ctx.fn]), None
            return WIDE[ctx.fn](x).mul(grad).to(x.dtype), None
        if fast_path(x) and grad.dtype == x.dtype and not torch.is_grad_enabled():
            return lookup_backward(x, grad, slope_table(x.dtype, ctx.fn)), None
        return OPS[ctx.fn][1](x.float()).mul_(grad).to(x.dtype), None


def chunked_wide(x: torch.Tensor, grad: torch.Tensor, slope) -> torch.Tensor:
    """The fp64 backward of an fp32 tensor chunk by chunk: fp64 scratch of one chunk, not of the tensor."""
    out = torch.empty(x.shape, dtype=x.dtype)
    xf, gf, of = chunks.flat_view(x), chunks.flat_view(grad), out.view(-1)

    def work(spans: list[slice]) -> None:
        for span in spans:
            of[span] = slope(xf[span]).mul_(gf[span])  # fp64 product, one rounding to fp32

    chunks.each_share(xf.numel(), 1, work)
    return out


@functools.lru_cache(maxsize=8)
def slope_table(dtype: torch.dtype, fn: str) -> torch.Tensor:
    """The fp32 derivative at every one of a 16-bit format's 65,536 values: the backward becomes a look-up
    (the remedy's), one fp32 product and one rounding, with no full-size fp32 scratch."""
    return OPS[fn][1](every_value(dtype).float())


FUNCTIONS = {
    torch.tanh: "tanh",
    torch.Tensor.tanh: "tanh",
    torch.sigmoid: "sigmoid",
    torch.Tensor.sigmoid: "sigmoid",
    torch.special.expit: "sigmoid",
}


class fp32_tanh_backward(TorchFunctionMode):  # noqa: N801 - used like a function: ``with fp32_tanh_backward():``
    """Context manager: bf16/fp16/fp32 tanh and sigmoid inside take their derivative from the input
    (``keep_fp32=True``: bf16 and fp16 only, fp32 left to eager autograd)."""

    def __init__(self, *, keep_fp32: bool = False) -> None:
        super().__init__()
        self.keep_fp32 = bool(keep_fp32)
        self.covered = LOW if self.keep_fp32 else COVERED

    def __torch_function__(self, func, types, args=(), kwargs=None):
        fn = FUNCTIONS.get(func)
        if fn is not None and not kwargs and len(args) == 1:
            x = args[0]
            if isinstance(x, torch.Tensor) and x.dtype in self.covered and x.requires_grad and torch.is_grad_enabled():
                return FromInput.apply(x, fn)
        return func(*args, **(kwargs or {}))


@dataclass
class Patch:
    """What :func:`patch` changed; ``remove()`` restores the module's own ``forward``."""

    module: torch.nn.Module

    def remove(self) -> None:
        self.module.__dict__.pop("forward", None)


def patch(module: torch.nn.Module, *, keep_fp32: bool = False, gates: str | None = None):
    """Run every call of ``module`` inside :func:`fp32_tanh_backward`, without touching its source.

    ``gates="tether"``: instead, the model's head gates become anchored TetherGates equal to them at step 0
    (softcapgrad.training.tether_patch; a :class:`~softcapgrad.training.tether_patch.TetherPatch` back).

    ``keep_fp32=True``: only bf16 and fp16 tanh/sigmoid are changed; fp32 ones keep eager's 1 − y².

    The instance gets a ``forward`` attribute that wraps its class's ``forward``; hooks, ``state_dict``
    and parameters are unchanged, and ``torch.compile(module)`` traces the mode with the rest.
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"patch expects a torch.nn.Module (a model or one of its layers), got "
                        f"{type(module).__name__}")
    if gates is not None:
        from softcapgrad.training.tether_patch import patch_gates

        return patch_gates(module, gates)
    if "forward" in module.__dict__:
        raise ValueError(f"{type(module).__name__} already has an instance-level forward (patched twice?)")
    inner = module.forward

    @functools.wraps(inner)
    def forward(*args, **kwargs):
        with fp32_tanh_backward(keep_fp32=keep_fp32):
            return inner(*args, **kwargs)

    module.forward = forward
    return Patch(module)
