"""Floating-point formats by name, and searches over a format's own values.

Every format the tool speaks of is a numpy dtype: numpy's own binary16/32/64 and the
bfloat16, fp8, fp6 and fp4 types of ml_dtypes. Facts about a format (precision, the
spacing just below 1.0) come from ``ml_dtypes.finfo``, never retyped.

The searches find where a monotone predicate over a format's positive values switches
from false to true: by enumerating every value of formats of 16 bits or fewer, and by
bisecting on bit patterns for wider ones (positive floats order like their bit patterns).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import ml_dtypes
import numpy as np

from softcapgrad.core.checks import InputError

# canonical name -> the spellings users type for it (canonical name included below)
_ALIASES: dict[str, tuple[str, ...]] = {
    "bfloat16": ("bf16",),
    "float16": ("fp16", "f16", "half"),
    "float32": ("fp32", "f32", "single", "float"),
    "float64": ("fp64", "f64", "double"),
}
_ML_DTYPES_FLOATS = (
    "float8_e3m4",
    "float8_e4m3",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e4m3b11fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
    "float6_e2m3fn",
    "float6_e3m2fn",
    "float4_e2m1fn",
)


def _spellings() -> dict[str, str]:
    table: dict[str, str] = {}
    for canonical, aliases in _ALIASES.items():
        for name in (canonical, *aliases):
            table[name] = canonical
    for canonical in _ML_DTYPES_FLOATS:
        short = canonical.replace("float", "fp", 1)  # fp8_e4m3fn
        for name in (canonical, short, short.replace("_", ""), canonical.split("_", 1)[1]):
            table.setdefault(name, canonical)
    return table


SPELLINGS = _spellings()
FORMAT_NAMES: tuple[str, ...] = (*_ALIASES, *_ML_DTYPES_FLOATS)


class UnknownFormat(InputError):
    """A format name outside the registry."""


_MODULE_PREFIXES = ("torch.", "numpy.", "np.", "jax.numpy.", "jnp.", "ml_dtypes.")


def canonical_name(name: str) -> str:
    """The registry's name for any accepted spelling, case-insensitive: ``BF16``, ``torch.bfloat16``, ``e4m3fn``."""
    key = name.strip().lower()
    for prefix in _MODULE_PREFIXES:
        if key.startswith(prefix):
            key = key[len(prefix):]
            break
    if key not in SPELLINGS:
        from softcapgrad.core.checks import suggestion

        hint = suggestion(key, SPELLINGS) or f"; known: {', '.join(FORMAT_NAMES)}"
        raise UnknownFormat(f"unknown format {name!r}{hint}")
    return SPELLINGS[key]


def resolve(name: str) -> np.dtype:
    """The numpy dtype for any accepted spelling (``bf16``, ``half``, ``fp8_e4m3fn``...)."""
    canonical = canonical_name(name)
    if canonical in _ML_DTYPES_FLOATS or canonical == "bfloat16":
        return np.dtype(getattr(ml_dtypes, canonical))
    return np.dtype(canonical)


def resolve_many(names: list[str]) -> list[np.dtype]:
    """Resolve a list of names; ``all`` expands to every registered format, duplicates drop."""
    canon: list[str] = []
    for name in names:
        expanded = FORMAT_NAMES if name.strip().lower() == "all" else (canonical_name(name),)
        canon.extend(n for n in expanded if n not in canon)
    return [resolve(n) for n in canon]


def finfo(dtype: np.dtype):
    return ml_dtypes.finfo(dtype) if dtype.type.__module__.startswith("ml_dtypes") else np.finfo(dtype)


def bit_width(dtype: np.dtype) -> int:
    """Storage bits that carry a value, as the format's finfo gives them (4 and 6 for fp4/fp6, which ml_dtypes
    keeps in a byte; 64 for float64, which a match on the name's prefix once read as fp6)."""
    return int(ml_dtypes.finfo(dtype).bits)


@dataclass(frozen=True)
class FormatFacts:
    """What the saturation of tanh needs to know about a format."""

    dtype: str
    bits: int
    mantissa_bits: int  # p, explicit fraction bits
    below_one: float  # largest representable value < 1.0
    spacing_below_one: float  # 1 - below_one (ml_dtypes: epsneg)
    below_one_is_subnormal: bool
    max: float
    ln_max: float


def facts(dtype: np.dtype) -> FormatFacts:
    info = finfo(dtype)
    epsneg = float(info.epsneg)
    below = 1.0 - epsneg
    return FormatFacts(
        dtype=dtype.name,
        bits=bit_width(dtype),
        mantissa_bits=int(info.nmant),
        below_one=below,
        spacing_below_one=epsneg,
        below_one_is_subnormal=below < float(info.smallest_normal),
        max=float(info.max),
        ln_max=math.log(float(info.max)),
    )


_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def positive_values(dtype: np.dtype) -> np.ndarray:
    """Every finite value > 0 of a format of at most 16 bits, ascending, in that format.

    Non-negative floats order like their bit patterns, so the patterns from 0 up to that of
    the largest finite value, less zero, NaN and inf, are the answer already sorted.
    """
    if dtype.itemsize > 2:
        raise ValueError(f"{dtype.name} is too wide to enumerate")
    uint = _UINT[dtype.itemsize]
    top = int(np.array(finfo(dtype).max, dtype=dtype).view(uint))
    values = np.arange(top + 1, dtype=uint).view(dtype)
    with np.errstate(invalid="ignore"):  # NaN bit patterns
        as_float = values.astype(np.float64)
    return values[np.isfinite(as_float) & (as_float > 0)]


@dataclass(frozen=True)
class Switch:
    """Where a predicate over a format's positive values turns true."""

    last_false: float | None  # largest value where it is false (None: true from the start)
    first_true: float | None  # smallest value where it is true (None: never true)
    monotone: bool  # the searched stretch switches once, false then true
    method: str  # "enumeration" or "bisection"
    checked: int  # how many values the monotonicity check looked at
    run_start: float | None = None  # where the last run of true values, up to the searched end, begins
    last_false_after: float | None = None  # past first_true, the largest value where it is false (None: monotone)


Predicate = Callable[[np.ndarray], np.ndarray]

def find_switch(dtype: np.dtype, predicate: Predicate, window: int = 4096, method: str = "auto") -> Switch:
    """First positive value of ``dtype`` where ``predicate`` (vectorised, bool array) holds.

    Formats of 16 bits or fewer are enumerated whole, so monotonicity is checked over every
    value. Wider formats are bisected on bit patterns, then ``window`` neighbours either side
    of the switch are evaluated to check that it switches once there. ``method`` may force
    "enumeration" or "bisection" (tests compare the two on 16-bit formats).
    """
    if method == "enumeration" or (method == "auto" and dtype.itemsize <= 2):
        values = positive_values(dtype)
        hits = np.asarray(predicate(values), dtype=bool)
        return _switch_from(values, hits, "enumeration")
    uint = _UINT[dtype.itemsize]
    top = int(np.array(finfo(dtype).max, dtype=dtype).view(uint))

    def holds(pattern: int) -> bool:
        return bool(predicate(np.array([pattern], dtype=uint).view(dtype))[0])

    lo, hi = 1, top  # invariant: answer in (lo - 1, hi] once we know holds(hi)
    if not holds(top):
        lo = top + 1
    else:
        while lo < hi:
            mid = (lo + hi) // 2
            if holds(mid):
                hi = mid
            else:
                lo = mid + 1
    start, stop = max(1, lo - window), min(top, lo + window)
    values = np.arange(start, stop + 1, dtype=uint).view(dtype)
    hits = np.asarray(predicate(values), dtype=bool)
    return _switch_from(values, hits, "bisection")


def _switch_from(values: np.ndarray, hits: np.ndarray, method: str) -> Switch:
    as_float = values.astype(np.float64)
    if not hits.any():
        return Switch(float(as_float[-1]), None, True, method, int(hits.size))
    i = int(np.argmax(hits))
    misses = np.flatnonzero(~hits[i:])
    after = i + int(misses[-1]) if misses.size else None
    return Switch(
        last_false=float(as_float[i - 1]) if i > 0 else None,
        first_true=float(as_float[i]),
        monotone=after is None,
        method=method,
        checked=int(hits.size),
        run_start=float(as_float[i]) if after is None else (float(as_float[after + 1]) if after + 1 < hits.size else None),
        last_false_after=None if after is None else float(as_float[after]),
    )


def torch_dtype(dtype: np.dtype):
    """The torch dtype of the same format, or None where torch has none. Imports torch."""
    import torch

    return getattr(torch, dtype.name, None)


def to_torch(values: np.ndarray, dtype: np.dtype):
    """Values of a format as a torch tensor of that format (exact: they are representable)."""
    import torch

    return torch.from_numpy(values.astype(np.float64)).to(torch_dtype(dtype))


def neighbours_below(dtype: np.dtype, value: float, count: int, after: int = 0) -> np.ndarray:
    """The ``count`` positive values of ``dtype`` just below ``value``, ``value`` itself, and ``after`` above it."""
    uint = _UINT[dtype.itemsize]
    top = int(np.array([value], dtype=np.float64).astype(dtype).view(uint)[0])
    patterns = np.arange(max(1, top - count), top + after + 1, dtype=uint)
    return patterns.view(dtype)
