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
