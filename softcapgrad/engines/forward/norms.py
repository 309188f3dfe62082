"""A model's norms: found by the epsilon they hold, their gain's form measured (w or 1 + w), their output scaled.

parity's builder scales a norm's gain to bind a cap (reference.bind) and draws its gains apart (reference.build);
conditioning measures what each norm sees and what exchanging two of them does.
"""

from __future__ import annotations

EPS_FIELDS = ("variance_epsilon", "eps", "epsilon")


def _epsilon(module) -> float | None:
    for name in EPS_FIELDS:
        value = getattr(module, name, None)
        if isinstance(value, float) and not isinstance(value, bool) and value > 0:
            return value
    return None


def norm_modules(model) -> dict:
    """name -> (module, ε) for every module that holds a float epsilon, outermost only where they nest."""
    found = {name: (m, _epsilon(m)) for name, m in model.named_modules() if _epsilon(m) is not None}
    return {n: v for n, v in found.items() if not any(n.startswith(o + ".") for o in found if o != n)}


def plus_one(norm) -> bool:
    """Whether the norm multiplies by (1 + w) (Gemma's) rather than by w: measured with w set to zero, on channels
    of ±1 (mean 0, so a layer norm's output is not 0 for want of spread), split into heads where the norm is
    per head."""
    import torch

    saved = norm.weight.detach().clone()
    n = saved.shape[-1]
    x = torch.ones(n)
    x[1::2] = -1
    heads, size = getattr(norm, "num_heads", None), getattr(norm, "head_dim", None)
    x = x.reshape(1, 1, heads, size) if isinstance(heads, int) and isinstance(size, int) and heads * size == n \
        else x.reshape(1, n)
    with torch.no_grad():
        norm.weight.zero_()
        out = norm(x)
        norm.weight.copy_(saved)
    return bool(out.abs().max() > 0)


def gain(norm, k) -> None:
    """A norm's output times ``k`` (a number, or one gain per channel): w -> k(1 + w) - 1 where it multiplies by
    (1 + w), w -> k w where by w."""
    import torch

    shifted = plus_one(norm)
    with torch.no_grad():
        if shifted:
            norm.weight.copy_(k * (1 + norm.weight) - 1)
        else:
            norm.weight.mul_(k)
