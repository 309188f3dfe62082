"""Audit: do real pre-cap values reach the dead zone? (reading: files/tensorfiles; the tally: files/scantally)

One pass over the data answers every requested path at once. Each tensor is read in chunks of
``tensorfiles.CHUNK`` values by plain reads at the byte offsets its file records, never through a
memory map, so a file cut short while it is read is a short read and one line, never a SIGBUS (a
``.pt`` is parsed without unpickling code and its storages are read from the zip; a compressed one is
refused). Nothing grows with the file but the page cache: the scan's own memory is its tally and a
few chunks. Any layout is read: a transposed or strided tensor piece by piece, a saved
``nn.Parameter`` like its tensor. A ``.npy`` or ``.safetensors`` file is read and tallied with numpy
alone; torch is imported only to read a ``.pt`` or to run a stack that only torch measures.

Per tensor and path it counts the values whose gradient through the path is exactly 0: rounded
to the path's scores format as torch converts them (float64 data goes through float32, as torch
does), at or past the path's first zero-gradient input on the positive side, or at or below it on
the negative side. A tanh cap dies symmetrically; a scaled sigmoid's gradient dies on the
positive side once σ rounds to 1, and on the negative side only where σ itself underflows, which
:func:`dead_zones` finds by searching the format's negative values rather than assuming. ±inf
are counted (their gradient is 0), NaN is counted apart. A path with no figure here (a CUDA stack in a format the recording lacks, on a machine without
CUDA) is said to be not measured, with no count; if no path asked for has a figure the scan is
refused rather than answered with zeros.

The counts, the NaN and ±inf counts and the largest finite |a| are exact over every value; a
chunk whose extremes stay outside a zone is not compared value by value. The attenuation
quantiles and the histogram come from bins of 9 significant bits (one bfloat16 value each) of
every value of a tensor up to ``SAMPLE_FROM`` values, and of every k-th value beyond, k a prime
from ``SAMPLE_STEPS`` (no power-of-two period in the data lines up with it).
"""


from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from softcapgrad.core import progress
from softcapgrad.core.checks import InputError
from softcapgrad.laws.saturation import sech2
from softcapgrad.files.scantally import BINS_PER_SIDE, DeadZone, _edges, _key_range, _Tally
from softcapgrad.files import tensorfiles
from softcapgrad.files.tensorfiles import Source, open_sources, select

QUANTILES = (0.5, 0.9, 0.99, 0.999)
PROGRESS_BYTES = 256 << 20  # files above this show progress (when the command line draws it)


# --- where each path's gradient is 0 ------------------------------------------------------------


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
    unknown = zone.reason if zone.source == "not measured" else ""
    return DeadZone(name, zone.scores, math.inf if zone.above is None else zone.above,
                    -math.inf if zone.below is None else zone.below, unknown)


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
             if not z.unknown else
             {"path": z.path, "first_zero_grad_input": None, "first_zero_grad_input_below": None, "one_sided": None,
              "count": None, "above": None, "below": None, "fraction": None, "not_measured": z.unknown}
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


def finish(t: _Tally, source: Source, c: float) -> Scan:
    """The tally of one tensor as its Scan: a sparse tensor's implicit zeros added, bins summarised."""
    t.count += source.implicit_zeros - t.nan
    if source.implicit_zeros:  # a sparse tensor's missing values: zeros, sampled like the rest
        t.keys.add(np.zeros(-(-source.implicit_zeros // t.step), np.float32))
        t.max_abs = max(t.max_abs or 0.0, 0.0)
    keys, counts = t.keys.counts()
    low, high = _key_range(keys)
    return _summarise(t, source, c, low, high, (keys >> 16).astype(bool), counts)


def _two_places(v: float) -> str:
    text = f"{v:.2f}"
    return "0.00" if text == "-0.00" else text


def _buffers() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scratch for every tensor of a scan: sampled keys, a chunk as float32, a chunk's comparison."""
    return np.empty(1 << 20, dtype=np.intp), np.empty(tensorfiles.CHUNK, dtype=np.float32), np.empty(tensorfiles.CHUNK, dtype=bool)


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
            start = 0
            for load in src.chunks():
                x = load()
                tally.add(x, start)
                start += x.size
                advance(x.nbytes)
            scans.append(finish(tally, src, c))
    return scans


def scan_answer(path: Path, c: float, scans: list[Scan], zones: list[DeadZone]) -> tuple[str, ...]:
    n = sum(s.count for s in scans)
    if not n:
        return (f"{path.name} holds no values to scan (empty or all NaN): nothing lies in a dead zone.",)
    sentences = []
    for i, z in enumerate(zones):
        if z.unknown:
            sentences.append(f"{z.path} ({z.scores} scores, c = {c:g}) is not measured: {z.unknown}.")
            continue
        dead = sum(s.beyond[i]["count"] for s in scans)
        where = f"a ≥ {z.first_zero:g}" if math.isfinite(z.first_zero) else ""
        if math.isfinite(z.first_zero_below):
            where += (" or " if where else "") + f"a ≤ {z.first_zero_below:g}"
        sentences.append(f"{dead:,} of {n:,} values ({dead / n:.3g}) lie where {z.path} ({z.scores} scores, c = {c:g}) "
                         f"returns an exactly zero gradient ({where or 'nowhere in the format'}).")
    if len(sentences) > 2:
        known = [(i, z) for i, z in enumerate(zones) if not z.unknown]
        unknown = [z.path for z in zones if z.unknown]
        sentences = [f"{len(zones)} paths at c = {c:g}: " + "; ".join(
            f"{z.path} {sum(s.beyond[i]['count'] for s in scans):,}" for i, z in known)
            + f" of {n:,} values lie in the dead zone." if known else f"{len(zones)} paths at c = {c:g}."]
        if unknown:
            sentences.append(f"Not measured here ({zones[0].scores} scores; no live run and no recording): "
                             f"{', '.join(unknown)}.")
    worst = max(scans, key=lambda s: (max((b["count"] or 0 for b in s.beyond), default=0), s.max_abs or 0.0))
    where = f"; the most dead values are in {worst.name!r}." if len(scans) > 1 else "."
    top = max((s.max_abs for s in scans if s.max_abs is not None), default=None)
    infinite = sum(s.inf_count for s in scans)
    finite_part = "" if top is None else f"{top:.6g} ({top / c:.3g}c)"
    if infinite:
        sentences.append(f"The largest |a| is ∞: {infinite:,} value{'s are' if infinite > 1 else ' is'} ±inf"
                         + (f", and the largest finite |a| is {finite_part}" if finite_part else "") + where)
    elif finite_part:
        sentences.append(f"The largest |a| is {finite_part}{where}")
    return tuple(sentences)


def scan_report(path: Path, c: float, path_names: list[str], keys: list[str] | None, stored_as: str | None = None,
                scores: str | None = None):
    from softcapgrad.core.report import Report, Table

    sources = select(open_sources(path, stored_as), keys, path)
    zones = dead_zones(path_names, c, scores)
    if all(z.unknown for z in zones):  # nothing to count against: an answer of 0 would read as "none dead"
        z = zones[0]
        raise InputError(f"--path {', '.join(path_names)} with {z.scores} scores at c = {c:g} is not measured here: "
                         f"{z.unknown}")
    scans = scan_sources(sources, c, zones, path.name)
    rows = [{"name": s.name, "dtype": s.dtype, "count": s.count, "nan_count": s.nan_count, "inf_count": s.inf_count,
             "max_abs": s.max_abs, "sampled_every": s.sample_step} for s in scans]
    dead = [{"name": s.name, "path": b["path"], "scores": z.scores, "first_zero_grad_input": b["first_zero_grad_input"],
             "first_zero_grad_input_below": b["first_zero_grad_input_below"], "count": b["count"], "above": b["above"],
             "below": b["below"], "fraction": b["fraction"]} for s in scans for z, b in zip(zones, s.beyond)]
    quantiles = [{"name": s.name, **q} for s in scans for q in s.attenuation_quantiles]
    shown = max(scans, key=lambda s: (max((b["count"] or 0 for b in s.beyond), default=0), s.count), default=None)
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
              for z in zones if z.one_sided and not z.unknown]
    notes += [f"{z.path}: not measured ({z.unknown}); its counts are empty, not 0" for z in zones if z.unknown]
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
        figures={"zones": [{"path": z.path, "scores": z.scores,
                            "first_zero_grad_input": None if z.unknown else z.first_zero,
                            "first_zero_grad_input_below": None if z.unknown else z.first_zero_below,
                            "not_measured": z.unknown or None} for z in zones]},
    )

