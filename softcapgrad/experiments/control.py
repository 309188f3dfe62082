"""The control arm's cap backward: the patch's derivative from the input, and exactly 0 wherever eager's is.

eager differs from ``softcapgrad.patch`` in two ways: its 1 − y² is exactly 0 once the stored bf16
output y is ±1 (the dead zone), and on live values it is 1 − y² from a rounded y (rounding). This
arm keeps the first and drops the second: the forward is the same aten op (bit-identical output),
the backward is the patch's fp32 sech² of the saved input times the upstream gradient, set to exactly
0 where the stored output is ±1. So control ÷ patched isolates the dead zone and eager ÷ control the
rounding of the live slope.
"""

from __future__ import annotations

import functools


def _function():
    import torch

    from softcapgrad.training.remedy import sech2_fp32

    class DeadZoneFromInput(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            y = torch.tanh(x)
            ctx.save_for_backward(x, y)
            return y

        @staticmethod
        def backward(ctx, grad):
            x, y = ctx.saved_tensors
            slope = sech2_fp32(x, 1.0).mul_(grad.float())
            return slope.masked_fill_(y.abs() == 1, 0.0).to(x.dtype)

    return DeadZoneFromInput


@functools.lru_cache(maxsize=1)
def _mode_class():
    import torch
    from torch.overrides import TorchFunctionMode

    function = _function()
    low = (torch.bfloat16, torch.float16)

    class DeadZoneBackward(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func in (torch.tanh, torch.Tensor.tanh) and not kwargs and len(args) == 1:
                x = args[0]
                if isinstance(x, torch.Tensor) and x.dtype in low and x.requires_grad and torch.is_grad_enabled():
                    return function.apply(x)
            return func(*args, **(kwargs or {}))

    return DeadZoneBackward


def patch_deadzone(module) -> None:
    """Run every call of ``module`` with the control backward on its bf16/fp16 tanh (both caps of Gemma 2)."""
    inner = module.forward
    mode = _mode_class()

    @functools.wraps(inner)
    def forward(*args, **kwargs):
        with mode():
            return inner(*args, **kwargs)

    module.forward = forward
