"""Where the tanh (or sigmoid) cap and its backward run decides the horizon.

A recipe names the format of the pre-cap scores, the format the cap is computed in, what the
backward reads (the rounded *output*, as eager autograd does for tanh and sigmoid, or the
*input*, recomputing in fp32), and the cap function. Each is emulated with torch on the CPU;
the first input whose gradient is exactly 0 is searched over the scores format's own values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from softcapgrad import deadzone, formats
from softcapgrad.remedy import cap_from_input
from softcapgrad.remedy import softcap as remedy_softcap


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


@dataclass(frozen=True)
class Sigmoid:
    """z = m·σ((l + b)/s); defaults m = 2c, s = c/2, b = 0 make it c + c·tanh(l/c) exactly in real arithmetic."""

    m: float | None = None
    s: float | None = None
    b: float = 0.0

    def resolved(self, c: float) -> tuple[float, float, float]:
        return (2.0 * c if self.m is None else self.m, c / 2.0 if self.s is None else self.s, self.b)


def capped(recipe: Recipe, x: torch.Tensor, c: float, sigmoid: Sigmoid) -> torch.Tensor:
    """The recipe's forward from scores ``x``; autograd of it is the recipe's backward."""
    if recipe.name == "remedy":
        return remedy_softcap(x, c)
    xc = x.to(getattr(torch, recipe.compute))
    if recipe.fn == "sigmoid":
        m, s, b = sigmoid.resolved(c)
        return m * torch.sigmoid((xc + b) / s)
    if recipe.backward_reads == "input":
        return cap_from_input(xc, c, "one_minus_tanh2")
    return c * torch.tanh(xc / c)


def gradient(recipe: Recipe, a: np.ndarray, c: float, sigmoid: Sigmoid = Sigmoid()) -> np.ndarray:
    """dz/da through the recipe, as the scores format receives it; float64 array."""
    dtype = np.dtype(formats.resolve(recipe.scores))
    x = formats.to_torch(a, dtype).requires_grad_(True)
    z = capped(recipe, x, c, sigmoid)
    (g,) = torch.autograd.grad(z, x, torch.ones_like(z))
    return g.double().numpy()


def horizon_real(recipe: Recipe, c: float, sigmoid: Sigmoid) -> float | None:
    """Where the cap function saturates in the compute format, in pre-cap units; None for the remedy."""
    if recipe.name == "remedy":
        return None
    eps = formats.facts(formats.resolve(recipe.compute)).spacing_below_one
    if recipe.fn == "sigmoid":
        _, s, b = sigmoid.resolved(c)
        return s * deadzone.knee_exact(eps, "sigmoid") - b
    return c * deadzone.knee_exact(eps, "tanh")


def first_zero(recipe: Recipe, c: float, sigmoid: Sigmoid) -> formats.Switch:
    """The first input of the scores format whose gradient through the recipe is exactly 0."""
    return formats.find_switch(formats.resolve(recipe.scores), lambda v: gradient(recipe, v, c, sigmoid) == 0.0)


def path_row(recipe: Recipe, c: float, probes: list[float], sigmoid: Sigmoid) -> dict:
    dtype = formats.resolve(recipe.scores)
    switch = first_zero(recipe, c, sigmoid)
    stored = np.asarray(probes, dtype=np.float64).astype(dtype)
    grads = gradient(recipe, stored, c, sigmoid)
    exact = deadzone.exact_gradient(stored.astype(np.float64), c)
    return {
        "path": recipe.name,
        "cap": c,
        "scores": recipe.scores,
        "compute": recipe.compute,
        "backward_reads": recipe.backward_reads,
        "fn": recipe.fn,
        "horizon": horizon_real(recipe, c, sigmoid),
        "first_zero_grad_input": switch.first_true,
        "horizon_over_cap": None if switch.first_true is None else switch.first_true / c,
        "probes": [{"a": float(a), "grad": float(g), "grad_exact_tanh": float(e)} for a, g, e in zip(probes, grads, exact)],
    }


def paths_rows(names: list[str], caps: list[float], probes: list[float] | None, sigmoid: Sigmoid) -> list[dict]:
    return [path_row(RECIPES[n], c, probes or [4.0 * c, 10.0 * c], sigmoid) for n in names for c in caps]


def remedy_zero_onset(c: float) -> float:
    """Where the remedy's bf16 gradient underflows: sech²(a/c) below half bf16's smallest subnormal."""
    tiny = float(formats.finfo(formats.resolve("bf16")).smallest_subnormal)
    return c * 0.5 * math.log(4.0 / (tiny / 2.0))


def paths_report(names: list[str], caps: list[float], probes: list[float] | None, sigmoid: Sigmoid):
    from softcapgrad.report import Report, Table

    rows = paths_rows(names, caps, probes, sigmoid)
    recipes = [{"path": n, "scores": RECIPES[n].scores, "compute": RECIPES[n].compute,
                "backward_reads": RECIPES[n].backward_reads, "fn": RECIPES[n].fn, "example": RECIPES[n].example} for n in names]
    return Report(
        command="horizon",
        params={"paths": names, "caps": caps, "probes": probes, "sigmoid": sigmoid.__dict__},
        tables=(
            Table("rows", "horizon per implementation path (torch on the CPU, each recipe emulated op by op)", rows,
                  ("path", "cap", "scores", "compute", "backward_reads", "horizon", "first_zero_grad_input", "horizon_over_cap", "probes")),
            Table("recipes", "the recipes", recipes),
        ),
        notes=(
            "backward_reads=output: autograd's 1 − y² (σ(1 − σ) for the sigmoid) from the rounded output: exactly 0 once y rounds to 1.0",
            "backward_reads=input: recomputed in fp32 from the saved input; the remedy uses sech²(a/c), zero only where the bf16 gradient underflows",
            "grad_exact_tanh = sech²(a/c), the exact derivative of c·tanh(a/c) (and of the default sigmoid cap 2c·σ(2a/c))",
        ),
    )
