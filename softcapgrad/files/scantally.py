"""The scan's one-pass tally of a tensor: exact counts of dead values, NaN and ±inf and the largest finite
|a|, and bins of 9 significant bits (one bfloat16 value each) for the attenuation quantiles and the
histogram, fed every value up to ``SAMPLE_FROM`` values and every k-th beyond (k a prime of
``SAMPLE_STEPS``: no power-of-two period in the data lines up with it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import ml_dtypes
import numpy as np

from softcapgrad.laws import formats

SAMPLE_FROM = 1 << 24  # tensors above this many values feed every k-th value to the bins, k from SAMPLE_STEPS
SAMPLE_STEPS = (7, 31, 127)  # primes: no power-of-two period in the data lines up with them
BINS_PER_SIDE = 12
_KEY_SHIFT = 15  # a float32 bit pattern >> 15: sign, exponent and 8 mantissa bits (9 significant bits)


@dataclass(frozen=True)
class DeadZone:
    """Where one implementation path's gradient is exactly 0, in pre-cap units.

    ``first_zero``: the smallest a > 0 with a zero gradient (inf: none); ``first_zero_below``: the
    negative a of smallest |a| with a zero gradient (−inf: none). ``scores``: the format the path
    rounds the pre-cap values to before the cap (a name ``formats.resolve`` accepts). ``unknown``: a zone
    that nothing here measured or recorded; its ends are then ±inf only so that the tally runs, and no
    count is reported for it.
    """

    path: str
    scores: str
    first_zero: float
    first_zero_below: float
    unknown: str = ""  # why the path has no figure here (not measured, not recorded); "" when it has one

    @property
    def one_sided(self) -> bool:
        return self.first_zero_below != -self.first_zero


def _to_scores(values: np.ndarray, scores: str) -> np.ndarray:
    """Values converted to the scores format as torch converts them, as float64: wider data goes through
    float32 first (torch's conversion of a double to bf16 or fp16 does), then one round-to-nearest-even to
    the format (numpy's and ml_dtypes' conversions round as torch's do); float64 scores take the values as
    they are. numpy only: the scan of a .npy or .safetensors file needs no torch."""
    target = formats.resolve(scores)
    x = np.asarray(values)
    if target.itemsize >= 8:
        return x.astype(np.float64)
    with np.errstate(over="ignore"):  # past float32's range: ±inf, as in torch
        wide = x.astype(np.float32) if x.dtype.itemsize > 4 else x
        return wide.astype(target).astype(np.float64)


@lru_cache(maxsize=256)
def _boundary(data: str, scores: str, threshold: float) -> float:
    """The smallest positive value of ``data`` whose conversion to ``scores`` is at least ``threshold``
    (inf where none is: then only +inf counts)."""
    fmt = formats.resolve(data)
    if not math.isfinite(threshold):
        return math.inf
    if fmt == formats.resolve(scores):
        return threshold
    found = formats.find_switch(fmt, lambda v: _to_scores(v.astype(np.float32) if v.dtype.itemsize < 4 else v, scores)
                                >= threshold).first_true
    return math.inf if found is None else found


def _pattern(value: float, fmt: np.dtype) -> np.uint16:
    """The bit pattern of a value of a 16-bit format (inf: the format's +inf)."""
    return np.array([value], dtype=np.float64).astype(np.float32).astype(fmt).view(np.uint16)[0]


def _sample_step(numel: int) -> int:
    """1 up to SAMPLE_FROM values; beyond, the largest of SAMPLE_STEPS that still leaves 2^22 values."""
    if numel <= SAMPLE_FROM:
        return 1
    return max([p for p in SAMPLE_STEPS if numel // p >= 1 << 22], default=SAMPLE_STEPS[0])


_KEYS = 1 << (32 - _KEY_SHIFT)  # 131,072 bins


class _Keys:
    """Bin keys of sampled values, counted in batches: one bincount per million keys, not per chunk."""

    def __init__(self, buffer: np.ndarray) -> None:
        self.buffer, self.fill, self.dense = buffer, 0, None

    def add(self, x32: np.ndarray) -> None:
        bits = x32.view(np.uint32)
        while bits.size:
            room = min(bits.size, self.buffer.size - self.fill)
            np.right_shift(bits[:room], _KEY_SHIFT, out=self.buffer[self.fill:self.fill + room], casting="unsafe")
            self.fill += room
            bits = bits[room:]
            if self.fill == self.buffer.size:
                self._flush()

    def _flush(self) -> None:
        counted = np.bincount(self.buffer[:self.fill], minlength=_KEYS)
        self.dense = counted if self.dense is None else self.dense + counted
        self.fill = 0

    def counts(self) -> tuple[np.ndarray, np.ndarray]:
        """(keys, counts) of every key seen, keys ascending."""
        if self.dense is None and self.fill < 1 << 16:  # a small tensor: sort, do not sweep 131,072 bins
            return np.unique(self.buffer[:self.fill], return_counts=True)
        if self.fill:
            self._flush()
        keys = np.flatnonzero(self.dense)
        return keys, self.dense[keys]


_BF16 = np.dtype(ml_dtypes.bfloat16)
_SIGN16 = np.uint16(0x8000)


class _Tally:
    """One tensor, one pass: exact counts over every value, and the bins its distribution is read from.

    A chunk is reduced by single-threaded numpy (torch's multi-threaded reductions wait for a second
    core on every chunk, which on a loaded machine costs more than the arithmetic). bfloat16 and
    float16 are compared as bit patterns: |a| orders like the pattern less its sign bit, so the
    largest |a| and the values at or past a zone's end take integer passes over 2-byte values, and
    the float path takes over only for a chunk with NaN or ±inf. Wider data is compared in float32
    (float64 above 32 bits), exact for every value of the format.
    """

    def __init__(self, zones: list[DeadZone], fmt: np.dtype, numel: int, buffers: tuple[np.ndarray, ...]) -> None:
        keys, self.scratch, self.mask = buffers
        self.zones, self.keys, self.fmt = zones, _Keys(keys), fmt
        self.compute = np.dtype(np.float32 if fmt.itemsize <= 4 else np.float64)
        self.step = _sample_step(numel)
        self.count = self.nan = self.pos_inf = self.neg_inf = 0
        self.max_abs: float | None = None
        self.above, self.below = [0] * len(zones), [0] * len(zones)
        # each zone's ends as values of the compute format: the data's values sit on its grid
        ends = [(_boundary(self.compute.name, z.scores, z.first_zero), _boundary(self.compute.name, z.scores, -z.first_zero_below))
                for z in zones]
        self.bounds = [(self.compute.type(up), self.compute.type(-down)) for up, down in ends]
        self.bits16 = fmt in (_BF16, np.dtype(np.float16))
        if self.bits16:  # the ends as patterns of the format itself, and +inf's
            self.inf16 = _pattern(np.inf, fmt)
            self.bound_bits = [(_pattern(_boundary(fmt.name, z.scores, z.first_zero), fmt),
                                _pattern(_boundary(fmt.name, z.scores, -z.first_zero_below), fmt) | _SIGN16) for z in zones]

    def _float32(self, x: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Values as float32 (bfloat16 by shifting its bits into ``out``), float64 above 32 bits."""
        if x.dtype == self.compute:
            return x
        if x.dtype == _BF16:  # bfloat16 is the top half of a float32
            return np.left_shift(x.view(np.uint16), 16, out=out[:x.size].view(np.uint32), dtype=np.uint32).view(np.float32)
        with np.errstate(over="ignore"):  # long double past float64: ±inf
            return x.astype(self.compute)

    def add(self, x: np.ndarray, start: int) -> None:
        """Chunk ``x``, the values from index ``start`` of the tensor."""
        if not x.size:
            return
        self.count += x.size
        picked = x[-start % self.step::self.step]
        if not (self.bits16 and self._add_bits(x.view(np.uint16))):
            nan = self._add_float(self._float32(x, self.scratch))
            picked = picked[~np.isnan(picked)] if nan else picked
        keys = self._float32(picked, self.scratch)
        with np.errstate(over="ignore"):
            self.keys.add(keys if keys.dtype == np.float32 else keys.astype(np.float32))

    def _add_bits(self, u: np.ndarray) -> bool:
        """A 16-bit chunk by its patterns; False (nothing counted) when it holds NaN or ±inf.

        Read as int16 the positive values order like their patterns and every negative value is
        below them; read as uint16 the negative ones order by |a| above every positive one. So the
        int16 maximum is the largest positive value, the uint16 maximum the most negative one, and
        each zone end is one comparison of the patterns.
        """
        signed = u.view(np.int16)
        top_pos, top_neg = int(signed.max()), int(u.max())  # patterns: largest a > 0 (if any), largest |a| of a < 0
        if top_pos >= self.inf16 or top_neg >= self.inf16 | _SIGN16:
            return False
        tops = [np.array(v, np.uint16).view(self.fmt) for v, ok in ((top_pos, top_pos >= 0), (top_neg & ~_SIGN16, top_neg >= _SIGN16)) if ok]
        self._top(float(max(tops)))
        mask = self.mask[:u.size]
        for i, (up, down) in enumerate(self.bound_bits):
            if top_pos >= up:  # only a chunk that reaches the zone is compared value by value
                self.above[i] += int(np.count_nonzero(np.greater_equal(signed, up.view(np.int16), out=mask)))
            if top_neg >= down:
                self.below[i] += int(np.count_nonzero(np.greater_equal(u, down, out=mask)))
        return True

    def _add_float(self, x: np.ndarray) -> bool:
        """A chunk by its values; True when it held NaN."""
        hi, lo = x.max(), x.min()
        nan = False
        if math.isfinite(hi) and math.isfinite(lo):
            self._top(max(float(hi), -float(lo)))
        else:  # NaN (max and min pass it on) or ±inf in this chunk: rare, sorted out value by value
            nans = int(np.count_nonzero(np.isnan(x)))
            self.nan, nan = self.nan + nans, nans > 0
            self.pos_inf += int(np.count_nonzero(x == np.inf))
            self.neg_inf += int(np.count_nonzero(x == -np.inf))
            finite = x[np.isfinite(x)]
            if finite.size:
                self._top(float(np.abs(finite).max()))
            hi, lo = np.inf, -np.inf  # compare every value below
        mask = self.mask[:x.size]
        for i, (up, down) in enumerate(self.bounds):
            if hi >= up:  # only a chunk that reaches the zone is compared value by value
                self.above[i] += int(np.count_nonzero(np.greater_equal(x, up, out=mask)))
            if lo <= down:
                self.below[i] += int(np.count_nonzero(np.less_equal(x, down, out=mask)))
        return nan

    def _top(self, top: float) -> None:
        self.max_abs = top if self.max_abs is None else max(self.max_abs, top)


def _key_range(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The magnitudes [low, high) each bin key stands for (the +inf key: [inf, inf])."""
    magnitude = (keys & 0xFFFF).astype(np.uint32)
    low = (magnitude << _KEY_SHIFT).view(np.float32).astype(np.float64)
    with np.errstate(invalid="ignore"):  # past the +inf key the patterns are NaN
        high = ((magnitude + 1) << _KEY_SHIFT).view(np.float32).astype(np.float64)
    return low, np.where(np.isinf(low), np.inf, high)


def _edges(top: float) -> np.ndarray:
    """BINS_PER_SIDE + 1 magnitude edges from 0 to top, each on a bin boundary of 9 significant bits,
    so that every bin of the wider formats' multiset falls inside one of them."""
    top = min(top, float(np.finfo(np.float64).max))  # 1.05 × float64's largest: inf, whose linspace is NaN
    with np.errstate(over="ignore"):  # past float32's range: inf, as the float32 keys of such values are
        raw = np.linspace(0.0, top, BINS_PER_SIDE + 1).astype(np.float32).view(np.uint32)
    half = np.uint32(1 << (_KEY_SHIFT - 1))
    return (((raw + half) >> _KEY_SHIFT) << _KEY_SHIFT).view(np.float32).astype(np.float64)


