"""The six recipes the first horizon table emulated op by op, kept as an independent reference.

Each names the scores format, the format the cap runs in, what the backward reads and the cap
function, written out with torch ops here rather than through the stack registry, so the tests
can check that the real stacks the old names now stand for give the same gradient bit for bit,
and that ``fused-fp32`` (the CPU's eager fp32 tanh behind a recomputing backward) equals no fused
kernel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from softcapgrad.laws import formats
from softcapgrad.stacks.runners import formula
from softcapgrad.stacks.registry import Sigmoid


@dataclass(frozen=True)
class Recipe:
    name: str
    scores: str  # format of the pre-cap input a
    compute: str  # format the tanh / sigmoid runs in
    backward_reads: str  # "output": 1 − y² (or σ(1 − σ)) from the rounded output; "input": recomputed
    fn: str  # "tanh" | "sigmoid"
    example: str  # the kind of public code that follows it


RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe("eager-bf16", "bfloat16", "bfloat16", "output", "tanh",
               "eager attention or logit code that caps bf16 scores with c·tanh(a/c); autograd reuses the bf16 output"),
        Recipe("eager-fp16", "float16", "float16", "output", "tanh", "the same eager formula in an fp16 model"),
        Recipe("fp32-upcast", "bfloat16", "float32", "output", "tanh",
               "bf16 scores cast to fp32 before the cap, e.g. final logits capped inside an fp32 loss"),
        Recipe("fused-fp32", "float32", "float32", "input", "tanh",
               "fused attention kernels and score modifiers that cap fp32 score accumulators and recompute 1 − tanh² in fp32"),
        Recipe("sigmoid-bf16", "bfloat16", "bfloat16", "output", "sigmoid",
               "trainers that bound logits with m·sigmoid((l + b)/s) in the model's bf16"),
        Recipe("remedy", "bfloat16", "bfloat16", "input", "tanh",
               "softcapgrad.softcap: the eager forward, the backward sech²(a/c) from the input in fp32"),
    )
}


class _TanhRecomputed(torch.autograd.Function):
    """c·tanh(x/c) saving x; the backward recomputes t = tanh(x/c) in x's format and forms 1 − t² there."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, c: float) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.c = c
        return c * torch.tanh(x / c)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (x,) = ctx.saved_tensors
        t = torch.tanh(x / ctx.c)
        return grad * (1 - t * t), None


def capped(recipe: Recipe, x: torch.Tensor, c: float, sigmoid: Sigmoid) -> torch.Tensor:
    """The recipe's forward from scores ``x``; autograd of it is the recipe's backward."""
    if recipe.backward_reads == "input" and recipe.name != "remedy":
        return _TanhRecomputed.apply(x.to(getattr(torch, recipe.compute)), c)
    fn = "remedy" if recipe.name == "remedy" else recipe.fn
    return formula(fn, c, sigmoid.resolved(c), upcast=recipe.compute != recipe.scores)(x)


def gradient(recipe: Recipe, a: np.ndarray, c: float, sigmoid: Sigmoid = Sigmoid()) -> np.ndarray:
    """dz/da through the recipe, as the scores format receives it; float64 array."""
    dtype = np.dtype(formats.resolve(recipe.scores))
    x = formats.to_torch(a, dtype).requires_grad_(True)
    z = capped(recipe, x, c, sigmoid)
    (g,) = torch.autograd.grad(z.sum(), x)  # a scalar: an explicit grad_outputs makes torch import sympy
    return g.double().numpy()


def first_zero(recipe: Recipe, c: float, sigmoid: Sigmoid) -> formats.Switch:
    """The first input of the scores format whose gradient through the recipe is exactly 0."""
    return formats.find_switch(formats.resolve(recipe.scores), lambda v: gradient(recipe, v, c, sigmoid) == 0.0)


def remedy_zero_onset(c: float) -> float:
    """Where the remedy's bf16 gradient underflows: sech²(a/c) below half bf16's smallest subnormal."""
    tiny = float(formats.finfo(formats.resolve("bf16")).smallest_subnormal)
    return c * 0.5 * math.log(4.0 / (tiny / 2.0))
