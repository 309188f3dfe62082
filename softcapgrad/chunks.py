"""Elementwise work on large CPU tensors, one cache-sized chunk at a time.

A chain of k elementwise torch operations over a tensor of n values reads and writes memory k
times and allocates k tensors of n values. Run over chunks of ``CHUNK`` values instead, the chain
works in the processor's caches on a few chunk-sized scratch buffers, and only the final result
is a full-size tensor. Chunks stay below torch's parallel grain, so each operation runs on the
calling thread without waking the thread pool (on a loaded machine that wake-up costs more than
the chunk's arithmetic).
"""

from __future__ import annotations

from typing import Iterator

import torch

CHUNK = 1 << 14  # values per chunk: 64 KiB of fp32, below torch's parallel grain of 32,768


def rows_view(t: torch.Tensor, width: int) -> torch.Tensor:
    """``t`` as (rows, width) without a copy where one exists: contiguous, or a single value
    broadcast to every position (the gradient ``loss.sum().backward()`` sends); else a copy."""
    rows = t.numel() // width if width else 0
    if t.is_contiguous():
        return t.view(rows, width)
    if all(stride == 0 for stride in t.stride()):
        return t.as_strided((rows, width), (0, 0))
    return t.reshape(rows, width)


def flat_view(t: torch.Tensor) -> torch.Tensor:
    """``t`` as one row of values, without a copy where :func:`rows_view` finds one."""
    return rows_view(t, t.numel())[0] if t.numel() else t.reshape(-1)


def row_spans(rows: int, width: int, chunk: int = CHUNK) -> Iterator[slice]:
    """Slices of whole rows, about ``chunk`` values each, a multiple of 32 rows when a row is short
    (so a chunk never ends inside a vector of torch's kernels unless the tensor does)."""
    step = max(1, chunk // max(width, 1))
    if step >= 32:
        step -= step % 32
    for start in range(0, rows, step):
        yield slice(start, start + step)


def scratch(rows: int, width: int, dtype: torch.dtype = torch.float32, chunk: int = CHUNK) -> torch.Tensor:
    """A buffer for one chunk of :func:`row_spans`."""
    step = next(iter(row_spans(rows, width, chunk)), slice(0, 0)).stop
    return torch.empty(min(step, rows), width, dtype=dtype)
