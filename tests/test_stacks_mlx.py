"""MLX's stacks (its CPU build): the backward divides the upstream gradient by cosh²(a/c), so it is 0 where that
square overflows (at an upstream gradient of 1) or where the quotient underflows (at a smaller one), and a
training route on MLX is compared with the stack at its own a and dL/dz, position by position."""

import ml_dtypes
import numpy as np
import pytest

from softcapgrad.engines.training import parity as train_parity, reference as tr, results as train_results
from softcapgrad.laws import formats
from softcapgrad.stacks import registry

pytest.importorskip("mlx.core")

MLX = ("mlx-cpu", "mlx-compile-cpu")


def _values(dtype: np.dtype, c: float, low: float, high: float) -> np.ndarray:
    """Every value of the format in [low·c, high·c)."""
    if dtype.itemsize == 2:
        values = formats.positive_values(dtype)
        wide = values.astype(np.float64)
        return values[(wide >= low * c) & (wide < high * c)]
    lo, hi = np.array([low * c, high * c], dtype=np.float32).view(np.uint32)
    return np.arange(lo, hi, dtype=np.uint32).view(np.float32)


def _quotient(values: np.ndarray, dtype: np.dtype, c: float) -> np.ndarray:
    """a/c as MLX forms it in the scores format: a true division, rounded once to the format."""
    return (values.astype(np.float32) / np.float32(c)).astype(dtype)


@pytest.mark.parametrize("path", MLX)
@pytest.mark.parametrize("scores", ["bf16", "fp16", "fp32"])
def test_mlx_dies_where_cosh_squared_overflows_the_format(path, scores):
    """At g = 1 the backward is c/cosh²(q)/c, q = fl(a/c): 0 exactly where fl(fl(cosh q)²) is infinite. cosh is
    taken in float64 and rounded to the format; the overflow edges here lie far from any rounding tie of cosh, so
    the C library's coshf (within an ulp) reaches the same edge, and the first zero is asserted exactly."""
    dtype = formats.resolve(scores)
    for c in (30.0, 50.0):
        values = _values(dtype, c, 1.0 if dtype.itemsize == 2 else 40.0, 50.0)  # cosh grows: none overflows below
        with np.errstate(over="ignore"):
            ch = np.cosh(_quotient(values, dtype, c).astype(np.float64)).astype(np.float32).astype(dtype)
            square = (ch.astype(np.float32) * ch.astype(np.float32)).astype(dtype).astype(np.float64)
        inf = np.isinf(square)
        assert inf.any() and inf[np.argmax(inf):].all()
        found = registry.first_zero(path, scores, c)
        assert found.source == "measured" and found.monotone
        assert found.value == float(values[np.argmax(inf)].astype(np.float64))


@pytest.mark.parametrize("scores, g", [("bf16", 2.0 ** -60), ("fp16", 2.0 ** -12), ("fp32", 2.0 ** -60)])
def test_a_smaller_upstream_gradient_moves_mlx_zeros_down_to_where_the_quotient_underflows(scores, g):
    """At an upstream g < 1 the gradient g/cosh²(q) dies where it falls below half the format's smallest
    subnormal s. Each of MLX's roundings before the last moves it by a few units of the format's precision at most
    (2⁻⁸ relative in bf16), and the last by at most s/2; so it is not 0 where g/cosh²(q) ≥ 2s and 0 where it is
    ≤ s/4."""
    dtype = formats.resolve(scores)
    c = 30.0
    values = _values(dtype, c, 1.0, 46.0)
    stack = registry.STACKS["mlx-cpu"]
    got = registry.gradient(stack, values, dtype, c, upstream=np.full(values.shape, g))
    exact = g / np.cosh(_quotient(values, dtype, c).astype(np.float64)) ** 2
    s = float(ml_dtypes.finfo(dtype).smallest_subnormal)
    live, dead = exact >= 2 * s, exact <= s / 4
    assert live.any() and dead.any()
    assert np.all(got[live] != 0) and np.all(got[dead] == 0)
    first = float(values[np.argmax(got == 0)].astype(np.float64))
    assert first < registry.first_zero("mlx-cpu", scores, c).value


def test_an_upstream_gradient_is_refused_by_a_stack_whose_zeros_do_not_depend_on_it():
    with pytest.raises(ValueError, match="takes none"):
        registry.gradient(registry.STACKS["torch-eager-cpu"], np.ones(3), np.dtype(np.float32), 30.0,
                          upstream=np.ones(3))


def _step(a: np.ndarray, da: np.ndarray, g: np.ndarray) -> tr.Step:
    return tr.Step(0.0, a, {}, a, da, g)


def test_a_route_on_mlx_is_compared_position_by_position_at_its_own_upstream_gradient():
    """A route whose gradient is MLX's at its own dL/dz agrees at every position; one whose backward reads the
    output (1 − t², zero from tanh's knee on, as torch's eager code does) is told apart, with the count."""
    c, dtype = 30.0, np.dtype(np.float32)
    rng = np.random.default_rng(0)
    a = np.sort(rng.uniform(-200.0, 1500.0, (4, 64)).astype(np.float32), axis=None).reshape(4, 64).astype(np.float64)
    g = rng.uniform(1e-4, 1e-2, a.shape).astype(np.float32).astype(np.float64)
    own = registry.gradient(registry.STACKS["mlx-cpu"], a, dtype, c, upstream=g).reshape(a.shape)
    t = np.tanh(_quotient(a, dtype, c).astype(np.float64)).astype(np.float32)
    other = np.where(t == 1.0, 0.0, g * (1.0 - t.astype(np.float64) ** 2))
    ids = np.zeros(4, dtype=np.int64)
    same = train_parity.upstream_agreement([_step(a, own, g)], c, ids, "mlx-cpu", "fp32")
    differs = train_parity.upstream_agreement([_step(a, other, g)], c, ids, "mlx-cpu", "fp32")
    positive = int((a > 0).sum())
    assert same["agrees"] is True and same["pointwise"]["positions"] == positive == same["pointwise"]["same"]
    assert differs["agrees"] is False and differs["pointwise"]["same"] < positive
    assert same["stack_first_zero"] == registry.first_zero("mlx-cpu", "fp32", c).value
    rows = [{"cap": "final", "precision": "fp32", "c": c, "model": "gemma2", "engine": e, "route": "full",
             "first_dead": 1363.3, "last_alive": 1347.3, **found} for e, found in (("mlx-lm", same), ("x", differs))]
    said = train_results._zeros(rows)
    assert "1 of 2 routes give 0 exactly where mlx-cpu (float32) gives 0 at the route's own a and dL/dz" in said
    assert (f"not x (full on gemma2): {positive - differs['pointwise']['same']} of {positive} positions differ"
            in said), said
