"""The arithmetic every parity verdict shares: the tolerance of a comparison (engines/forward/verdict.py's docstring
derives it), the largest log-prob error between two runs, and a verdict row."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from softcapgrad.engines.forward.bundle_check import LN_TINY, log_probs, top_mask, unrepresentable, worst  # noqa: F401

K = 16
FP32 = 2.0 ** -24
RATIO = 10.0  # a low-precision row nearer one reference by this factor is judged by it (as a server's answer is)
MATCH = 0.5  # an alternative is named only where it fits at least twice as well as the exact form
SWAPPED = "the two caps' values swapped"  # a whole-model form that alters the attention cap as well
OWN_PAIR = "judged on the engine's own runs with and without the cap"  # a row decided by verdict's differential
CAPPED = "with the final cap: "  # an attention alternative computed with the final cap on (engines judged capped)


def model_scale(reference, *more: np.ndarray) -> float:
    """M of the whole-model tolerance: the largest |logit| of the reference's capped and final-off runs (and of
    ``more``), so the largest |pre-cap a|. A capped log-prob's error is the pre-cap logits' error, made at that
    magnitude, times tanh's slope (at most 1): the capped comparisons take the pre-cap M, not the capped logits'
    (at most c), which a model bound to a = 4c would hold to a quarter of its own rounding."""
    runs = [reference.logits[v] for v in ("capped", "final off") if v in reference.logits] + list(more)
    return float(max(np.abs(r).max() for r in runs))


def tolerance(unit: float, scale: float, roundings: float = K, once: float = 0.0) -> float:
    """2δ with δ = (roundings·unit + once)·scale: the largest log-prob error allowed."""
    return 2 * (roundings * unit + once) * scale


def knee(target: float, relative: bool) -> float:
    """The |a/c| = x below which the cap c·tanh(a/c) changes its input by less than ``target``·c (x − tanh x), or,
    ``relative``, by less than ``target``·|a| (1 − tanh(x)/x): both rise with x, so bisection in float64 finds it
    (inf where the change never reaches ``target``; a relative change stays below 1)."""
    import math

    change = (lambda x: 1 - math.tanh(x) / x) if relative else (lambda x: x - math.tanh(x))
    lo, hi = 0.0, 64.0
    if change(hi) < target:
        return math.inf
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if change(mid) < target else (lo, mid)
    return hi


def exercised_from(reference, cap: str) -> float:
    """The largest |a/c| at which the cap is not exercised: it changes no input by more than the fp32 reference's
    own rounding allowance for it (engines/forward/verdict.py derives both). Final cap: δ = K·u·c is the row's
    allowance for each logit, and the cap moves a logit by c·(x − tanh x). Attention cap: the row allows every
    reduction a relative error n·u (γ_n), the scores' own dot products included, and the cap moves a score by
    the relative 1 − tanh(x)/x."""
    return knee(K * FP32, False) if cap == "final" else knee(reference.width * FP32, True)


@dataclass(frozen=True)
class Error:
    value: float  # largest |Δ log-prob|
    token: int
    vocab: int
    left_out: int = 0  # entries with both sides below fp32's smallest normal, not compared


def top(lp: np.ndarray, k: int) -> np.ndarray | None:
    """Each position's ``k`` most likely tokens as a mask (None: every token, k = 0)."""
    return top_mask(lp, k)


def error(lp: np.ndarray, reference_lp: np.ndarray, mask: np.ndarray | None = None) -> Error:
    """The largest |Δ log-prob|, leaving out entries where both sides lie below LN_TINY, the log of fp32's smallest
    normal number: a probability under it holds fewer than 24 bits in any fp32 softmax (under 2^-149 it is 0, and
    an engine that returns log-probabilities gives -inf), so no fp32 computation's log-prob is exact there. How
    many were left out is kept. The code is the reproduction bundles' (bundle_check.worst), so that a bundle
    compares as parity did."""
    return Error(*worst(lp, reference_lp, mask), unrepresentable(lp, reference_lp, mask))


def _nonfinite(*arrays) -> int:
    """NaN and +inf entries; -inf is a log-probability's zero and is judged by the comparison (``error``)."""
    return int(sum(np.isnan(a).sum() + np.isposinf(a).sum() for a in arrays))


def _row(cap: str, c, verdict: str, applied: Error | None, ignored: Error | None, tol: float, **extra) -> dict:
    return {"cap": cap, "c": c, "verdict": verdict,
            "error": None if applied is None else applied.value,
            "error_off": None if ignored is None else ignored.value,
            "where": None if applied is None else f"token {applied.token}, id {applied.vocab}",
            "tolerance": tol, **({"left_out": applied.left_out} if applied is not None and applied.left_out else {}),
            **extra}


def differential(on: np.ndarray, off: np.ndarray, reference_on: np.ndarray, reference_off: np.ndarray,
                 mask: np.ndarray | None = None) -> tuple[float, float]:
    """A cap judged on the engine's own pair of runs, with it (``on``) and without it (``off``): the largest
    difference between the engine's own effect of the cap and the reference's, lp(on) − lp(off) against the same
    of the reference, over the entries all four hold above fp32's smallest normal; and the engine's own effect,
    the largest |lp(on) − lp(off)|. An error the engine makes alike in both runs (outside the cap) cancels."""
    e_on, e_off, r_on, r_off = (log_probs(x) for x in (on, off, reference_on, reference_off))
    held = (e_on > LN_TINY) & (e_off > LN_TINY) & (r_on > LN_TINY) & (r_off > LN_TINY)
    if mask is not None:
        held &= mask
    with np.errstate(invalid="ignore"):
        effect = np.where(held, np.abs((e_on - e_off) - (r_on - r_off)), 0.0)
    own = worst(e_on, e_off, mask)[0]
    return float(effect.max()), own
