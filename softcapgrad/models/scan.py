"""Audit: do real pre-cap values reach the dead zone?

One pass over the data answers every requested path at once. Each tensor is memory-mapped and
read in chunks of ``CHUNK`` values: ``.npy`` and ``.safetensors`` at the byte offsets their headers
record (numpy's header reader; the safetensors library opens and validates the file first),
``.pt`` through ``torch.load(weights_only=True, mmap=True)``. Nothing is unpickled, and nothing
grows with the file but the page cache: the scan's own memory is its tally and a few chunks.

Per tensor and path it counts the values whose gradient through the path is exactly 0: rounded
to the path's scores format as torch converts them (float64 data goes through float32, as torch
does), at or past the path's first zero-gradient input on the positive side, or at or below it on
the negative side. A tanh cap dies symmetrically; a scaled sigmoid's gradient dies on the
positive side once σ rounds to 1, and on the negative side only where σ itself underflows, which
:func:`dead_zones` finds by searching the format's negative values rather than assuming. ±inf
are counted (their gradient is 0), NaN is counted apart.

The counts, the NaN and ±inf counts and the largest finite |a| are exact over every value; a
chunk whose extremes stay outside a zone is not compared value by value. The attenuation
quantiles and the histogram come from bins of 9 significant bits (one bfloat16 value each) of
every value of a tensor up to ``SAMPLE_FROM`` values, and of every k-th value beyond, k a prime
from ``SAMPLE_STEPS`` (no power-of-two period in the data lines up with it).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterator

import ml_dtypes
import numpy as np

from softcapgrad.laws import formats
from softcapgrad.core import progress
from softcapgrad.laws.saturation import sech2
from softcapgrad.core.checks import InputError
from softcapgrad.core.files import readable_file

KINDS = (".npy", ".pt", ".safetensors")
CHUNK = 1 << 18  # values per read
SAMPLE_FROM = 1 << 24  # tensors above this many values feed every k-th value to the bins, k from SAMPLE_STEPS
SAMPLE_STEPS = (7, 31, 127)  # primes: no power-of-two period in the data lines up with them
QUANTILES = (0.5, 0.9, 0.99, 0.999)
BINS_PER_SIDE = 12
PROGRESS_BYTES = 256 << 20  # files above this show progress (when the command line draws it)
_KEY_SHIFT = 15  # a float32 bit pattern >> 15: sign, exponent and 8 mantissa bits (9 significant bits)


# --- where each path's gradient is 0 ------------------------------------------------------------


@dataclass(frozen=True)
class DeadZone:
    """Where one implementation path's gradient is exactly 0, in pre-cap units.

    ``first_zero``: the smallest a > 0 with a zero gradient (inf: none); ``first_zero_below``: the
    negative a of smallest |a| with a zero gradient (−inf: none). ``scores``: the format the path
    rounds the pre-cap values to before the cap (a name ``formats.resolve`` accepts).
    """

    path: str
    scores: str
    first_zero: float
    first_zero_below: float

    @property
    def one_sided(self) -> bool:
        return self.first_zero_below != -self.first_zero


def dead_zones(names: list[str], c: float, scores: str | None = None) -> list[DeadZone]:
    """Both ends of each real stack's dead zone at cap c (``stacks.dead_zone``): an old recipe name fixes the
    scores format, a stack takes ``scores`` (default: its first format). Live stacks search the negative side too."""
    from softcapgrad.stacks import registry as stacks

    return [from_stack(stacks.dead_zone(name, c, scores), name) for name in names]


def from_stack(zone, label: str | None = None) -> DeadZone:
    """A ``stacks.DeadZone`` (a real stack's zone, measured or recorded) as the scan's: a side it
    does not know (None) counts nothing. ``label``: the name the user gave (an old recipe name keeps it)."""
    from softcapgrad.stacks.registry import ALIASES

    name = label.strip().lower() if label and label.strip().lower() in ALIASES else zone.path
    return DeadZone(name, zone.scores, math.inf if zone.above is None else zone.above,
                    -math.inf if zone.below is None else zone.below)


# --- reading -------------------------------------------------------------------------------------

# safetensors dtype names -> numpy formats (packed 4- and 6-bit types are refused)
_SAFETENSORS = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
                "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2,
                "F8_E8M0": ml_dtypes.float8_e8m0fnu}


@dataclass(frozen=True)
class Source:
    """One named tensor of a file: its stored format, size, and its values chunk by chunk."""

    name: str
    dtype: str  # the stored format, e.g. "bfloat16", "float32", "int64"
    numel: int
    nbytes: int
    reader: Callable[[], list[Callable[[], np.ndarray]]]  # one loader per chunk of CHUNK values (native byte order)
    implicit_zeros: int = 0  # a sparse tensor's values that are not stored

    @property
    def fmt(self) -> np.dtype | None:
        """The floating-point format of the values, None when they are not floating-point."""
        if self.dtype in formats.FORMAT_NAMES:
            return formats.resolve(self.dtype)
        try:
            fmt = np.dtype(self.dtype)
        except TypeError:  # a torch-only type (qint8...)
            return None
        return fmt if fmt.kind == "f" else None

    def chunks(self) -> list[Callable[[], np.ndarray]]:
        """A loader per chunk, in order: chunk i holds values i·CHUNK onwards; any order of loading works."""
        return self.reader()


def _numpy_format(dtype: np.dtype, stored_as: str | None, name: str) -> np.dtype:
    """The format of stored data; ml_dtypes arrays saved with np.save lose theirs ('V2', 'V1')."""
    if dtype.fields is not None:
        raise InputError(f"{name}: a structured array ({dtype}), not one tensor of numbers")
    if dtype.kind != "V":
        return dtype.newbyteorder("=") if dtype.byteorder not in "=|" else dtype
    if stored_as:
        fmt = formats.resolve(stored_as)
        if fmt.itemsize != dtype.itemsize:
            raise InputError(f"--stored-as {stored_as}: {fmt.name} has {fmt.itemsize}-byte values, {name} holds {dtype.itemsize}-byte ones")
        return fmt
    if dtype.itemsize == 2:  # bfloat16 is the only 2-byte format numpy does not know
        return np.dtype(ml_dtypes.bfloat16)
    raise InputError(f"{name}: {dtype.itemsize}-byte values of an unnamed format (an ml_dtypes array saved by np.save); "
                     "name it with --stored-as, e.g. --stored-as fp8_e4m3fn")


def _mapped_chunks(path: Path, offset: int, count: int, stored: np.dtype, fmt: np.dtype) -> list[Callable[[], np.ndarray]]:
    """``count`` values of ``stored`` from byte ``offset``, memory-mapped, as chunks of ``fmt`` in native byte order."""
    if not count:
        return []
    data = np.memmap(path, dtype=stored, mode="r", offset=offset, shape=(count,))

    def load(start: int) -> np.ndarray:
        part = data[start:start + CHUNK]
        return part.view(fmt) if stored.kind == "V" else part.astype(fmt, copy=False)

    return [functools.partial(load, start) for start in range(0, count, CHUNK)]


def _npy_header(path: Path) -> tuple[tuple[int, ...], np.dtype, int]:
    """Shape, stored format and data offset of a .npy file, by numpy's header reader. A descriptor
    numpy cannot read back ('<f1': what np.save writes for some ml_dtypes formats) is read as raw
    bytes of that size: the header is the same Python literal numpy parses (ast.literal_eval)."""
    import ast

    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        try:
            shape, _, dtype = read(f)
            return shape, dtype, f.tell()
        except ValueError:
            f.seek(6 + 2)
            length = int.from_bytes(f.read(2 if version == (1, 0) else 4), "little")
            header = ast.literal_eval(f.read(length).decode("latin1"))
            descr = header["descr"]
            if not (isinstance(descr, str) and descr[-1:].isdigit()):
                raise
            return tuple(header["shape"]), np.dtype(f"V{int(descr.lstrip('<>|=')[1:])}"), f.tell()


def _npy_sources(path: Path, stored_as: str | None) -> list[Source]:
    shape, dtype, offset = _npy_header(path)
    if dtype.hasobject:
        raise InputError(f"{path}: holds Python objects, not numbers")
    fmt = _numpy_format(dtype, stored_as, str(path))
    numel = math.prod(shape)
    if path.stat().st_size < offset + numel * dtype.itemsize:
        raise InputError(f"{path}: the file ends before its data does")
    return [Source("array", fmt.name, numel, numel * dtype.itemsize,
                   lambda: _mapped_chunks(path, offset, numel, dtype, fmt))]


def _safetensors_sources(path: Path) -> list[Source]:
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:  # the library validates header and offsets
        names = list(f.keys())
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    out = []
    for name in names:
        entry = header[name]
        numel = math.prod(entry["shape"])
        begin, end = entry["data_offsets"]
        kind = entry["dtype"]
        if kind not in _SAFETENSORS:  # integers, booleans, packed 4- and 6-bit floats: listed, not read
            out.append(Source(name, kind, numel, 0, list))
            continue
        fmt = np.dtype(_SAFETENSORS[kind])
        offset = 8 + size + begin
        out.append(Source(name, fmt.name, numel, end - begin,
                          lambda offset=offset, numel=numel, fmt=fmt: _mapped_chunks(path, offset, numel, fmt, fmt)))
    return out


def _tensor_chunks(t) -> Iterator:
    """Chunks of at most CHUNK values of a tensor, as flat views where it is contiguous."""
    if t.is_contiguous():
        flat = t.reshape(-1)
        for start in range(0, flat.numel(), CHUNK):
            yield flat[start:start + CHUNK]
    elif t.dim() == 0:
        yield t.reshape(1)
    else:
        step = max(1, CHUNK // max(1, t[0].numel()))
        for start in range(0, t.shape[0], step):
            yield from _tensor_chunks(t[start:start + step] if step > 1 else t[start])


def _torch_format(t) -> np.dtype | None:
    name = str(t.dtype).removeprefix("torch.")
    return formats.resolve(name) if t.is_floating_point() and name in formats.FORMAT_NAMES else None


def _as_numpy(chunk, fmt: np.dtype) -> np.ndarray:
    """A torch chunk as a numpy array of the same values, without a copy (ml_dtypes formats by their bits)."""
    import torch

    if fmt.type.__module__ == "numpy":
        return chunk.numpy()
    return chunk.view({1: torch.uint8, 2: torch.uint16}[fmt.itemsize]).numpy().view(fmt)


def _torch_source(name: str, t) -> Source:
    import torch

    implicit = 0
    if t.layout != torch.strided:
        values = t.coalesce().values() if t.is_sparse else t.values()
        implicit, t = t.numel() - values.numel(), values
    fmt = _torch_format(t)
    if fmt is None:  # not floating-point: listed, never read
        return Source(name, str(t.dtype).removeprefix("torch."), t.numel(), 0, list)
    return Source(name, fmt.name, t.numel() + implicit, t.numel() * t.element_size(),
                  lambda: [functools.partial(_as_numpy, c, fmt) for c in _tensor_chunks(t)], implicit)


def _flatten(obj, prefix: str = "") -> Iterator[tuple[str, object]]:
    import torch

    if isinstance(obj, torch.Tensor):
        yield prefix or "tensor", obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _flatten(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _flatten(v, f"{prefix}.{i}" if prefix else str(i))


def _torch_sources(path: Path) -> list[Source]:
    import torch

    obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    tensors = list(_flatten(obj))
    if not tensors:
        raise InputError(f"{path}: holds no tensors")
    return [_torch_source(name, t) for name, t in tensors]


def open_sources(path: Path, stored_as: str | None = None) -> list[Source]:
    kind = readable_file(path, KINDS)
    try:
        if kind == ".npy":
            return _npy_sources(path, stored_as)
        if kind == ".pt":
            return _torch_sources(path)
        return _safetensors_sources(path)
    except InputError:
        raise
    except Exception as err:  # any reader failure is the user's file, not our bug
        raise InputError(f"{path}: cannot read as {kind}: {str(err).splitlines()[0] if str(err) else type(err).__name__}") from None


def select(sources: list[Source], keys: list[str] | None, path: Path) -> list[Source]:
    """The tensors to scan: those named (which must be floating-point), else every floating-point one."""
    if not sources:
        raise InputError(f"{path}: holds no tensors")
    if keys:
        names = {s.name: s for s in sources}
        missing = [k for k in keys if k not in names]
        if missing:
            raise InputError(f"{path}: no tensor named {', '.join(map(repr, missing))}; it holds {', '.join(names)}")
        chosen = [names[k] for k in keys]
    else:
        chosen = [s for s in sources if s.fmt is not None]
    rejected = [s for s in (chosen if keys else sources) if s.fmt is None]
    if keys and rejected or not chosen:
        s = (rejected or sources)[0]
        raise InputError(f"tensor {s.name!r} holds {s.dtype}, not floating-point data")
    return chosen


# --- one pass: the tally -------------------------------------------------------------------------


def _to_scores(values: np.ndarray, scores: str) -> np.ndarray:
    """Values converted to the scores format as torch converts them, as float64 (float64 goes through float32)."""
    import torch

    target = formats.torch_dtype(formats.resolve(scores))
    x = torch.from_numpy(np.ascontiguousarray(values))
    return (x if target is None else x.to(target)).double().numpy()


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

    def finish(self, source: Source, c: float) -> "Scan":
        self.count += source.implicit_zeros - self.nan
        if source.implicit_zeros:  # a sparse tensor's missing values: zeros, sampled like the rest
            self.keys.add(np.zeros(-(-source.implicit_zeros // self.step), np.float32))
            self.max_abs = max(self.max_abs or 0.0, 0.0)
        keys, counts = self.keys.counts()
        low, high = _key_range(keys)
        return _summarise(self, source, c, low, high, (keys >> 16).astype(bool), counts)


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
    raw = np.linspace(0.0, top, BINS_PER_SIDE + 1).astype(np.float32).view(np.uint32)
    half = np.uint32(1 << (_KEY_SHIFT - 1))
    return (((raw + half) >> _KEY_SHIFT) << _KEY_SHIFT).view(np.float32).astype(np.float64)


@dataclass(frozen=True)
class Scan:
    name: str
    dtype: str
    count: int  # values that are not NaN (±inf included; a sparse tensor's implicit zeros included)
    nan_count: int
    inf_count: int
    max_abs: float | None  # largest finite |a|; None when there is none
    beyond: list[dict]  # {"path", "first_zero_grad_input", "first_zero_grad_input_below", "one_sided", "count", "above", "below", "fraction"}
    attenuation_quantiles: list[dict]  # {"q", "abs_a", "attenuation"}; empty when there are no values
    histogram: list[dict]  # {"a_over_c", "fraction", "bar", "past"}, most negative bin first
    sample_step: int  # the distribution took every sample_step-th value (1: every value)


def _summarise(t: _Tally, source: Source, c: float, low: np.ndarray, high: np.ndarray, negative: np.ndarray,
               counts: np.ndarray) -> Scan:
    """Counts, quantiles and histogram from a multiset of values (low = high) or of bins of |a| in
    [low, high), each with its sign."""
    n = t.count
    zones = [{"path": z.path, "first_zero_grad_input": z.first_zero, "first_zero_grad_input_below": z.first_zero_below,
              "one_sided": z.one_sided, "count": a + b, "above": a, "below": b, "fraction": (a + b) / n if n else None}
             for z, a, b in zip(t.zones, t.above, t.below)]
    magnitude, lower = np.abs(high), np.abs(low)  # upper and lower end of each entry's |a|
    order = np.argsort(magnitude, kind="stable")
    cumulative = np.cumsum(counts[order])
    total = int(cumulative[-1]) if cumulative.size else 0
    quantiles = []
    for q in QUANTILES if total else ():  # the attenuation exceeded by a fraction q of values: |a| at the q-quantile
        abs_a = float(magnitude[order][int(np.searchsorted(cumulative, q * total))])
        quantiles.append({"q": q, "abs_a": abs_a, "attenuation": float(sech2(np.float64(abs_a / c)))})
    reachable = [abs(x) for z in t.zones for x in (z.first_zero, z.first_zero_below) if math.isfinite(x)]
    edges = _edges(1.05 * max(t.max_abs or 0.0, min(reachable, default=0.0)) or 1.0)
    ring = np.clip(np.searchsorted(edges, lower, side="right") - 1, 0, BINS_PER_SIDE - 1)
    side = np.where(negative, BINS_PER_SIDE - 1 - ring, BINS_PER_SIDE + ring)  # negative side mirrored
    per_bin = np.bincount(side, weights=counts, minlength=2 * BINS_PER_SIDE)
    peak = max(float(per_bin.max()), 1.0)
    histogram = []
    for j, k in enumerate(per_bin):
        inner, outer = (edges[BINS_PER_SIDE - 1 - j], edges[BINS_PER_SIDE - j]) if j < BINS_PER_SIDE else (edges[j - BINS_PER_SIDE], edges[j - BINS_PER_SIDE + 1])
        lo, hi = (-outer, -inner) if j < BINS_PER_SIDE else (inner, outer)
        past = [z.path for z in t.zones if (hi > z.first_zero if j >= BINS_PER_SIDE else lo < z.first_zero_below)]
        histogram.append({"a_over_c": f"{_two_places(lo / c)}–{_two_places(hi / c)}", "fraction": float(k) / total if total else None,
                          "bar": "█" * int(round(30 * k / peak)), "past": ", ".join(past)})
    return Scan(name=source.name, dtype=source.dtype, count=n, nan_count=t.nan, inf_count=t.pos_inf + t.neg_inf,
                max_abs=t.max_abs, beyond=zones, attenuation_quantiles=quantiles, histogram=histogram, sample_step=t.step)


def _two_places(v: float) -> str:
    text = f"{v:.2f}"
    return "0.00" if text == "-0.00" else text


def _buffers() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scratch for every tensor of a scan: sampled keys, a chunk as float32, a chunk's comparison."""
    return np.empty(1 << 20, dtype=np.intp), np.empty(CHUNK, dtype=np.float32), np.empty(CHUNK, dtype=bool)


def scan_sources(sources: list[Source], c: float, zones: list[DeadZone], label: str = "") -> list[Scan]:
    """One pass over each tensor's values, every zone counted from it; progress for large inputs.

    Memory: the tally and a few chunks of scratch, whatever the file (its pages are the page cache's).
    """
    total = sum(s.nbytes for s in sources)
    buffers = _buffers()
    shown = progress.task(f"scanning {label}", total) if total > PROGRESS_BYTES else contextlib.nullcontext(lambda n=1.0: None)
    scans = []
    with shown as advance:
        for src in sources:
            tally = _Tally(zones, src.fmt, src.numel, buffers)
            for i, load in enumerate(src.chunks()):
                x = load()
                tally.add(x, i * CHUNK)
                advance(x.nbytes)
            scans.append(tally.finish(src, c))
    return scans


def scan_answer(path: Path, c: float, scans: list[Scan], zones: list[DeadZone]) -> tuple[str, ...]:
    n = sum(s.count for s in scans)
    if not n:
        return (f"{path.name} holds no values to scan (empty or all NaN): nothing lies in a dead zone.",)
    sentences = []
    for i, z in enumerate(zones):
        dead = sum(s.beyond[i]["count"] for s in scans)
        where = f"a ≥ {z.first_zero:g}" if math.isfinite(z.first_zero) else ""
        if math.isfinite(z.first_zero_below):
            where += (" or " if where else "") + f"a ≤ {z.first_zero_below:g}"
        sentences.append(f"{dead:,} of {n:,} values ({dead / n:.3g}) lie where {z.path} ({z.scores} scores, c = {c:g}) "
                         f"returns an exactly zero gradient ({where or 'nowhere in the format'}).")
    if len(sentences) > 2:
        sentences = [f"{len(zones)} paths at c = {c:g}: " + "; ".join(
            f"{z.path} {sum(s.beyond[i]['count'] for s in scans):,}" for i, z in enumerate(zones))
            + f" of {n:,} values lie in the dead zone."]
    worst = max(scans, key=lambda s: (max((b["count"] for b in s.beyond), default=0), s.max_abs or 0.0))
    if worst.max_abs is not None:
        sentences.append(f"The largest |a| is {max(s.max_abs or 0.0 for s in scans):.6g} "
                         f"({max(s.max_abs or 0.0 for s in scans) / c:.3g}c)"
                         + (f"; the most dead values are in {worst.name!r}." if len(scans) > 1 else "."))
    return tuple(sentences)


def scan_report(path: Path, c: float, path_names: list[str], keys: list[str] | None, stored_as: str | None = None,
                scores: str | None = None):
    from softcapgrad.core.report import Report, Table

    sources = select(open_sources(path, stored_as), keys, path)
    zones = dead_zones(path_names, c, scores)
    scans = scan_sources(sources, c, zones, path.name)
    rows = [{"name": s.name, "dtype": s.dtype, "count": s.count, "nan_count": s.nan_count, "inf_count": s.inf_count,
             "max_abs": s.max_abs, "sampled_every": s.sample_step} for s in scans]
    dead = [{"name": s.name, "path": b["path"], "scores": z.scores, "first_zero_grad_input": b["first_zero_grad_input"],
             "first_zero_grad_input_below": b["first_zero_grad_input_below"], "count": b["count"], "above": b["above"],
             "below": b["below"], "fraction": b["fraction"]} for s in scans for z, b in zip(zones, s.beyond)]
    quantiles = [{"name": s.name, **q} for s in scans for q in s.attenuation_quantiles]
    shown = max(scans, key=lambda s: (max((b["count"] for b in s.beyond), default=0), s.count), default=None)
    tables = [
        Table("rows", f"{path.name}: the tensors scanned", rows, ("name", "dtype", "count", "max_abs"),
              wide=("nan_count", "inf_count", "sampled_every")),
        Table("dead", f"values in each path's dead zone (cap {c:g})", dead,
              ("name", "path", "first_zero_grad_input", "count", "fraction"), wide=("scores", "above", "below",
                                                                                  "first_zero_grad_input_below")),
        Table("quantiles", "attenuation sech²(a/c) at quantiles of |a|: a fraction 1 − q of values is attenuated more",
              quantiles, ("name", "q", "abs_a", "attenuation")),
        Table("histograms", "", [{"name": s.name, "bins": s.histogram} for s in scans], show=False),
    ]
    if shown is not None and shown.count:
        tables.append(Table("histogram", f"{shown.name}: share of values per a/c bin (the tensor with the most dead "
                                         "values; --json has every tensor's)", shown.histogram, json=False))
    sampled = [s for s in scans if s.sample_step > 1]
    notes = ["a value counts as dead when, rounded to the path's scores format, it lies at or past the path's first "
             "zero-gradient input (on the negative side: at or below the first one there)"]
    notes += [f"{z.path}: one-sided; its gradient dies past {z.first_zero:g} and only below {z.first_zero_below:g}"
              for z in zones if z.one_sided]
    if sampled:
        notes.append("quantiles and histograms from every k-th value (k = " + ", ".join(
            f"{s.sample_step} for {s.name}" for s in sampled) + "); the counts are over every value")
    if any(not s.count for s in scans):
        notes.append("no finite values in: " + ", ".join(s.name for s in scans if not s.count))
    return Report(
        command="scan",
        params={"file": str(path), "cap": c, "paths": path_names, "scores": scores, "keys": keys},
        answer=scan_answer(path, c, scans, zones),
        tables=tuple(tables),
        notes=tuple(notes),
        figures={"zones": [{"path": z.path, "scores": z.scores, "first_zero_grad_input": z.first_zero,
                            "first_zero_grad_input_below": z.first_zero_below} for z in zones]},
    )
