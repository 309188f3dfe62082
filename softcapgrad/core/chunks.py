"""Elementwise work on large CPU tensors, one cache-sized chunk at a time.

A chain of k elementwise torch operations over a tensor of n values reads and writes memory k
times and allocates k tensors of n values. Run over chunks of ``CHUNK`` values instead, the chain
works in the processor's caches on a few chunk-sized scratch buffers, and only the final result
is a full-size tensor. Chunks stay below torch's parallel grain, so each operation runs on the
thread that calls it without waking torch's thread pool: on a loaded machine that wake-up, once
per operation, costs more than the chunk's arithmetic. The chunks are shared out instead, in
contiguous runs, among as many Python threads as torch would use (torch leaves the GIL while it
computes), which meet once, at the end.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator, TypeVar

import torch

T = TypeVar("T")

CHUNK = 1 << 14  # values per chunk: 64 KiB of fp32, below torch's parallel grain of 32,768
MIN_SHARE = 16  # chunks a thread takes at the least: a smaller tensor stays on one thread
_pool: ThreadPoolExecutor | None = None


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


def each_share(rows: int, width: int, work: Callable[[list[slice]], T]) -> list[T]:
    """``work(spans)`` on contiguous shares of :func:`row_spans`, one per thread, as many threads as
    ``torch.get_num_threads()`` allows with at least MIN_SHARE chunks each; the calling thread takes
    the first share. Gradients are off in every thread. The results come back in share order."""
    global _pool
    spans = list(row_spans(rows, width))
    threads = max(1, min(torch.get_num_threads(), len(spans) // MIN_SHARE))
    size = max(1, -(-len(spans) // threads))  # an empty tensor has no span: one share, of none
    shares = [spans[i:i + size] for i in range(0, len(spans), size)] or [[]]
    if len(shares) == 1:
        return [work(shares[0])]

    def quiet(share: list[slice]) -> T:
        with torch.no_grad():
            return work(share)

    if _pool is None or _pool._max_workers < len(shares) - 1:
        _pool = ThreadPoolExecutor(max_workers=len(shares) - 1, thread_name_prefix="softcapgrad-chunks")
    others = [_pool.submit(quiet, share) for share in shares[1:]]
    first = quiet(shares[0])
    return [first, *(f.result() for f in others)]
