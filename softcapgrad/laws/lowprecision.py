"""The correction's descent with the cap in a low-precision format, as mixed-precision training runs it.

softcapgrad.md, "What the attenuation does not do", in bf16/fp16/fp32: the master logit a stays in
fp32; the cap's forward and backward run in the format by torch autograd, so past the format's
pre-cap horizon the step is exactly 0 and a start can stall for good. 16-bit formats are walked
from a table of every value's step (one autograd call for all 65,536 values), wider ones step by
step. The cap is passed in as a ``Backward``: autograd's own by default.
"""

from __future__ import annotations

import bisect
import math
import struct
from dataclasses import dataclass
from functools import cache
from typing import Callable

import numpy as np

from softcapgrad.laws.descent import Runs, Setting


def eager_cap(x, c: float):
    """z = c·tanh(x/c) op by op in x's format, autograd's own backward."""
    import torch

    return c * torch.tanh(x / c)


@dataclass(frozen=True)
class Backward:
    """The cap as a low-precision step computes it: a name for reports and z = cap(x, c) in torch.

    The default is autograd's own; a caller that owns another (the remedy, softcapgrad.softcap) passes
    it in as ``Backward("remedy", softcap)``.
    """

    name: str
    cap: Callable = eager_cap


EAGER = Backward("eager")


def _capped_loss(x, s: Setting, capped: bool, backward: Backward):
    """The step's forward from the logit x (in its format): margin z − ln(rest) in fp32, and the loss."""
    import torch

    z = backward.cap(x, s.cap) if capped else x
    margin = z.float() - s.log_rest
    return margin, torch.nn.functional.softplus(margin).sum()  # −log(1 − p) = CE on the correct class + const


def descend_low_precision(a0: np.ndarray, s: Setting, capped: bool, dtype, backward: Backward = EAGER) -> Runs:
    """Mixed precision: fp32 master a; the cap forward and backward in ``dtype`` by torch autograd.

    The loss (softmax cross-entropy) is taken in fp32 from the low-precision logit. A start whose
    gradient is exactly 0 while p ≥ threshold can never move again: it is 'stalled'. With
    ``Backward("remedy", softcapgrad.softcap)`` the cap has the same forward and an fp32 sech² backward.
    16-bit formats run from a table of every value's step (:func:`descend_by_table`), wider ones
    step by step (:func:`descend_autograd`).
    """
    if np.dtype(dtype).itemsize == 2:
        return descend_by_table(a0, s, capped, dtype, backward)
    return descend_autograd(a0, s, capped, dtype, backward)


@dataclass(frozen=True)
class _Steps:
    """What one step does from each value of a 16-bit format, values ascending (±0 merged, ±inf kept)."""

    lower: list[float]  # the smallest fp32 master value that rounds to this value
    step: list[float]  # fp32(lr·grad): the update of the fp32 master value
    stalled: list[bool]  # the gradient is exactly 0
    done: list[bool]  # p < threshold
    confident: list[bool]  # p > s.confident
    attenuation: list[float]  # grad/p in float64, at least 0


@cache
def _steps(s: Setting, capped: bool, dtype_name: str, backward: Backward) -> _Steps:
    """One autograd call over every value of the format: the step each value would take."""
    import torch

    tdtype = getattr(torch, dtype_name)
    patterns = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(tdtype)
    values = patterns[~patterns.isnan() & (patterns.view(torch.int16) != torch.iinfo(torch.int16).min)]  # drop −0
    values = values.sort().values
    x = values.clone().requires_grad_(True)
    margin, loss = _capped_loss(x, s, capped, backward)
    (grad,) = torch.autograd.grad(loss, x)
    p = torch.sigmoid(margin.detach())
    # rounding to the format is monotone: value k takes the fp32 inputs from the midpoint with its lower
    # neighbour up (the midpoint itself when it rounds up); ±inf take everything past max ± ulp/2
    wide = values.double()
    beyond = 2 * wide[-2] - wide[-3]  # where a value past the largest would be, for the rounding to ±inf
    spaced = torch.cat([-beyond.view(1), wide[1:-1], beyond.view(1)])
    mids = ((spaced[:-1] + spaced[1:]) / 2).float()  # between consecutive values: exact in fp32
    up = mids.to(tdtype).double() == wide[1:]
    lower = torch.where(up, mids, torch.nextafter(mids, torch.tensor(math.inf)))
    return _Steps(
        lower=[-math.inf, *lower.tolist()],
        step=(s.lr * grad.float()).tolist(),
        stalled=(grad == 0).tolist(),
        done=(p < s.threshold).tolist(),
        confident=(p > s.confident).tolist(),
        attenuation=(grad.double() / p.double()).clamp(min=0).tolist(),
    )


_F32 = struct.Struct("<f")


def descend_by_table(a0: np.ndarray, s: Setting, capped: bool, dtype, backward: Backward = EAGER) -> Runs:
    """:func:`descend_autograd` for a 16-bit format, with the same arithmetic and bit-identical steps.

    Each step depends only on the value the fp32 master rounds to, so one autograd call over all
    65,536 values (:func:`_steps`) replaces one call per step; the descent then walks the table in
    Python floats, rounding the master value to fp32 after each update as torch does.
    """
    import torch

    table = _steps(s, capped, np.dtype(dtype).name, backward)
    starts = torch.tensor(np.asarray(a0, dtype=np.float64), dtype=torch.float32).tolist()
    n = len(starts)
    steps, conf_steps = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    conf_att, bound_att = np.zeros(n), np.zeros(n)
    status = np.full(n, "not converged", dtype=object)
    lower, step, stalled, done = table.lower, table.step, table.stalled, table.done
    confident, attenuation = table.confident, table.attenuation
    for j, a in enumerate(starts):
        taken = conf = 0
        att_conf = att_bound = 0.0
        for n_step in range(s.max_steps + 1):
            k = bisect.bisect_right(lower, a) - 1
            if done[k] or stalled[k]:
                status[j] = "converged" if done[k] else "stalled"
                break
            if n_step == s.max_steps:
                break
            if confident[k]:
                conf += 1
                att_conf += attenuation[k]
            else:
                att_bound += attenuation[k]
            a = _F32.unpack(_F32.pack(a - step[k]))[0]
            taken += 1
        steps[j], conf_steps[j], conf_att[j], bound_att[j] = taken, conf, att_conf, att_bound
    with np.errstate(invalid="ignore", divide="ignore"):
        return Runs(
            a0=np.asarray(a0, dtype=np.float64),
            steps=steps,
            status=status.astype(str),
            confident_steps=conf_steps,
            confident_mean_attenuation=conf_att / conf_steps,
            boundary_mean_attenuation=bound_att / (steps - conf_steps),
            log_g_variation=np.full(n, np.nan),
        )


def descend_autograd(a0: np.ndarray, s: Setting, capped: bool, dtype, backward: Backward = EAGER) -> Runs:
    """:func:`descend_low_precision` one autograd call per step, all starts at once (any format)."""
    import torch

    tdtype = getattr(torch, np.dtype(dtype).name)
    a = torch.tensor(np.asarray(a0, dtype=np.float64), dtype=torch.float32)
    n = a.numel()
    steps = torch.zeros(n, dtype=torch.int64)
    done = torch.zeros(n, dtype=torch.bool)
    stalled = torch.zeros(n, dtype=torch.bool)
    conf_steps = torch.zeros(n, dtype=torch.int64)
    conf_att = torch.zeros(n, dtype=torch.float64)
    bound_att = torch.zeros(n, dtype=torch.float64)
    for n_step in range(s.max_steps + 1):
        x = a.to(tdtype).requires_grad_(True)
        margin, loss = _capped_loss(x, s, capped, backward)
        (grad,) = torch.autograd.grad(loss, x)
        p = torch.sigmoid(margin.detach())
        done |= p < s.threshold
        stalled |= ~done & (grad == 0)
        active = ~done & ~stalled
        if not bool(active.any()) or n_step == s.max_steps:
            break
        att = (grad.double() / p.double()).clamp(min=0)  # the attenuation the format actually applied
        confident = p > s.confident
        conf_steps += (active & confident).long()
        conf_att += torch.where(active & confident, att, 0.0)
        bound_att += torch.where(active & ~confident, att, 0.0)
        a = torch.where(active, a - s.lr * grad.float(), a)
        steps += active.long()
    status = np.where(done.numpy(), "converged", np.where(stalled.numpy(), "stalled", "not converged"))
    cs = conf_steps.numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        return Runs(
            a0=np.asarray(a0, dtype=np.float64),
            steps=steps.numpy(),
            status=status,
            confident_steps=cs,
            confident_mean_attenuation=conf_att.numpy() / cs,
            boundary_mean_attenuation=bound_att.numpy() / (steps.numpy() - cs),
            log_g_variation=np.full(n, np.nan),
        )
