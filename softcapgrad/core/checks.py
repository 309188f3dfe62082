"""Input validation shared by every command: one clear sentence per bad value."""

from __future__ import annotations

import math
from typing import Iterable


class InputError(ValueError):
    """A bad input the user can fix; the CLI prints it as one line and exits 2."""


def positive(name: str, value: float) -> float:
    if not math.isfinite(value) or value <= 0:
        raise InputError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


FP32_NORMAL_RANGE = (2.0**-126, 3.4028234663852886e38)  # smallest normal and largest finite fp32


def in_range(name: str, value: float, lo: float, hi: float, why: str) -> float:
    """lo <= value <= hi, else one line that names the range and why it is the range."""
    if not (math.isfinite(value) and lo <= value <= hi):
        raise InputError(f"{name} {value:g}: {why}, so it must lie in [{lo:.4g}, {hi:.4g}]")
    return float(value)


def fp32_cap(name: str, value: float) -> float:
    """A cap the stacks can divide by: the eager and compiled caps compute a/c in fp32."""
    positive(name, value)
    return in_range(name, value, *FP32_NORMAL_RANGE, "the stacks compute a/c in fp32 (normal range)")


def positives(name: str, values: Iterable[float]) -> list[float]:
    return [positive(name, v) for v in values]


def finite(name: str, value: float) -> float:
    if not math.isfinite(value):
        raise InputError(f"{name} must be finite, got {value!r}")
    return float(value)


def at_least(name: str, value: int, low: int) -> int:
    if value < low:
        raise InputError(f"{name} must be at least {low}, got {value!r}")
    return value


def within(name: str, value: float, lo: float, hi: float, *, closed_lo: bool = False) -> float:
    """lo < value < hi (or lo <= value with closed_lo)."""
    ok = math.isfinite(value) and (lo <= value if closed_lo else lo < value) and value < hi
    if not ok:
        bracket = "[" if closed_lo else "("
        raise InputError(f"{name} must lie in {bracket}{lo:g}, {hi:g}), got {value!r}")
    return float(value)


def increasing_range(name: str, lo: float, hi: float) -> tuple[float, float]:
    finite(name, lo)
    finite(name, hi)
    if not lo < hi:
        raise InputError(f"{name} must be a non-empty range LO < HI, got {lo!r} {hi!r}")
    return float(lo), float(hi)


def suggestion(value: str, allowed: Iterable[str]) -> str:
    """'; did you mean X?' for the closest accepted value, or nothing when none is close."""
    import difflib

    key, original = value.strip().lower(), {a.lower(): a for a in allowed}
    starts = sorted((a for a in original if key and a.startswith(key)), key=len)
    close = starts[:1] or difflib.get_close_matches(key, list(original), n=1, cutoff=0.6)
    if not close:
        return ""
    original = original[close[0]]
    return f"; did you mean {original!r}?"


def choice(name: str, value: str, allowed: Iterable[str]) -> str:
    """The accepted value matching ``value`` without regard to case; else one line with the accepted values."""
    allowed = tuple(allowed)
    folded = {a.lower(): a for a in allowed}
    key = value.strip().lower()
    if key not in folded:
        raise InputError(f"{name} {value!r} is not accepted: use one of {', '.join(allowed)}{suggestion(value, allowed)}")
    return folded[key]
