"""The soft-cap as MLX runs it on its CPU device: ``c·mx.tanh(a/c)`` and its ``mx.vjp``, op by op or under
``mx.compile``, as stacks/runners.py runs the other backends (float64 arrays back, values in fixed batches).
"""

from __future__ import annotations

import functools
from typing import Callable

import numpy as np

from softcapgrad.laws import formats
from softcapgrad.stacks.runners import batched


@functools.cache
def _mlx_gradient_fn(c: float, compiled: bool) -> Callable:
    import mlx.core as mx

    def grad(a, g):
        _, pulled = mx.vjp(lambda x: c * mx.tanh(x / c), [a], [g])
        return pulled[0]

    return mx.compile(grad) if compiled else grad


def _mlx_put(chunk: np.ndarray, dtype: np.dtype):
    """An MLX array of ``dtype`` holding ``chunk`` (values of that format: the cast from fp32 is exact)."""
    import mlx.core as mx

    kind = {"bfloat16": mx.bfloat16, "float16": mx.float16, "float32": mx.float32}[formats.canonical_name(dtype.name)]
    return mx.array(chunk.astype(np.float32)).astype(kind)


def _mlx_read(x) -> np.ndarray:
    import mlx.core as mx

    return np.array(x.astype(mx.float32)).astype(np.float64)


def mlx_gradient(values: np.ndarray, dtype: np.dtype, c: float, *, compiled: bool,
                 upstream: np.ndarray | None = None) -> np.ndarray:
    """d/da of c·mx.tanh(a/c) by mx.vjp on MLX's CPU device, op by op or under mx.compile; ``upstream``: the
    gradient arriving at the cap's output, one per value in ``dtype`` (None: ones)."""
    import mlx.core as mx

    grad = _mlx_gradient_fn(c, compiled)
    with mx.stream(mx.cpu):
        if upstream is None:
            return batched(values, lambda chunk: _mlx_read(grad(_mlx_put(chunk, dtype),
                                                                _mlx_put(np.ones_like(chunk), dtype))))
        a = np.asarray(values, dtype=np.float64).reshape(-1)
        g = np.asarray(upstream, dtype=np.float64).reshape(-1)
        return _mlx_read(grad(_mlx_put(a, dtype), _mlx_put(g, dtype)))


@functools.cache
def _mlx_tanh_fn(compiled: bool) -> Callable:
    import mlx.core as mx

    return mx.compile(mx.tanh) if compiled else mx.tanh


def mlx_saturates(values: np.ndarray, dtype: np.dtype, *, compiled: bool) -> np.ndarray:
    """Whether MLX's tanh returns exactly 1.0 for each value, on its CPU device."""
    import mlx.core as mx

    f = _mlx_tanh_fn(compiled)
    with mx.stream(mx.cpu):
        return batched(values, lambda chunk: _mlx_read(f(_mlx_put(chunk, dtype))) == 1.0) == 1.0
