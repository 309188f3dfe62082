"""Knees and horizons against independent references: mpmath, full enumeration, brute-force autograd."""

import math

import ml_dtypes
import mpmath
import numpy as np
import pytest
import torch

from softcapgrad.laws import horizon as horizon_law
from softcapgrad.laws import knee as deadzone
from softcapgrad.laws import formats

mpmath.mp.prec = 200


def _below_one(dtype) -> float:
    """The neighbour of 1.0 found without finfo: by enumeration, or numpy's nextafter."""
    if dtype.itemsize <= 2:
        v = formats.positive_values(dtype).astype(np.float64)
        return float(v[v < 1.0].max())
    return float(np.nextafter(dtype.type(1), dtype.type(0)))


@pytest.mark.parametrize("name", formats.FORMAT_NAMES)
def test_exact_knee_against_mpmath(name):
    dtype = formats.resolve(name)
    row, search = deadzone.knee(dtype, [30.0])
    m = (1 + mpmath.mpf(_below_one(dtype))) / 2  # midpoint between 1.0 and its neighbour
    assert row.knee_exact == pytest.approx(float(mpmath.atanh(m)), rel=4e-16)
    first, last = row.first_saturating_input, row.last_unsaturated_input
    assert mpmath.tanh(first) > m > mpmath.tanh(last)
    # nothing representable lies between them
    between = np.array([last, first]).astype(dtype)
    assert np.array_equal(formats.neighbours_below(dtype, first, 1), between)
    assert search.monotone
    assert row.horizons == [{"cap": 30.0, "horizon": 30.0 * row.knee_exact}]


@pytest.mark.parametrize("name", ["bf16", "fp16", "float8_e4m3fn", "float6_e2m3fn", "float4_e2m1fn", "float8_e8m0fnu"])
def test_knee_bisection_matches_enumeration(name):
    dtype = formats.resolve(name)
    pred = deadzone.saturation_predicate("exact", dtype)
    a = formats.find_switch(dtype, pred, method="enumeration")
    b = formats.find_switch(dtype, pred, method="bisection", window=16)
    assert (a.first_true, a.last_false) == (b.first_true, b.last_false)


def test_formula_forms():
    bf16 = formats.facts(formats.resolve("bf16"))
    assert deadzone.knee_doc_formula(bf16.mantissa_bits) == pytest.approx(math.log(2) / 2 * 9)
    assert deadzone.knee_spacing(bf16.spacing_below_one) == pytest.approx(math.log(2) / 2 * 10)
    # the spacing form is the exact knee to first order in ε₋
    for name in ("fp16", "fp32"):
        f = formats.facts(formats.resolve(name))
        diff = deadzone.knee_spacing(f.spacing_below_one) - deadzone.knee_exact(f.spacing_below_one)
        assert diff == pytest.approx(f.spacing_below_one / 8, rel=0.01)  # ½·ln(2/(2 − ε₋/2)) ≈ ε₋/8


def test_subnormal_neighbour_knee_is_exact():
    e2m3 = formats.resolve("float6_e2m3fn")  # 1.0's neighbour 0.875 is subnormal
    row, _ = deadzone.knee(e2m3, [])
    assert row.below_one == 0.875 and row.below_one_is_subnormal
    assert row.knee_exact == pytest.approx(float(mpmath.atanh(mpmath.mpf("0.9375"))), rel=1e-15)
    assert (row.last_unsaturated_input, row.first_saturating_input) == (1.625, 1.75)


def test_numpy_backend_fp32_is_not_correctly_rounded_but_monotone():
    got = deadzone.backend_knee(np.dtype(np.float32), "numpy", [])
    exact = deadzone.backend_knee(np.dtype(np.float32), "exact", [])
    assert got.monotone and exact.monotone
    # whatever numpy does, its switch is a real fp32 value where np.tanh first returns 1.0
    x = np.float32(got.first_saturating_input)
    assert np.tanh(x) == 1 and np.tanh(np.nextafter(x, np.float32(0))) < 1


def test_torch_backend_reports_unsupported_formats():
    row = deadzone.backend_knee(formats.resolve("float4_e2m1fn"), "torch", [])
    assert not row.supported and "float4_e2m1fn" in row.reason


def _brute_force_first_zero(c: float, dtype: torch.dtype) -> float:
    a = torch.arange(0, 2**15, dtype=torch.int16).view(dtype)  # every non-negative bf16/fp16 pattern
    a = a[torch.isfinite(a) & (a > 0) & (a <= 10 * c)].clone().requires_grad_(True)
    (g,) = torch.autograd.grad((c * torch.tanh(a / c)).sum(), a)
    zero = (g == 0).nonzero()
    first = int(zero[0])
    assert bool((g[first:] == 0).all()), "zero gradient stays zero past the horizon"
    return float(a.detach()[first])


@pytest.mark.parametrize("c", [30.0, 50.0, 7.0])
@pytest.mark.parametrize("name, tdtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_first_zero_gradient_against_brute_force(c, name, tdtype):
    h = horizon_law.horizon(c, formats.resolve(name), [])
    assert h.first_zero_grad_input == _brute_force_first_zero(c, tdtype)
    # it is within one input spacing of c·x_knee (the division a/c rounds in the format)
    below = formats.neighbours_below(formats.resolve(name), h.first_zero_grad_input, 2).astype(np.float64)
    assert below[0] <= h.horizon + (below[2] - below[1])


def test_probe_gradients_are_bit_exact_zero_past_the_horizon():
    for c in (30.0, 50.0):
        probes = horizon_law.horizon(c, formats.resolve("bf16"), [4 * c, 3 * c]).probes
        assert probes[0]["grad_autograd"] == 0.0 and math.copysign(1, probes[0]["grad_autograd"]) == 1
        assert probes[1]["grad_autograd"] > 0  # 3c is inside the horizon
        assert probes[0]["grad_exact"] == pytest.approx(float(mpmath.sech(4) ** 2))


def test_fp32_horizon_by_bisection_is_a_real_switch():
    h = horizon_law.horizon(30.0, np.dtype(np.float32), [])
    a = np.float32(h.first_zero_grad_input)
    grads = horizon_law.autograd_gradient(np.array([np.nextafter(a, np.float32(0)), a], dtype=np.float32), 30.0, np.dtype(np.float32))
    assert grads[0] > 0 and grads[1] == 0


def test_approach_rows_end_at_the_first_zero():
    rows = horizon_law.approach(30.0, np.dtype(ml_dtypes.bfloat16), 104.0, 3)
    assert [r["a"] for r in rows] == [102.5, 103.0, 103.5, 104.0]
    assert rows[-1]["grad_autograd"] == 0.0 and all(r["grad_autograd"] > 0 for r in rows[:-1])
