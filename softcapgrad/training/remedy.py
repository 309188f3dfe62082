"""A soft-cap whose gradient does not die in a low format.

Forward: exactly the eager formula ``cap·tanh(x/cap)`` in the input's format. Backward: from the
saved *input*, ``sech²(x/cap)`` times the upstream gradient, rounded once to the input's format: in
fp32 for bf16/fp16 inputs, in fp64 for fp32/fp64 ones (fp32 arithmetic would round x/cap to fp32,
an error that sech² multiplies by 2|x/cap|). Eager autograd instead forms ``1 − y²`` from the rounded output y, which is exactly 0
once y rounds to 1.0 (past cap·x_knee of the format); here the gradient is zero only where the
fp32 sech² or its rounding to the format underflows.

Contract: any shape and float dtype; one saved tensor (the input); works under ``torch.compile``;
the gradient is within one unit in the last place of the input format of the exact value
wherever that value is a normal number of the format.

How it runs. A 16-bit input has only 65,536 values, so on the CPU both directions are table
look-ups, built once per (format, cap) with the very operations of the formula: the forward
table is ``cap·tanh(v/cap)`` over every value v (kept only where torch's vectorised and scalar
kernels agree on every value, so the look-up equals eager wherever eager runs; otherwise the
forward is the formula itself), the backward table is the fp32 ``sech²(v/cap)``. Both walk the
tensor in cache-sized chunks, so the backward needs no scratch beyond the gradient it returns.
Wider formats, other devices, a backward that builds a graph (``create_graph=True``) and any run
under a dispatch mode (``softcapgrad.DeadZoneMonitor`` sees the formula's tanh) run the formula op
by op.

Under ``torch.compile`` the function is traced as the formula, and the compiler fuses it: it
reads the input once and computes ``x/cap``, ``tanh`` and ``·cap`` in fp32 before one rounding,
so the compiled forward is *not* bit-identical to eager, which rounds to the format after each
of the three operations. Measured with torch 2.13 (inductor on the CPU, c = 30): 3,316 of the
65,282 non-NaN bf16 inputs come out different, 2,440 of them by one unit in the last place and
none by more than 15 (``make bench`` recomputes this). The compiled backward is the same fp32
``sech²`` rounded once, and gave the eager gradient bit for bit on every one of those inputs.
"""

from __future__ import annotations

import numbers
from functools import lru_cache

import torch
from torch import nn

from softcapgrad.core import chunks

_TABLE_DTYPES = (torch.bfloat16, torch.float16)


def sech2_fp32(x: torch.Tensor, cap: float) -> torch.Tensor:
    """sech²(x/cap) in fp32, in place on one fp32 buffer: (1/cosh)², so nothing overflows before cosh does."""
    u = x.float().mul_(1.0 / cap) if x.dtype != torch.float32 else x.mul(1.0 / cap)
    return u.cosh_().reciprocal_().square_()


def sech2_wide(x: torch.Tensor, cap: float = 1.0) -> torch.Tensor:
    """sech²(x/cap) in fp64, u = x/cap formed in fp64 too: 4e/(1 + e)² with e = exp(−2|u|), so nothing
    overflows or cancels. The slope for fp32 and fp64 inputs: an error δ in u becomes 2|u|·δ in sech²(u),
    so u rounded to fp32 would cost up to 137 fp32 units at a = 1500, c = 30 (measured against mpmath);
    formed in fp64, the product rounded once to fp32 is within half a unit. Out of place: a backward that
    builds a graph can be differentiated again."""
    u = x.double() if cap == 1.0 else x.double() / cap
    e = torch.exp(-2.0 * u.abs())
    return 4.0 * e / (1.0 + e).square()


def every_value(dtype: torch.dtype) -> torch.Tensor:
    """The 65,536 values of a 16-bit format, indexed by their bit pattern read as an unsigned integer."""
    return torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(dtype)


def _strided(t: torch.Tensor) -> torch.Tensor:
    """The same values as a non-contiguous view: torch then runs its scalar (not vectorised) kernel."""
    return torch.stack([t, t], -1)[..., 0]


@lru_cache(maxsize=32)
def _forward_table(dtype: torch.dtype, cap: float) -> torch.Tensor | None:
    """cap·tanh(v/cap) for every v of the format, or None where kernel paths disagree on a value."""
    v = every_value(dtype)
    vectorised = cap * torch.tanh(v / cap)
    scalar = _strided(torch.tanh(_strided(_strided(v) / cap))) * cap
    same = (vectorised.view(torch.int16) == scalar.view(torch.int16)) | (vectorised.isnan() & scalar.isnan())
    return vectorised if bool(same.all()) else None


@lru_cache(maxsize=32)
def _backward_table(dtype: torch.dtype, cap: float) -> torch.Tensor:
    """sech²(v/cap) in fp32 for every v of the format."""
    return sech2_fp32(every_value(dtype), cap)


def _patterns(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """The unsigned bit patterns of a 16-bit chunk, as int32 indices into a table of 65,536 entries."""
    index = out[:x.numel()]
    index.copy_(x.view(torch.uint16))
    return index


def _lookup_forward(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    out = torch.empty(x.shape, dtype=x.dtype)
    xf, zf = chunks.flat_view(x), out.view(-1)

    def work(spans: list[slice]) -> None:
        index = torch.empty(min(chunks.CHUNK, xf.numel()), dtype=torch.int32)
        for span in spans:
            torch.index_select(table, 0, _patterns(xf[span], index), out=zf[span])

    chunks.each_share(xf.numel(), 1, work)
    return out


def lookup_backward(x: torch.Tensor, grad: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    out = torch.empty(x.shape, dtype=x.dtype)
    xf, gf, of = chunks.flat_view(x), chunks.flat_view(grad), out.view(-1)

    def work(spans: list[slice]) -> None:
        n = min(chunks.CHUNK, xf.numel())
        index, s = torch.empty(n, dtype=torch.int32), torch.empty(n, dtype=torch.float32)
        for span in spans:
            xs = xf[span]
            ss = s[:xs.numel()]
            torch.index_select(table, 0, _patterns(xs, index), out=ss)
            torch.mul(ss, gf[span], out=of[span])  # fp32 product, one rounding to the format

    chunks.each_share(xf.numel(), 1, work)
    return out


def _chunked_backward(x: torch.Tensor, grad: torch.Tensor, cap: float) -> torch.Tensor:
    """The formula's backward for fp32 input, chunk by chunk: fp64 scratch of one chunk, not of the tensor."""
    out = torch.empty(x.shape, dtype=x.dtype)
    xf, gf, of = chunks.flat_view(x), chunks.flat_view(grad), out.view(-1)

    def work(spans: list[slice]) -> None:
        for span in spans:
            of[span] = sech2_wide(xf[span], cap).mul_(gf[span])  # fp64 product, one rounding to fp32

    chunks.each_share(xf.numel(), 1, work)
    return out


def fast_path(x: torch.Tensor) -> bool:
    """The table and chunk paths: on the CPU, not while torch.compile traces, and not under a dispatch
    mode (a DeadZoneMonitor, a FLOP counter, fake tensors), which must see the formula's own ops."""
    from torch.utils._python_dispatch import is_in_torch_dispatch_mode

    return x.device.type == "cpu" and not torch.compiler.is_compiling() and not is_in_torch_dispatch_mode()


class _CapFromInput(torch.autograd.Function):
    """cap·tanh(x/cap) saving only x; the backward is sech²(x/cap) in fp32 from x, rounded once."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, cap: float) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.cap = cap
        if x.dtype in _TABLE_DTYPES and fast_path(x):
            table = _forward_table(x.dtype, cap)
            if table is not None:
                return _lookup_forward(x, table)
        return cap * torch.tanh(x / cap)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (x,) = ctx.saved_tensors
        cap = ctx.cap
        if fast_path(x) and not torch.is_grad_enabled() and grad.dtype == x.dtype:
            if x.dtype in _TABLE_DTYPES:
                return lookup_backward(x, grad, _backward_table(x.dtype, cap)), None
            if x.dtype == torch.float32:
                return _chunked_backward(x, grad, cap), None
        if x.dtype in _TABLE_DTYPES:
            return sech2_fp32(x, cap).mul_(grad).to(x.dtype), None
        return sech2_wide(x, cap).mul(grad).to(x.dtype), None


def _range(dtype: torch.dtype) -> tuple[float, float]:
    info = torch.finfo(dtype)
    return float(info.tiny), float(info.max)


# The caps a tensor of each format takes: (smallest normal, largest finite). A dict, read by dtype: torch.compile
# traces a look-up by a tensor's dtype (a guard on it), never a value of the tensor.
CAP_RANGE = {dtype: _range(dtype) for dtype in (torch.bfloat16, torch.float16, torch.float32, torch.float64)}


def check_cap(cap, dtype: torch.dtype) -> float:
    """``cap`` as a float, or a TypeError / ValueError that says what was expected, for inputs of ``dtype``.

    Why these limits: the forward is c·tanh(x/c) in the input's format, so c is held in that format. Above its
    largest finite value (3.4e38 in fp32, 65504 in fp16) c is inf there, x/c is 0 and c·0 is NaN for every
    input, so the largest cap is ``torch.finfo(dtype).max``; at or below it, |c·tanh(x/c)| ≤ c stays finite.
    Below the smallest normal (``finfo.tiny``) c keeps fewer digits than the format's, and from half the smallest
    subnormal on it is 0 (x/0, NaN at x = 0): the same normal range the command line asks of a cap."""
    if isinstance(cap, bool) or not isinstance(cap, numbers.Real):
        raise TypeError(f"cap must be a real number (a Python or numpy float), got {type(cap).__name__}")
    cap = float(cap)
    lo, hi = CAP_RANGE[dtype] if dtype in CAP_RANGE else _range(dtype)
    if not lo <= cap <= hi:  # NaN too
        raise ValueError(f"cap must lie in [{lo:.4g}, {hi:.4g}] for {str(dtype).removeprefix('torch.')} inputs "
                         f"(the format's normal range: c·tanh(x/c) is computed in it), got {cap!r}")
    return cap


def softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """cap·tanh(x/cap) with a gradient recomputed in fp32 from the input.

    ``x``: a floating-point tensor of any shape (empty too); ``cap``: a real number in the normal range of
    ``x``'s format (:func:`check_cap` says why), checked from the arguments alone, so nothing of the tensor's
    values is read and ``torch.compile`` traces the call whole."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"softcap expects a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"softcap expects a floating-point tensor, got {x.dtype}")
    return _CapFromInput.apply(x, check_cap(cap, x.dtype))


class SoftCap(nn.Module):
    """Module form of :func:`softcap`."""

    def __init__(self, cap: float) -> None:
        super().__init__()
        self.cap = check_cap(cap, torch.float64)  # the widest format's range; each input's format is checked

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return softcap(x, self.cap)

    def extra_repr(self) -> str:
        return f"cap={self.cap:g}"
