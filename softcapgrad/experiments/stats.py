"""Steps-to-recover over seeds: median, spread, and the bootstrap interval of the bf16-eager ÷ patched ratio.

A run not recovered within the budget counts at the budget (a lower bound, marked censored). The
ratio is of medians over the same seeds; the bootstrap resamples seed indices with replacement,
the same indices for both arms (the runs are paired by seed), with a seeded numpy generator, and
takes the percentile interval. The verdict says only what the interval says.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Summary:
    steps: list[int | None]  # per seed, None: not recovered
    counted: list[int]  # per seed, censored runs at the budget
    median: float
    low: int  # spread: fewest and most steps over seeds
    high: int
    recovered: int  # seeds recovered within the budget
    censored: bool  # the median rests on a censored run


def summary(steps: list[int | None], budget: int) -> Summary:
    counted = [budget if s is None else s for s in steps]
    median = float(np.median(counted))
    censored = any(s is None for s in steps) and median >= min(c for s, c in zip(steps, counted) if s is None)
    return Summary(list(steps), counted, median, min(counted), max(counted), sum(s is not None for s in steps), censored)


@dataclass(frozen=True)
class Ratio:
    ratio: float | None  # median(eager) / median(patched)
    low: float | None  # bootstrap interval
    high: float | None
    verdict: str


def ratio(eager: list[int], patched: list[int], resamples: int, confidence: float, seed: int) -> Ratio:
    a, b = np.asarray(eager, dtype=np.float64), np.asarray(patched, dtype=np.float64)
    if len(a) == 0 or len(a) != len(b) or np.median(b) == 0:
        return Ratio(None, None, None, "no ratio (a median of 0 steps, or no seeds)")
    point = float(np.median(a) / np.median(b))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(a), size=(resamples, len(a)))
    top, bottom = np.median(a[idx], axis=1), np.median(b[idx], axis=1)
    keep = bottom > 0
    ratios = top[keep] / bottom[keep]
    tail = (1.0 - confidence) / 2.0
    low, high = (float(x) for x in np.quantile(ratios, [tail, 1.0 - tail]))
    if low > 1.0:
        verdict = "bf16 eager slower"
    elif high < 1.0:
        verdict = "bf16 eager faster"
    else:
        verdict = "no measurable difference"
    return Ratio(round(point, 4), round(low, 4), round(high, 4), verdict)


@dataclass(frozen=True)
class Paired:
    ratios: list[float]  # per seed, a_i / b_i
    geomean: float | None  # exp(mean log ratio)
    low: float | None  # paired percentile bootstrap interval of the geometric mean
    high: float | None
    slower: int  # seeds with a_i > b_i
    tied: int
    faster: int
    wilcoxon_p: float | None  # scipy's two-sided Wilcoxon signed-rank test on the log ratios (ties dropped)
    verdict: str


def verdict(low: float, high: float, point: float) -> str:
    """The interval in words: a cost, a gain, or the largest cost it leaves possible."""
    if low > 1.0:
        return f"costs {100 * (point - 1):.1f} % ({100 * (low - 1):.1f}–{100 * (high - 1):.1f} %)"
    if high < 1.0:
        return f"faster by {100 * (1 - point):.1f} % ({100 * (1 - high):.1f}–{100 * (1 - low):.1f} %)"
    return f"no cost larger than {100 * (high - 1):.1f} % (interval {low:.4g}–{high:.4g})"


def signed_rank_p(x) -> float | None:
    """Two-sided Wilcoxon signed-rank p of paired differences ``x`` (scipy's ``wilcoxon``, zeros dropped: exact
    without ties or zeros, else the normal approximation with its tie correction); None when every x is 0."""
    x = np.asarray(x, dtype=np.float64)
    if not np.any(x != 0):
        return None
    from scipy.stats import wilcoxon

    return round(float(wilcoxon(x, zero_method="wilcox").pvalue), 6)


def paired(a: list[int], b: list[int], resamples: int, confidence: float, seed: int) -> Paired:
    """Per-seed ratios a_i / b_i (paired by seed): geometric mean, bootstrap interval, signs, Wilcoxon."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    keep = (x > 0) & (y > 0)
    x, y = x[keep], y[keep]
    if len(x) == 0:
        return Paired([], None, None, None, 0, 0, 0, None, "no ratio (no seed with both counts above 0)")
    logs = np.log(x / y)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(logs), size=(resamples, len(logs)))
    tail = (1.0 - confidence) / 2.0
    low, high = (float(np.exp(q)) for q in np.quantile(logs[idx].mean(axis=1), [tail, 1.0 - tail]))
    point = float(np.exp(logs.mean()))
    p = signed_rank_p(logs)
    return Paired([round(float(r), 6) for r in x / y], round(point, 6), round(low, 6), round(high, 6),
                  int((logs > 0).sum()), int((logs == 0).sum()), int((logs < 0).sum()), p,
                  verdict(low, high, point))
