"""One gate call counted into its site's sums for the step (softmax-softplus-gates.md §5–6), now or when the
watched block closes.

    count      elements through the forward
    closed     y below 1e-3 of the gate's range;  saturated: y stored as exactly 0 or 1 (softplus: 0)
    total      Σ y in float64, for the mean gate;  low, high: the range of the input x
    backward   elements through the backward;      zero: exactly 0 there under a non-zero upstream gradient
    upstream   the call's lower median |upstream gradient| over its non-zero elements (gaterows.upstream_median):
               the gradient the row's stuck-open and stuck-shut inputs are looked up for
    zero_cast  the same count on the gradient the weights see: the gate's gradient cast back through every cast
               between the tensor a layer produced and the gate's input (``casts_back``; Laguna's softplus runs in
               float32 on g_proj's bfloat16 output, so a float32 subnormal σ(x)·g below bf16's least subnormal
               reaches g_proj as 0); equal to zero where no cast lies there

``Later`` keeps the calls of gates of at most ``_SMALL`` elements on the CPU (a head gate of a tiny model) and
counts them when the block closes. Counted where they run, between the model's own kernels, those few reductions
on a handful of elements each ran cold; run back to back at the close they cost less (lfm3's two gates, eager, 2×16,
three paired runs of 600 rounds with the order alternated: 0.04–0.05 ms less per watched step, of an extra of
0.36–0.49 ms, when the calls were counted by reductions; 0.03 ms of 0.27–0.37 ms with the Python floats below).
A kept input remembers its version: one changed in place before the close is not counted from the new values but
given back as missed. Larger gates are counted at once: their passes outweigh the fixed cost, and keeping them
would hold memory.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
from typing import Callable

import torch

from softcapgrad.training.gateheads import add_heads
from softcapgrad.training.gaterows import CLOSED, Step, _closed, _saturated, below, upstream_median
from softcapgrad.training.tally import _SMALL, _zero_grads


def step_of(block: dict, site) -> Step:
    """The site's sums in this block: a Step made at the site's first call only (not one per call, thrown away)."""
    s = block.get(site)
    if s is None:
        s = block[site] = Step()
    return s


def count_forward(s: Step, fn: str, x: torch.Tensor, y: torch.Tensor, heads: int | None = None) -> None:
    """Add the call y = fn(x) to the step's sums; ``heads``: H of a per-head gate (gateheads.py), whose per-head
    sums give the total too."""
    n = y.numel()
    if n == 0:
        return
    s.count += n
    if n <= _LISTED and y.is_cpu:  # one list at a time: the second takes the floats the first gave back
        _range(s, x.reshape(-1).tolist())
        ys = y.reshape(-1).tolist()
        closed = 0 if min(ys) >= CLOSED else below(ys)  # min(ys): NaN, or the least number
        _listed(s, fn, ys, closed)
        if heads:
            s.heads = add_heads(s.heads, y, heads, closed, ys)[0]
        return
    x, y = x.detach(), y.detach()
    low = high = None
    if y.device.type == "cpu":  # one pass for the range, which usually leaves nothing else to count
        low, high = (v.item() for v in torch.aminmax(y))
    closed = _closed(y, low)
    s.closed += closed
    s.saturated += _saturated(fn, y, low, high)
    if heads:  # the per-head sums in place of the whole sum: no pass more than before but the closed heads'
        s.heads, total = add_heads(s.heads, y, heads, closed)
        s.total += total
    else:
        s.total += torch.sum(y, dtype=torch.float64).item()
    low, high = (v.item() for v in torch.aminmax(x))
    s.low, s.high = min(s.low, low), max(s.high, high)


_LISTED = 256  # elements: at most, a call is counted from Python lists of its values (see _listed)


def _listed(s: Step, fn: str, ys: list[float], closed: int) -> None:
    """The same sums from the values as Python floats (``closed``: the call's count below CLOSED): for a small gate,
    reading them out once costs less than the three or four reductions, each run cold between the model's kernels
    (compiled lfm3, two 64-element gates: the watched step's extra fell from about 0.2 to 0.15 ms). The sum is
    math.fsum's, correctly rounded, where torch's float64 sum is within (n − 1)·2⁻⁵³ of it, relatively.

    At most one call's list of floats is alive at a time (the input's range first, then the output's sums; in the
    backward the upstream's median, then the gradient's zeros): a new float taken from memory the step has not
    touched lately costs far more than one the last list just gave back (Laguna's close, in the step: the first
    list of its router's 192 values took 50–90 µs, the same list again 5–10 µs)."""
    s.closed += closed
    s.saturated += ys.count(0.0) + (ys.count(1.0) if fn != "softplus" else 0)
    s.total += math.fsum(ys)


def _range(s: Step, xs: list[float]) -> None:
    """The input's range from its values as Python floats; NaN anywhere makes it NaN, as aminmax's."""
    finite = sum(xs)  # NaN when some x is NaN (or both infinities are there): then look
    low, high = (math.nan, math.nan) if finite != finite and any(v != v for v in xs) else (min(xs), max(xs))
    s.low, s.high = min(s.low, low), max(s.high, high)


def count_backward(s: Step, fn: str, grad_output: torch.Tensor, grad_input: torch.Tensor,
                   casts: tuple[torch.dtype, ...] = ()) -> None:
    """Add the call's backward to the step's sums; ``casts``: the formats its gradient is cast to on its way back
    (``casts_back`` of the gate's input)."""
    n = grad_input.numel()
    s.backward += n
    if n <= _LISTED and grad_input.is_cpu:  # as _listed: the definition, in floats
        median = upstream_median(grad_output, grad_output.reshape(-1).tolist())  # its list gone before the next
        if median is not None:
            s.upstream.append(median)
        gi = grad_input.reshape(-1).tolist()
        zeros = 0.0 in gi  # == 0.0: ±0 (NaN never): most calls have no zero at all
        zero = _listed_zeros(gi, grad_output.reshape(-1).tolist()) if zeros else 0
        s.zero += zero
        if casts and not (len(casts) == 1 and min(filter(None, map(abs, gi)) if zeros else map(abs, gi),
                                                  default=math.inf) > _half_least(casts[0])):
            # filter(None, …): the zeros, which stay zeros, left out (NaN, kept, is never counted)
            zero = _listed_zeros(grad_input.to(casts[0]).reshape(-1).tolist() if len(casts) == 1 else
                                 _cast(grad_input, casts).reshape(-1).tolist(), grad_output.reshape(-1).tolist())
        s.zero_cast += zero
        return
    _upstream(s, upstream_median(grad_output))
    zero = _zeros(fn, grad_output, grad_input)
    s.zero += zero
    if casts:
        zero = _zeros(fn, grad_output, _cast(grad_input, casts))
    s.zero_cast += zero


def _upstream(s: Step, median: float | None) -> None:
    if median is not None:
        s.upstream.append(median)


def _cast(t: torch.Tensor, casts: tuple[torch.dtype, ...]) -> torch.Tensor:
    for dtype in casts:  # as ToCopyBackward casts: round to nearest even, one format after the other
        t = t.to(dtype)
    return t


@functools.cache
def _half_least(dtype: torch.dtype) -> float:
    """Half the least subnormal of ``dtype``: a number of greater magnitude rounds to a non-zero value of the format
    (to nearest; one of exactly half rounds to even, 0), so where every |gradient| is greater, the cast to ``dtype``
    makes no zero and the count is the one before it (the min of a list read NaN first is NaN: counted)."""
    info = torch.finfo(dtype)
    return info.smallest_normal * info.eps / 2


def _listed_zeros(gi: list[float], go: list[float]) -> int:
    """Elements of grad_input exactly 0 (±0) where grad_output is not, from their values as Python floats, in C's
    loops: the upstream values where grad_input is falsy (±0; NaN is truthy), less those that are ±0 themselves."""
    if 0.0 not in gi:  # == 0.0: ±0 (NaN never): most calls have no zero at all
        return 0
    under = list(itertools.compress(go, map(operator.not_, gi)))
    return len(under) - under.count(0.0)


def _zeros(fn: str, grad_output: torch.Tensor, grad_input: torch.Tensor) -> int:
    """Elements of grad_input exactly 0 (±0) where grad_output is not."""
    if fn == "softmax":  # not elementwise: a zero upstream element does not give a zero gradient
        return int(torch.count_nonzero((grad_input == 0) & (grad_output != 0)))
    return int(_zero_grads(grad_output, grad_input))


_SAME_VALUES = ("ViewBackward", "UnsafeViewBackward", "ReshapeAliasBackward", "TransposeBackward", "TBackward",
                "PermuteBackward", "UnsqueezeBackward", "SqueezeBackward", "CloneBackward", "AliasBackward")


def casts_back(x: torch.Tensor) -> tuple[torch.dtype, ...]:
    """The formats the gradient at ``x`` is cast to, in order, on its way back to the tensor a layer produced: the
    ToCopyBackward nodes behind ``x``'s, through the nodes that move values without changing them (views,
    transposes, clones), up to the first node that computes (a projection's). Another reader of a tensor on that
    way would add its gradient before a cast; the count is the gate's own gradient's."""
    out, node, current = [], x.grad_fn, x.dtype
    for _ in range(16):  # a few nodes at most behind a gate's input
        name = type(node).__name__
        if name.startswith("ToCopyBackward"):
            source, i = node.next_functions[0]
            if source is None:
                break  # a cast of a tensor no gradient reaches
            dtype = source._input_metadata[i].dtype
            if dtype != current:  # a copy to another device only casts nothing
                out.append(dtype)
            node, current = source, dtype
        elif name.startswith(_SAME_VALUES) and node.next_functions and node.next_functions[0][0] is not None:
            node = node.next_functions[0][0]
        else:
            break
    return tuple(out)


@functools.cache
def compiled_output(fn: str, dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor]:
    """The gate as a compiled kernel computes it from its input: in float32 for a 16-bit format, rounded to it (the
    format's own eager kernel where that gives the same bits for every value of the format, checked once: one op
    in place of three); in the input's format otherwise."""
    f = torch.sigmoid if fn == "sigmoid" else torch.nn.functional.softplus
    if dtype not in (torch.bfloat16, torch.float16):
        return f
    every = torch.arange(-2 ** 15, 2 ** 15, dtype=torch.int32).to(torch.int16).view(dtype)
    every = every[~torch.isnan(every)]
    if torch.equal(f(every).view(torch.int16), f(every.float()).to(dtype).view(torch.int16)):
        return f
    return lambda x: f(x.float()).to(x.dtype)


def small(x: torch.Tensor) -> bool:
    """Whether a call on ``x`` is counted at the block's close (see above)."""
    return x.device.type == "cpu" and x.numel() <= _SMALL


class Later:
    """The small calls of a watched block, counted when it closes."""

    def __init__(self) -> None:
        self._forward: list[tuple] = []  # (site, x, x's version, y)
        self._backward: list[tuple] = []  # (site, grad_output, grad_input, the forward's token or None)

    def forward(self, site, x: torch.Tensor, y: torch.Tensor) -> int:
        """Keep the call y = gate(x) (y computed where the gate ran, the same kernel just run by the model: warm,
        where the close's first op ran cold); its token, for its backward."""
        self._forward.append((site, x, x._version, y))
        return len(self._forward) - 1

    def backward(self, site, grad_output: torch.Tensor, grad_input: torch.Tensor, token: int | None) -> None:
        self._backward.append((site, grad_output, grad_input, token))

    def flush(self, forward: Callable, backward: Callable) -> int:
        """Count every kept call (``forward(site, x, y)``, ``backward(site, grad_output, grad_input)``); the number
        of forward calls not counted, nor their backward, because their input changed in place."""
        missed = set()
        for token, (site, x, version, y) in enumerate(self._forward):
            if x._version != version:
                missed.add(token)
            else:
                forward(site, x, y)
        for site, grad_output, grad_input, token in self._backward:
            if token not in missed:
                backward(site, grad_output, grad_input)
        self._forward.clear()
        self._backward.clear()
        return len(missed)
