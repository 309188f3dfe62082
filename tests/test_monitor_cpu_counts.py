"""The monitor's CPU counts read numbers instead of combining tensors: each must equal its definition, element by
element, where NaN, -0.0 and zeros in one gradient and not the other are planted (every float format the monitor
meets)."""

import pytest
import torch

from softcapgrad.training.tally import _SMALL, _largest, _past, _stuck, _zero_grads

FORMATS = (torch.bfloat16, torch.float16, torch.float32, torch.float64)


def _grads(dtype: torch.dtype, seed: int, n: int = 997) -> tuple[torch.Tensor, torch.Tensor]:
    """An upstream gradient and a tanh backward's grad_input with zeros where upstream is 0, and some more."""
    g = torch.Generator().manual_seed(seed)
    go = torch.randn(n, generator=g).to(dtype)
    go[torch.rand(n, generator=g) < 0.3] = 0
    gi = go * 0.5
    gi[torch.rand(n, generator=g) < 0.05] = 0  # the dead zone: 0 from a non-zero upstream
    return go, gi


@pytest.mark.parametrize("n", (997, 5003))  # either side of _SMALL: counted by a sum's finiteness, by a min/max
@pytest.mark.parametrize("dtype", FORMATS)
def test_zero_grads_equal_the_definition_with_nan_and_signed_zeros(dtype, n):
    assert (n <= _SMALL) is (n == 997)
    cases = []
    for seed in range(6):
        go, gi = _grads(dtype, seed, n)
        overflow = gi.clone()
        overflow[gi != 0] = torch.finfo(dtype).max  # finite, with a sum that is not: the definition decides
        cases.append((go, overflow))
        cases.append((go, gi))
        with_neg_zero = gi.clone()
        with_neg_zero[with_neg_zero == 0] = -0.0  # -0.0 is a zero (dead ones too), not a non-zero bit pattern
        cases.append((go, with_neg_zero))
        nan_where_upstream_is_zero = gi.clone()
        nan_where_upstream_is_zero[(go == 0).nonzero()[0]] = float("nan")  # breaks nonzero(go) - nonzero(gi)
        cases.append((go, nan_where_upstream_is_zero))
        cases.append((go, gi.abs() + 1))  # no zero at all
    counts = []
    for go, gi in cases:
        expected = int(torch.count_nonzero((gi == 0) & (go != 0)))
        assert int(_zero_grads(go, gi)) == expected
        counts.append(expected)
    assert max(counts) > 0 and min(counts) == 0  # both branches ran


@pytest.mark.parametrize("dtype", FORMATS)
def test_largest_equals_the_tensor_maximum_with_nan_and_signed_zeros(dtype):
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(257, generator=g).to(dtype) * 40, torch.tensor([-0.0, 0.0], dtype=dtype),
          torch.tensor([0.0, -0.0], dtype=dtype), torch.tensor([-3.0, 2.0, float("nan")], dtype=dtype),
          torch.tensor([-7.5], dtype=dtype)]
    total, expected = None, None
    for x in xs:
        low, high = torch.aminmax(x)
        big = torch.maximum(-low, high).float()
        expected = big if expected is None else torch.maximum(expected, big)
        one = _largest(None, x)
        one = one.item() if isinstance(one, torch.Tensor) else one
        assert str(one) == str(big.item())  # the same number, NaN and the sign of a zero included
        total = _largest(total, x)
    total = total.item() if isinstance(total, torch.Tensor) else total
    assert str(total) == str(expected.item()) == "nan"


@pytest.mark.parametrize("dtype", FORMATS[:3])
def test_stuck_and_past_equal_their_definitions(dtype):
    y = torch.tensor([-1.0, 1.0, 0.5, -0.25, 0.0, 1.0], dtype=dtype)
    assert _stuck("tanh", y) == int((y.abs() == 1).sum()) == 3
    assert _stuck("tanh", y[2:5]) == 0
    s = torch.tensor([0.0, 1.0, 0.5, 1.0], dtype=dtype)
    assert _stuck("sigmoid", s) == int(((s == 0) | (s == 1)).sum()) == 3
    a = torch.tensor([-200.0, 3.0, 104.0, 103.0, -104.0], dtype=dtype)
    assert _past(a, 104.0) == int((a.abs() >= 104.0).sum()) == 3
    assert _past(a[1:2], 104.0) == 0
