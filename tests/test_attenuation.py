"""The exact backward law and the ratchet, against autograd and mpmath."""

import math

import mpmath
import numpy as np
import pytest
import torch

from softcapgrad.laws import attenuation


def test_closed_forms_match_autograd_to_a_few_ulps():
    check = attenuation.check_identity(30.0, 2_000_000)
    # both forms are O(1) quantities computed with a handful of roundings: a few ulps of 1.0
    assert check.max_abs_error_output_form <= 4 * np.finfo(np.float64).eps
    assert check.max_abs_error_sech2_form <= 4 * np.finfo(np.float64).eps
    assert check.max_abs_error <= 1e-15


@pytest.mark.parametrize("c", [1.0, 30.0, 50.0])
def test_sech2_is_autograd_derivative_pointwise(c):
    a = torch.tensor([-5 * c, -c, 0.0, 0.3 * c, c, 2 * c, 4 * c], dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad((c * torch.tanh(a / c)).sum(), a)
    ours = attenuation.sech2(a.detach().numpy() / c)
    # autograd forms 1 - y*y from the rounded y: its error is absolute (a few eps), not relative,
    # so far from 0 it loses relative digits that sech² keeps; compare absolutely, and sech² to mpmath
    np.testing.assert_allclose(ours, g.numpy(), rtol=0, atol=4 * np.finfo(np.float64).eps)
    exact = [float(mpmath.sech(mpmath.mpf(float(x)) / c) ** 2) for x in a.detach().numpy()]
    np.testing.assert_array_max_ulp(ours, np.array(exact), maxulp=8)


def test_attenuation_matches_mpmath_and_decreases():
    multiples = [0.5, 1.0, 2.0, 4.0, 8.0]
    rows = attenuation.attenuation_table(multiples)
    for m, row in zip(multiples, rows):
        exact = float(mpmath.sech(m) ** 2)
        assert row.attenuation == pytest.approx(exact, rel=8 * np.finfo(np.float64).eps)
    att = [r.attenuation for r in rows]
    assert all(x > y for x, y in zip(att, att[1:])), "attenuation strictly decreasing in |a|"


def test_asymptote_relative_error_shrinks_like_two_exp():
    rows = attenuation.attenuation_table([1.0, 2.0, 4.0, 8.0, 12.0])
    errs = [r.asymptote_rel_error for r in rows]
    assert all(e > 0 for e in errs)
    assert all(x > y for x, y in zip(errs, errs[1:]))
    # (1 + e^{-2x})^2 - 1 exactly
    for r in rows:
        q = math.exp(-2 * r.a_over_c)
        assert r.asymptote_rel_error == pytest.approx((1 + q) ** 2 - 1, rel=1e-9)


def test_ratchet_against_mpmath_and_monotone():
    levels = [0.5, 0.9, 0.99, 0.999, 0.9999]
    rows = attenuation.ratchet(30.0, levels)
    for f, row in zip(levels, rows):
        assert row.a == pytest.approx(float(30 * mpmath.atanh(f)), rel=1e-13)
        assert row.gradient == pytest.approx(1 - f * f, rel=1e-12)
    a = [r.a for r in rows]
    g = [r.gradient for r in rows]
    assert all(x < y for x, y in zip(a, a[1:]))
    assert all(x > y for x, y in zip(g, g[1:]))
