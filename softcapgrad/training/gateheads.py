"""Per-head statistics of a gate that is per head: which heads hold a site's closed elements.

An attention output gate is per head when its input's last dimension is the module's H heads, head-major: H values
(one gate per head and token: Laguna's per-head g_proj, lfm3's gate) or H·head_dim (one per channel: Qwen3-Next's
q_proj gate, Laguna's per-element g_proj). Element i of such a last dimension of n belongs to head ⌊i / (n / H)⌋.
H is what the gate's module names: ``num_heads``, ``num_attention_heads``, or its config's ``num_attention_heads``;
a router's softmax, and a gate whose last dimension is neither, get no per-head figures.

Per head, over the watched steps: the mean gate (float64 sums) and the closed share (y < 1e-3 as real numbers:
gaterows.closed_below); each head holds count / H of the site's elements.
"""

from __future__ import annotations

import itertools
import math

import torch

from softcapgrad.training.gaterows import CLOSED, below, closed_below


def head_count(module: torch.nn.Module | None, fn: str, n: int) -> int | None:
    """H where a gate of ``fn`` run in ``module`` on a last dimension of ``n`` is per head (see above); else None."""
    if module is None or fn == "softmax":
        return None
    heads = getattr(module, "num_heads", None) or getattr(module, "num_attention_heads", None) or getattr(
        getattr(module, "config", None), "num_attention_heads", None)
    if not isinstance(heads, int) or heads < 2:
        return None
    head_dim = getattr(module, "head_dim", None)
    return heads if n == heads or (isinstance(head_dim, int) and n == heads * head_dim) else None


def module_named(owners, model: int, name: str) -> torch.nn.Module | None:
    """The module a site names (its model's index, its qualified name), while it lives; once per site."""
    for ref, index, known in list(owners._of.values()):
        if index == model and known == name:
            return ref()
    return None


def add_heads(heads: list | None, y: torch.Tensor, h: int, closed: int, ys: list | None = None) -> tuple[list, float]:
    """Add the call's per-head sums to ``heads`` ([closed per head, Σ y per head]; None: none yet); (heads, Σ y).
    ``closed``: the call's closed count (0: no per-head closed pass); ``ys``: a small call's values as Python floats,
    flat (gatecount counts it from them), else None."""
    if heads is None:
        heads = [[0] * h, [0.0] * h]
    if ys is not None:
        n = y.shape[-1]
        k = n // h
        per = [ys[i::h] if k == 1 else list(itertools.chain.from_iterable(
            ys[r + i * k:r + (i + 1) * k] for r in range(0, len(ys), n))) for i in range(h)]
        totals = [math.fsum(p) for p in per]
        shut = [below(p) for p in per] if closed else None
    else:
        v = y.reshape(-1, h, y.shape[-1] // h)
        totals = torch.sum(v, dim=(0, 2), dtype=torch.float64).tolist()
        shut = torch.count_nonzero(v < closed_below(y.dtype), dim=(0, 2)).tolist() if closed else None
    for i in range(h):
        heads[1][i] += totals[i]
        if shut:
            heads[0][i] += shut[i]
    return heads, math.fsum(totals)


def merge(into: list | None, heads: list | None) -> list | None:
    """A step's per-head sums added to the site's."""
    if heads is None:
        return into
    if into is None:
        return [list(heads[0]), list(heads[1])]
    for a, b in zip(into, heads):
        for i, v in enumerate(b):
            a[i] += v
    return into


def per_head(heads: list | None, count: int) -> tuple | None:
    """Per head: (mean gate, closed share) over ``count`` elements of the site (count / H each)."""
    if heads is None or not count:
        return None
    each = count / len(heads[0])
    return tuple((total / each, shut / each) for shut, total in zip(*heads))
