"""The patch in fp32: eager's 1 − y² is exactly 0 from a ≈ 9c; with the patch the gradient is the exact
sech² to within one unit in the last place, eager and compiled, and ``keep_fp32=True`` keeps eager's.
The remedy (softcapgrad.softcap) in fp32 and fp64: its slope from x/c formed in fp64."""

import mpmath
import numpy as np
import pytest
import torch

from softcapgrad.training.fp32grad import fp32_tanh_backward, patch

C = 30.0
DEAD_IN_EAGER = [280.0, 300.0, 500.0, 1000.0]  # a ≥ 9c: eager fp32 returns 0.0 for each


class Cap(torch.nn.Module):
    def forward(self, a):
        return C * torch.tanh(a / C)


def _grad(model, values, dtype=torch.float32):
    x = torch.tensor(values, dtype=dtype, requires_grad=True)
    (g,) = torch.autograd.grad(model(x).sum(), x)
    return g.double().numpy()


def _exact(values) -> np.ndarray:
    """sech²(u) at u = fl32(a/c), the input the tanh sees, in float64: 4e/(1 + e)², e = exp(−2|u|)."""
    u = (np.asarray(values, dtype=np.float32) / np.float32(C)).astype(np.float64)
    e = np.exp(-2.0 * np.abs(u))
    return 4.0 * e / (1.0 + e) ** 2


def _within_one_ulp(got: np.ndarray, exact: np.ndarray) -> bool:
    """Two roundings to fp32 (the tanh backward's product, then the division by c): at most one unit."""
    stored = exact.astype(np.float32)
    ulp = np.abs(np.nextafter(stored, np.float32(np.inf)).astype(np.float64) - stored.astype(np.float64))
    return bool(np.all(np.abs(got - exact) <= ulp))


def test_eager_fp32_gradient_is_zero_without_the_patch():
    assert np.all(_grad(Cap(), DEAD_IN_EAGER) == 0.0)


def test_patch_keeps_the_fp32_gradient_alive_and_exact_eager():
    model = Cap()
    patch(model)
    got = _grad(model, DEAD_IN_EAGER)
    assert np.all(got > 0)
    assert _within_one_ulp(got, _exact(DEAD_IN_EAGER))


def test_forward_is_bit_identical_in_fp32():
    a = torch.linspace(-2000, 2000, 4001)
    plain = Cap()(a)
    model = Cap()
    patch(model)
    assert torch.equal(model(a.clone().requires_grad_(True)).detach(), plain)


def test_fp32_gradient_over_a_sweep_is_positive_wherever_the_exact_one_is_normal():
    values = np.linspace(0.0, 1500.0, 30001, dtype=np.float32)
    model = Cap()
    patch(model)
    got = _grad(model, values)
    exact = _exact(values)
    normal = exact >= float(np.finfo(np.float32).tiny)
    assert normal.sum() > 25000  # the sweep reaches far past eager's zero at a ≈ 9c
    assert np.all(got[normal] > 0) and _within_one_ulp(got[normal], exact[normal])


def test_keep_fp32_leaves_fp32_to_eager_autograd():
    model = Cap()
    patch(model, keep_fp32=True)
    assert np.all(_grad(model, DEAD_IN_EAGER) == 0.0)
    bf16 = _grad(model, [120.0], torch.bfloat16)  # bf16 is still covered: 4c is past bf16's horizon
    assert bf16[0] > 0
    x = torch.ones(3, requires_grad=True)
    with fp32_tanh_backward(keep_fp32=True):
        assert torch.tanh(x).grad_fn.name() == "TanhBackward0"
    with fp32_tanh_backward():
        assert torch.tanh(x).grad_fn.name() == "FromInputBackward"


def test_fp32_sigmoid_gradient_survives_where_sigma_rounds_to_one():
    x = torch.tensor([20.0, 50.0, 80.0, -80.0], requires_grad=True)
    (eager,) = torch.autograd.grad(torch.sigmoid(x).sum(), x)
    with fp32_tanh_backward():
        y = torch.sigmoid(x)
    (fixed,) = torch.autograd.grad(y.sum(), x)
    assert float(eager[0]) == 0.0  # σ(20) rounds to 1 in fp32
    v = x.detach().double().numpy()
    exact = np.exp(-np.abs(v)) / (1.0 + np.exp(-np.abs(v))) ** 2
    got = fixed.double().numpy()
    assert np.all(got > 0) and _within_one_ulp(got, exact)


@pytest.mark.filterwarnings("ignore:.*should not be instantiated:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:.*torch.jit.script_method.* is deprecated:DeprecationWarning")
def test_patch_keeps_the_fp32_gradient_alive_under_torch_compile():
    plain = torch.compile(Cap(), fullgraph=True)
    model = Cap()
    patch(model)
    fixed = torch.compile(model, fullgraph=True)
    assert np.all(_grad(plain, DEAD_IN_EAGER) == 0.0)
    got = _grad(fixed, DEAD_IN_EAGER)
    assert np.all(got > 0) and _within_one_ulp(got, _exact(DEAD_IN_EAGER))


def _mp_sech2(values, c: float) -> np.ndarray:
    """sech²(a/c) with a/c and sech² in 40 digits: the reference for the remedy, whose slope is at a/c itself."""
    with mpmath.workdps(40):
        return np.array([float(mpmath.sech(mpmath.mpf(float(v)) / c) ** 2) for v in values])


@pytest.mark.parametrize("build_graph", [False, True])
def test_remedy_fp32_gradient_is_within_one_unit_of_the_exact_slope(build_graph):
    from softcapgrad.training.remedy import softcap

    a = np.linspace(0.0, 1500.0, 3001, dtype=np.float32)  # out to 50c: an fp32 a/c would cost 137 units there
    x = torch.from_numpy(a).requires_grad_(True)
    (g,) = torch.autograd.grad(softcap(x, C).sum(), x, create_graph=build_graph)
    exact = _mp_sech2(a, C)
    normal = exact >= float(np.finfo(np.float32).tiny)
    assert _within_one_ulp(g.detach().double().numpy()[normal], exact[normal])


def test_remedy_fp64_gradient_is_computed_in_fp64():
    from softcapgrad.training.remedy import softcap

    a = np.linspace(0.0, 1500.0, 1501)
    x = torch.from_numpy(a).requires_grad_(True)
    (g,) = torch.autograd.grad(softcap(x, C).sum(), x)
    exact, u = _mp_sech2(a, C), a / C
    # a/c rounded in fp64 (half a unit) moves sech² by 2|u| times that; exp, the sum, the square and the
    # division add a few units more: (4|u| + 8) units of 2⁻⁵³, relative
    assert np.all(np.abs(g.double().numpy() - exact) <= (4.0 * u + 8.0) * 2.0**-53 * exact)
