"""The Python API refuses what it cannot compute with a TypeError or ValueError that says what was expected,
from its arguments alone, so that torch.compile still traces a training step whole."""

import math

import pytest
import torch

import softcapgrad
from softcapgrad.training.remedy import CAP_RANGE, check_cap


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_softcap_of_an_empty_tensor_has_an_empty_gradient(dtype):
    x = torch.empty(0, 4, dtype=dtype, requires_grad=True)
    softcapgrad.softcap(x, 30.0).sum().backward()  # once: range() arg 3 must not be zero, in core.chunks
    assert x.grad.shape == (0, 4) and x.grad.dtype == dtype


@pytest.mark.parametrize("dtype, cap", [(torch.float32, float("inf")), (torch.float32, 1e300),
                                        (torch.float32, float("nan")), (torch.float16, 1e5), (torch.bfloat16, 1e39),
                                        (torch.float32, 1e-300), (torch.float32, 0.0), (torch.float64, -1.0)])
def test_softcap_refuses_a_cap_its_format_cannot_compute_with_and_names_the_limit(dtype, cap):
    x = torch.linspace(-100, 100, 7, dtype=dtype)
    lo, hi = CAP_RANGE[dtype]
    with pytest.raises(ValueError, match=rf"^cap must lie in \[{lo:.4g}, {hi:.4g}\] for "
                                         rf"{str(dtype)[6:]} inputs .*, got {cap!r}$".replace("+", r"\+")):
        softcapgrad.softcap(x, cap)


@pytest.mark.parametrize("dtype", list(CAP_RANGE))
def test_the_largest_cap_keeps_every_value_finite_and_the_next_one_up_would_not(dtype):
    """The limit is the arithmetic's: at finfo.max every output is finite, and above it the cap is inf in the format,
    where the formula gives NaN (what softcap(x, 1e300) returned for fp32 before it was refused)."""
    lo, hi = CAP_RANGE[dtype]
    assert (lo, hi) == (torch.finfo(dtype).tiny, torch.finfo(dtype).max)
    x = torch.tensor([-hi, -1.0, 0.0, 1.0, hi], dtype=dtype)
    assert torch.isfinite(softcapgrad.softcap(x, hi)).all() and torch.isfinite(softcapgrad.softcap(x, lo)).all()
    inf = torch.tensor(math.inf, dtype=dtype)
    assert torch.isnan(inf * torch.tanh(x / inf)).all()


@pytest.mark.parametrize("call, error, said", [
    (lambda: softcapgrad.softcap([1.0, 2.0], 30), TypeError, "softcap expects a torch.Tensor, got list"),
    (lambda: softcapgrad.softcap(torch.ones(2, dtype=torch.int64), 30), TypeError, "a floating-point tensor"),
    (lambda: softcapgrad.softcap(torch.ones(2), "30"), TypeError, "cap must be a real number"),
    (lambda: softcapgrad.SoftCap(float("inf")), ValueError, "cap must lie in"),
    (lambda: softcapgrad.patch(None), TypeError, "patch expects a torch.nn.Module (a model or one of its layers), "
                                                 "got NoneType"),
    (lambda: softcapgrad.patch(lambda x: x), TypeError, "patch expects a torch.nn.Module"),
    (lambda: softcapgrad.DeadZoneMonitor(models=[1]), TypeError,
     "models must be a dict of name -> torch.nn.Module, such as {'teacher': model}, got list"),
    (lambda: softcapgrad.DeadZoneMonitor(models={"a": 3}), TypeError, "got 'a': int"),
    (lambda: _tether(theta_init=float("nan")), ValueError, "theta_init must be a finite number, got nan"),
])
def test_a_wrong_argument_says_what_was_expected(call, error, said):
    with pytest.raises(error) as raised:
        call()
    assert said in str(raised.value) and not isinstance(raised.value, AttributeError)


def _tether(**options):
    from softcapgrad.training.tether import TetherGate

    return TetherGate(2, **options)


@pytest.mark.filterwarnings("ignore:.*should not be instantiated:DeprecationWarning")  # torch's, as it traces
def test_the_checked_api_still_compiles_whole():
    """The checks read the arguments (a type, a dtype, a float), never a tensor's values: fullgraph holds."""
    step = torch.compile(lambda x: softcapgrad.softcap(x, 30.0).sum(), fullgraph=True, backend="aot_eager")
    x = torch.linspace(-200, 200, 33, requires_grad=True)
    step(x).backward()
    y = x.detach().clone().requires_grad_()
    softcapgrad.softcap(y, 30.0).sum().backward()
    assert torch.equal(x.grad, y.grad)
    module = torch.compile(softcapgrad.SoftCap(30.0), fullgraph=True, backend="aot_eager")
    assert torch.isfinite(module(x.detach().bfloat16())).all()
    gate = torch.compile(_tether(theta_init=0.5), fullgraph=True, backend="aot_eager")
    assert gate(torch.zeros(3, 2)).shape == (3, 2)
    assert check_cap(30, torch.float32) == 30.0
