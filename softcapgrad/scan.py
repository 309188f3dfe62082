"""Audit: do real pre-cap values reach the dead zone?

Reads tensors from ``.npy`` (numpy, memory-mapped), ``.pt`` (torch, weights only, memory-mapped)
or ``.safetensors`` (the safetensors library, sliced), one chunk at a time, and reports per tensor
how many values lie at or past each path's first zero-gradient input, the largest |a|, the
attenuation sech²(a/c) at chosen quantiles, and a histogram of |a|/c.

Values are rounded to the path's scores format before the comparison, as the model would.
Quantiles come from a 65,536-bin histogram of |a| (exact to one bin width).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from softcapgrad import paths
from softcapgrad.attenuation import sech2
from softcapgrad.checks import InputError
from softcapgrad.files import readable_file

KINDS = (".npy", ".pt", ".safetensors")
CHUNK = 1 << 20  # values per chunk
QUANTILE_BINS = 1 << 16
QUANTILES = (0.5, 0.9, 0.99, 0.999)


def _flat_chunks(t, n: int) -> Iterator[torch.Tensor]:
    flat = t.reshape(-1)
    for start in range(0, n, CHUNK):
        part = flat[start:start + CHUNK]
        yield torch.from_numpy(np.array(part)) if isinstance(part, np.ndarray) else part  # copy: a memmap is read-only


@dataclass(frozen=True)
class Source:
    """One named tensor of a file: its dtype, size, and a way to read it chunk by chunk."""

    name: str
    dtype: str
    numel: int
    reader: object  # callable returning an iterator of torch chunks

    def chunks(self) -> Iterator[torch.Tensor]:
        return self.reader()


def open_sources(path: Path) -> list[Source]:
    kind = readable_file(path, KINDS)
    try:
        if kind == ".npy":
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
            return [Source("array", str(arr.dtype), int(arr.size), lambda: _flat_chunks(arr, int(arr.size)))]
        if kind == ".pt":
            return _torch_sources(path)
        return _safetensors_sources(path)
    except InputError:
        raise
    except Exception as err:  # any reader failure is the user's file, not our bug
        raise InputError(f"{path}: cannot read as {kind}: {str(err).splitlines()[0] if str(err) else type(err).__name__}") from None


def _torch_sources(path: Path) -> list[Source]:
    obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    tensors = {"tensor": obj} if isinstance(obj, torch.Tensor) else obj
    if not isinstance(tensors, dict) or not all(isinstance(v, torch.Tensor) for v in tensors.values()):
        raise InputError(f"{path}: expected a tensor or a dict of tensors")
    return [Source(str(k), str(v.dtype).replace("torch.", ""), v.numel(), lambda v=v: _flat_chunks(v, v.numel()))
            for k, v in tensors.items()]


def _safetensors_sources(path: Path) -> list[Source]:
    from safetensors import safe_open

    out = []
    with safe_open(str(path), framework="pt") as f:
        for name in f.keys():
            sl = f.get_slice(name)
            shape = sl.get_shape()
            numel = int(np.prod(shape)) if shape else 1
            rows = shape[0] if shape else 1
            per_row = max(1, numel // max(rows, 1))

            def read(name=name, rows=rows, per_row=per_row, scalar=not shape) -> Iterator[torch.Tensor]:
                with safe_open(str(path), framework="pt") as g:
                    if scalar:
                        yield g.get_tensor(name).reshape(-1)
                        return
                    step = max(1, CHUNK // per_row)
                    s = g.get_slice(name)
                    for start in range(0, rows, step):
                        yield s[start:start + step].reshape(-1)

            out.append(Source(name, sl.get_dtype(), numel, read))
    return out


def select(sources: list[Source], keys: list[str] | None, path: Path) -> list[Source]:
    if not keys:
        return sources
    names = {s.name: s for s in sources}
    missing = [k for k in keys if k not in names]
    if missing:
        raise InputError(f"{path}: no tensor named {', '.join(map(repr, missing))}; it holds {', '.join(names)}")
    return [names[k] for k in keys]


@dataclass(frozen=True)
class Scan:
    name: str
    dtype: str
    count: int
    nan_count: int
    max_abs: float
    beyond: list[dict]  # {"path", "first_zero_grad_input", "count", "fraction"}
    attenuation_quantiles: list[dict]  # {"q", "attenuation"}: the attenuation that a fraction q of values exceeds
    histogram: list[dict]


def scan_source(src: Source, c: float, horizons: dict[str, float], bins: int = 12) -> Scan:
    """Two passes over the chunks: the largest |a| first, then counts and histograms."""
    max_abs, nan_count = 0.0, 0
    for chunk in src.chunks():
        if not chunk.is_floating_point():
            raise InputError(f"tensor {src.name!r} holds {chunk.dtype}, not floating-point data")
        finite = chunk[~torch.isnan(chunk)]
        nan_count += chunk.numel() - finite.numel()
        if finite.numel():
            max_abs = max(max_abs, float(finite.abs().max()))
    reachable = [h for h in horizons.values() if h < float("inf")]
    top = 1.05 * max(max_abs, min(reachable, default=0.0)) or 1.0
    fine = np.zeros(QUANTILE_BINS, dtype=np.int64)
    coarse = np.zeros(bins, dtype=np.int64)
    beyond = dict.fromkeys(horizons, 0)
    for chunk in src.chunks():
        finite = chunk[~torch.isnan(chunk)]
        for name, first_zero in horizons.items():
            scores = getattr(torch, paths.RECIPES[name].scores)
            beyond[name] += int((finite.to(scores).abs().double() >= first_zero).sum())
        mag = finite.abs().double().numpy()
        fine += np.histogram(mag, bins=QUANTILE_BINS, range=(0.0, max_abs or 1.0))[0]
        coarse += np.histogram(mag / c, bins=bins, range=(0.0, top / c))[0]
    n = src.numel - nan_count
    edges = np.linspace(0.0, max_abs or 1.0, QUANTILE_BINS + 1)
    cumulative = np.cumsum(fine)
    quantiles = []
    for q in QUANTILES:  # the attenuation exceeded by a fraction q of values: |a| at the q-quantile
        i = int(np.searchsorted(cumulative, q * n)) if n else 0
        quantiles.append({"q": q, "abs_a": float(edges[min(i + 1, QUANTILE_BINS)]),
                          "attenuation": float(sech2(edges[min(i + 1, QUANTILE_BINS)] / c))})
    coarse_edges = np.linspace(0.0, top / c, bins + 1)
    peak = max(int(coarse.max()), 1)
    histogram = [
        {"abs_a_over_c": f"{lo:.2f}–{hi:.2f}", "count": int(k), "bar": "█" * int(round(30 * k / peak)),
         "past": ", ".join(p for p, h in horizons.items() if hi * c > h) or ""}
        for lo, hi, k in zip(coarse_edges[:-1], coarse_edges[1:], coarse)
    ]
    return Scan(
        name=src.name, dtype=src.dtype, count=n, nan_count=nan_count, max_abs=max_abs,
        beyond=[{"path": p, "first_zero_grad_input": h, "count": beyond[p], "fraction": beyond[p] / n if n else 0.0}
                for p, h in horizons.items()],
        attenuation_quantiles=quantiles,
        histogram=histogram,
    )


def path_horizons(names: list[str], c: float) -> dict[str, float]:
    """First zero-gradient input of each path at cap c (inf where the path never reaches 0)."""
    out = {}
    for name in names:
        first = paths.first_zero(paths.RECIPES[name], c, paths.Sigmoid()).first_true
        out[name] = first if first is not None else float("inf")
    return out


def scan_report(path: Path, c: float, path_names: list[str], keys: list[str] | None):
    from softcapgrad.report import Report, Table

    sources = select(open_sources(path), keys, path)
    horizons = path_horizons(path_names, c)
    scans = [scan_source(src, c, horizons) for src in sources]
    rows = []
    for s in scans:
        row = {"name": s.name, "dtype": s.dtype, "count": s.count, "nan_count": s.nan_count, "max_abs": s.max_abs}
        for b in s.beyond:
            row[f"beyond_{b['path']}"] = b["count"]
            row[f"fraction_{b['path']}"] = b["fraction"]
        row["attenuation_quantiles"] = {f"q{q['q']:g}": q["attenuation"] for q in s.attenuation_quantiles}
        rows.append(row)
    tables = [Table("rows", f"{path.name}: pre-cap values against each path's horizon (cap {c:g})", rows)]
    for s in scans:
        tables.append(Table(f"histogram:{s.name}", f"{s.name}: |a|/c", s.histogram))
    return Report(
        command="scan",
        params={"file": str(path), "cap": c, "paths": path_names, "keys": keys},
        tables=tuple(tables),
        notes=(
            "beyond_<path>: values whose |a|, rounded to the path's scores format, is at or past its first zero-gradient input",
            "attenuation_quantiles: sech²(a/c) at the q-quantile of |a| — a fraction 1 − q of values is attenuated more",
        ),
        figures={"horizons": horizons},
    )
