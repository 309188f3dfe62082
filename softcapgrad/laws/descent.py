"""Correcting a confidently wrong logit by gradient descent, in float64: the reference every format is held to.

softcapgrad.md, "What the attenuation does not do". Each start a0 is walked in plain Python floats,
a ← a − lr·p(z)·sech²(a/c) with z = c·tanh(a/c) (or z = a uncapped), until the wrong class's probability
p falls below the threshold; the runs record the steps, the confident phase (p above ``confident``) and its
mean attenuation, and how much log-gradient varies from step to step. The setting and the runs' shape
are shared with the low-precision descent (softcapgrad.laws.lowprecision) and the report (dynamics).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import numpy as np



@dataclass(frozen=True)
class Setting:
    cap: float
    lr: float = 1.0
    threshold: float = 1e-3
    classes: int = 2
    correct: float = 0.0  # the correct class's fixed logit
    max_steps: int = 100_000
    confident: float = 0.5  # p above this counts as the confident phase

    @property
    def log_rest(self) -> float:
        """ln(e^y + K − 2): the log softmax mass of every class but the wrong one, without overflow."""
        return float(np.logaddexp(self.correct, math.log(self.classes - 2))) if self.classes > 2 else self.correct


def wrong_probability(z: np.ndarray, s: Setting) -> np.ndarray:
    """p = e^z/(e^z + rest) = 1/(1 + e^{−(z − ln rest)}), without overflow or cancellation."""
    return np.exp(-np.logaddexp(0.0, s.log_rest - np.asarray(z)))


@dataclass(frozen=True)
class Runs:
    """Per-start results of vectorised descent: one entry per a0."""

    a0: np.ndarray
    steps: np.ndarray  # updates until p < threshold
    status: np.ndarray  # "converged" | "stalled" | "not converged"
    confident_steps: np.ndarray
    confident_mean_attenuation: np.ndarray
    boundary_mean_attenuation: np.ndarray
    log_g_variation: np.ndarray  # Σ (exp|Δ ln g| − 1) along the path: bound on |steps − integral|


def _sech2(x: float) -> float:
    """1/cosh(x)², as :func:`attenuation.sech2` computes it in float64; 0 once cosh overflows."""
    try:
        ch = math.cosh(x)
    except OverflowError:
        return 0.0
    return 1.0 / (ch * ch)


def _wrong_probability(z: float, log_rest: float) -> float:
    """:func:`wrong_probability` for one value: numpy's logaddexp(0, t), t = ln(rest) − z, written out."""
    t = log_rest - z
    if t == 0.0:
        softplus = math.log(2.0)
    elif t > 0.0:
        softplus = t + math.log1p(math.exp(-t))
    else:
        softplus = math.log1p(math.exp(t))
    return math.exp(-softplus)


def _variation(log_g: float, log_g_prev: float) -> float:
    """exp|Δ ln g| − 1 with numpy's nan_to_num: NaN counts 0, overflow the largest float."""
    try:
        v = math.expm1(abs(log_g - log_g_prev))
    except OverflowError:
        return sys.float_info.max
    return 0.0 if math.isnan(v) else min(v, sys.float_info.max)


def descend(a0: np.ndarray, s: Setting, capped: bool) -> Runs:
    """Plain gradient descent on a, float64, one start at a time in Python floats.

    Value for value the arithmetic of the numpy formulas (:func:`wrong_probability`,
    :func:`attenuation.sech2`): tanh is numpy's, whose float64 tanh differs from the math module's
    in the last bit; exp, log1p, cosh, log and expm1 come from the math module, which numpy's
    agree with. A step costs a few microseconds instead of a numpy call per operation.
    """
    starts = np.asarray(a0, dtype=np.float64)
    n = starts.size
    steps, conf_steps = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    conf_att, bound_att, variation = np.zeros(n), np.zeros(n), np.zeros(n)
    status = np.full(n, "not converged", dtype=object)
    c, lr, log_rest, tanh = s.cap, s.lr, s.log_rest, np.tanh
    for j, a in enumerate(starts.tolist()):
        taken = conf = 0
        att_conf = att_bound = var = 0.0
        log_g_prev = math.nan
        for n_step in range(s.max_steps + 1):
            p = _wrong_probability(c * float(tanh(a / c)) if capped else a, log_rest)
            if p < s.threshold:
                status[j] = "converged"
                break
            if n_step == s.max_steps:
                break
            att = _sech2(a / c) if capped else 1.0
            g = p * att
            log_g = math.log(g) if g > 0.0 else -math.inf
            var += _variation(log_g, log_g_prev)
            log_g_prev = log_g
            if p > s.confident:
                conf += 1
                att_conf += att
            else:
                att_bound += att
            a -= lr * g
            taken += 1
        steps[j], conf_steps[j], conf_att[j], bound_att[j], variation[j] = taken, conf, att_conf, att_bound, var
    with np.errstate(invalid="ignore", divide="ignore"):
        return Runs(
            a0=starts,
            steps=steps,
            status=status.astype(str),
            confident_steps=conf_steps,
            confident_mean_attenuation=conf_att / conf_steps,
            boundary_mean_attenuation=bound_att / (steps - conf_steps),
            log_g_variation=variation,
        )
