"""Closed and saturated counted one way for every format and call size (softmax-softplus-gates.md §5–6).

Closed is y < 1e-3 as real numbers (the float64 comparison: every value of these formats is exact in float64);
saturated is y stored as exactly 0 or 1 (softplus: 0). The values planted are each format's neighbours of the two
boundaries: the largest value below 1e-3, the least not below it, the format's own rounding of 1e-3 (bf16(1e-3) =
0.00099945068359375 lies below 1e-3, fp16's and fp32's above), and 0, −0, the least subnormal, the largest value
below 1 and 1. The counts are exact: they must equal the float64 definition's on the same tensor.
"""

import pytest
import torch

from softcapgrad.training import gatecount
from softcapgrad.training.gaterows import CLOSED, Step, _closed, _saturated, closed_below

FORMATS = [torch.bfloat16, torch.float16, torch.float32]


def _neighbours(dtype) -> list[float]:
    """The format's values around 1e-3 and around the saturation points."""
    ints = {2: torch.int16, 4: torch.int32}[torch.finfo(dtype).bits // 8]
    t = torch.tensor([closed_below(dtype)], dtype=dtype)
    below = (t.view(ints) - 1).view(dtype)
    one = torch.tensor([1.0], dtype=dtype)
    under_one = (one.view(ints) - 1).view(dtype)
    least = torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps  # the least subnormal
    return [below.item(), t.item(), torch.tensor(CLOSED, dtype=torch.float64).to(dtype).item(),
            0.0, -0.0, least, under_one.item(), 1.0]


@pytest.mark.parametrize("dtype", FORMATS)
def test_closed_below_is_the_least_value_of_the_format_not_below_1e_3(dtype):
    below, t = _neighbours(dtype)[:2]
    assert below < CLOSED <= t
    assert torch.tensor(t, dtype=dtype).item() == t  # exact in the format: the comparison rounds nothing


@pytest.mark.parametrize("fn", ["sigmoid", "softplus", "softmax"])
@pytest.mark.parametrize("dtype", FORMATS)
@pytest.mark.parametrize("size", [8, gatecount._LISTED, gatecount._LISTED + 1, 5000])
def test_closed_and_saturated_at_the_boundaries_are_the_float64_definition_at_every_size(fn, dtype, size):
    """Python floats (≤ _LISTED elements on the CPU), the CPU reductions, and the counts with no range read first
    (a device's) all give the float64 definition's counts at the boundary values."""
    planted = torch.tensor(_neighbours(dtype), dtype=dtype)
    y = torch.full((size,), 0.5, dtype=dtype)
    y[:planted.numel()] = planted
    y64 = y.double()
    closed = int((y64 < 1e-3).sum())
    saturated = int(((y64 == 0) | ((y64 == 1) & (fn != "softplus"))).sum())
    # below 1e-3, 0, −0, the least subnormal; and bf16(1e-3), which lies below 1e-3 (fp16's and fp32's lie above)
    assert closed == 4 + (dtype == torch.bfloat16) and saturated == (2 if fn == "softplus" else 3)
    counts = []
    for listed in (gatecount._LISTED, 0):
        s = Step()
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(gatecount, "_LISTED", listed)
            gatecount.count_forward(s, fn, y, y)
        counts.append((s.closed, s.saturated))
    counts.append((_closed(y), _saturated(fn, y)))
    assert counts == [(closed, saturated)] * 3


def test_bf16_1e_3_is_closed_whatever_the_call_s_size():
    """The gate value stored as bf16(1e-3): closed in a call of 8 elements and in one of 8,192 (it was open in the
    larger, which compared in bf16 against bf16(1e-3) itself)."""
    for size in (8, 8192):
        s = Step()
        gatecount.count_forward(s, "sigmoid", *[torch.full((size,), 1e-3, dtype=torch.bfloat16)] * 2)
        assert s.closed == size


class CastGate(torch.nn.Module):
    """Laguna's head gate in small: softplus in float32 of a bfloat16 projection's output."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.g_proj = torch.nn.Linear(width, width, bias=False, dtype=torch.bfloat16)
        with torch.no_grad():
            self.g_proj.weight.copy_(torch.eye(width))  # u = h exactly: one product per output, exact in bf16

    def forward(self, h):
        return torch.nn.functional.softplus(self.g_proj(h).float())


@pytest.mark.parametrize("rows", [1, 64])  # 64 elements (read as Python floats) and 4,096 (reductions)
def test_zero_gradients_are_counted_where_the_weights_see_them_after_the_cast(rows):
    """softplus'(u)·g = σ(u)·g in float32 is a subnormal from u ≈ −87.3 down (e⁻⁸⁷·³ ≈ 2⁻¹²⁶) and non-zero down to
    about −103; cast to bfloat16 for g_proj, whose least subnormal is 2⁻¹³³ (σ(u) = e^u from u ≈ −92.2 down), it is 0:
    inputs spread over [−110, 0] give both kinds. Each watched step (the first by the dispatch mode, the later ones by
    the watch it learnt) must count exactly the zeros hooks see on the float32 input and on g_proj's output."""
    from softcapgrad.training.gatehealth import GateMonitor

    model = CastGate(64)
    captured: dict = {}

    def keep(module, args, out) -> None:  # None: a forward hook's result would replace the output
        out.register_hook(lambda grad: captured.__setitem__("w", grad))

    model.g_proj.register_forward_hook(keep)
    monitor = GateMonitor()
    g = torch.Generator().manual_seed(0)
    expected = []
    for _ in range(3):
        h = (torch.rand(rows, 64, generator=g) * -110).bfloat16()
        with monitor.step():
            y = model(h)
            y.backward(torch.ones_like(y))
        u = h.float().requires_grad_()  # the gate's own gradient, on the float32 input
        torch.nn.functional.softplus(u).backward(torch.ones_like(u))
        expected.append((int((u.grad == 0).sum()), int((captured["w"] == 0).sum())))
    (row,) = monitor.rows()
    assert [(s[4], s[6]) for s in row.per_step] == expected
    assert all(zero_w > zero > 0 for zero, zero_w in expected), expected
    assert row.zero_grad_cast_share > row.zero_grad_share


def _history(means: list[float], closed: list[int] | None = None, count: int = 8192) -> list[tuple]:
    """Planted per-step entries (count, closed, saturated, backward, zero, mean, zero cast back)."""
    closed = closed or [0] * len(means)
    return [(count, c, 0, count, 0, m, 0) for m, c in zip(means, closed)]


@pytest.mark.parametrize("means,closed,window,want", [
    ([0.50, 0.45, 0.47, 0.40, 0.33, 0.24], None, 1, "closing"),  # halved with an uptick (the review's layer)
    ([0.50, 0.42, 0.44, 0.30, 0.26, 0.24], None, 2, "closing"),  # the same by windows of two
    ([0.50, 0.52, 0.48, 0.51, 0.49, 0.50], None, 1, "steady"),  # ±4 % noise about a steady mean
    ([0.50, 0.49, 0.48, 0.47, 0.46, 0.45], None, 1, "steady"),  # a 10 % drift: below the 20 % line
    ([0.50, 0.50, 0.50, 0.50], [0, 20, 10, 54 * 2], 1, "closing"),  # closed 0 → 1.3 %, mean unchanged
    ([0.50, 0.24], None, 1, "—"),  # two windows: too few to tell
])
def test_closing_compares_the_first_window_with_the_last(means, closed, window, want):
    from softcapgrad.training.gaterows import trend

    assert trend(_history(means, closed), window) == want


@pytest.mark.parametrize("cast", [torch.bfloat16, torch.float16])
def test_a_small_backward_cast_back_counts_the_zeros_the_cast_makes(cast):
    """A float32 gradient cast back to a 16-bit format is 0 where its magnitude is at most half the format's least
    subnormal (exactly half: a tie, rounded to even, 0). The count from Python floats, which skips the cast where
    every magnitude is above that, must equal the reductions' on the cast tensor, with the neighbours of half the
    least subnormal planted one at a time (none of them: the skip; each: the cast counted)."""
    info = torch.finfo(cast)
    half = info.smallest_normal * info.eps / 2
    h = torch.tensor([half], dtype=torch.float32)
    below, above = torch.nextafter(h, torch.zeros(1)).item(), torch.nextafter(h, torch.ones(1)).item()
    g = torch.Generator().manual_seed(0)
    for planted in (None, below, half, above, -half, 0.0):
        gi = torch.rand(64, generator=g) + 0.5
        go = torch.rand(64, generator=g) + 0.5
        if planted is not None:
            gi[7] = planted
        listed, reduced = Step(), Step()
        gatecount.count_backward(listed, "softplus", go, gi, (cast,))
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(gatecount, "_LISTED", 0)
            gatecount.count_backward(reduced, "softplus", go, gi, (cast,))
        want = int(((gi.to(cast) == 0) & (go != 0)).sum())
        assert (listed.zero, listed.zero_cast) == (reduced.zero, reduced.zero_cast) == (int(planted == 0.0), want)
        assert want == (planted is not None and abs(planted) <= half)


def test_the_upstream_median_from_python_floats_is_the_tensor_s():
    """A call's upstream: the lower median of |g| over its elements neither 0 nor NaN, the same from Python floats
    (a small call) as from the tensor (torch.median, the lower of two middles), with ±0, NaN and ∞ planted, at odd
    and even counts; None where every element is 0 or NaN."""
    from softcapgrad.training.gaterows import upstream_median

    g = torch.Generator().manual_seed(0)
    for n in (1, 2, 7, 64, 255):
        go = torch.randn(n, generator=g).bfloat16()
        for planted in ([], [0.0], [-0.0, float("nan")], [float("-inf"), 0.0, float("nan")]):
            t = go.clone()
            t[:len(planted)] = torch.tensor(planted[:n], dtype=t.dtype)
            kept = sorted(abs(v) for v in t.double().tolist() if v == v and v != 0)
            want = kept[(len(kept) - 1) // 2] if kept else None
            assert upstream_median(t) == upstream_median(t, t.tolist()) == want
    assert upstream_median(torch.tensor([0.0, float("nan")])) is None
    assert upstream_median(torch.tensor([0.0, float("nan")]), [0.0, float("nan")]) is None
