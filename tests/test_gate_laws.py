"""The gate laws (sigmoid and softplus per format) against a brute force over every value, and against torch's
real backward, eager and compiled; the command line's --fn handling."""

import math

import numpy as np
import pytest
import torch

from softcapgrad.laws import formats, gates
from softcapgrad.stacks import gates as measured
from softcapgrad.stacks.runners import cxx_compiler_missing

BF16, FP16 = formats.resolve("bf16"), formats.resolve("fp16")


def _sigmoid64(x: np.ndarray) -> np.ndarray:
    """σ in float64 from the side where it does not overflow: good to a few ulps, far from the formats' midpoints."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _first_from_0(x: np.ndarray, holds: np.ndarray) -> tuple[float | None, bool]:
    """The first x (going out from 0) where ``holds``, and whether it holds at every x past it too."""
    if not holds.any():
        return None, True
    i = int(np.argmax(holds))
    return float(x[i]), bool(holds[i:].all())


def brute_force(dtype: np.dtype) -> dict[str, tuple[float | None, bool]]:
    """Every point, by rounding float64 σ and softplus of every positive and negative value to the format."""
    v = formats.positive_values(dtype).astype(np.float64)
    info = formats.finfo(dtype)

    def stored(values: np.ndarray) -> np.ndarray:
        return values.astype(dtype).astype(np.float64)

    sig_pos, sig_neg = stored(_sigmoid64(v)), stored(_sigmoid64(-v))
    soft_pos, soft_neg = stored(np.logaddexp(0.0, v)), stored(np.logaddexp(0.0, -v))
    found = {
        "one": _first_from_0(v, sig_pos == 1.0),
        "subnormal": _first_from_0(-v, sig_neg < float(info.smallest_normal)),
        "zero": _first_from_0(-v, sig_neg == 0.0),
        "equals_x": _first_from_0(v, soft_pos == v),
        "output_zero": _first_from_0(-v, soft_neg == 0.0),
    }
    found["grad_one"], found["grad_zero"] = found["one"], found["zero"]  # softplus' gradient is σ itself
    return found


@pytest.mark.parametrize("dtype", [BF16, FP16], ids=["bf16", "fp16"])
def test_every_point_matches_a_brute_force_over_every_value(dtype):
    want = brute_force(dtype)
    for fn in gates.GATES:
        for p in gates.gate_points(dtype, fn):
            assert (p.first_input, p.monotone if p.first_input is not None else True) == want[p.point], p


def test_the_bf16_and_fp16_figures():
    got = {(d.name, p.point): p.first_input for d in (BF16, FP16) for fn in gates.GATES for p in gates.gate_points(d, fn)}
    assert got[("bfloat16", "one")] == 6.25 and got[("bfloat16", "zero")] == -93.0
    assert got[("bfloat16", "subnormal")] == -87.5 and got[("bfloat16", "equals_x")] == 4.15625
    assert got[("float16", "one")] == 8.3203125 and got[("float16", "zero")] == -17.34375
    assert got[("float16", "equals_x")] == 6.23828125


@pytest.mark.parametrize("name", ["bf16", "fp16", "fp32", "fp64", "e4m3fn", "e5m2"])
def test_the_real_threshold_lies_between_the_last_value_inside_and_the_first_past_it(name):
    dtype = formats.resolve(name)
    for fn in gates.GATES:
        for p in gates.gate_points(dtype, fn):
            if p.formula is None or p.last_before is None:
                continue
            lo, hi = sorted((abs(p.last_before), abs(p.first_input)))
            if dtype.itemsize < 8:
                assert lo < abs(p.formula) <= hi, p
            else:  # the formula is a float64 itself: the real threshold between two of them rounds onto either
                assert lo <= abs(p.formula) <= hi, p


def test_the_closed_forms():
    # σ rounds to 0 below half the smallest value: logit(2^−134) for bf16, ≈ −134·ln 2
    zero = gates.gate_point(BF16, "zero").formula
    assert zero == pytest.approx(-134 * math.log(2), abs=1e-12)
    # softplus(x) = x once e^−x is below half the spacing 2^(2−7) of [4, 8): x ≈ 6·ln 2, to e^−x/2 ≈ 0.008
    assert gates.gate_point(BF16, "equals_x").formula == pytest.approx(6 * math.log(2), abs=0.01)
    # fp64: s/2 = 2^−1075 is below float64's own smallest value, and still its threshold is found exactly
    assert gates.gate_point(formats.resolve("fp64"), "zero").first_input == pytest.approx(-1075 * math.log(2), rel=1e-15)


def test_a_format_without_negative_values_has_no_negative_side():
    p = gates.gate_point(formats.resolve("float8_e8m0fnu"), "zero")
    assert (p.first_input, p.formula, p.method) == (None, None, "no negative values")


@pytest.mark.parametrize("dtype", [BF16, FP16], ids=["bf16", "fp16"])
def test_the_sigmoid_backward_from_a_stored_value_strictly_inside_0_1_is_never_0(dtype):
    assert gates.backward_never_zero_inside(dtype)
    assert not gates.backward_never_zero_inside(formats.resolve("fp4e2m1fn"))  # 0.5·0.5 ties down to 0


# --- torch's real backward ---------------------------------------------------------------------


@pytest.mark.parametrize("name", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("fn", gates.GATES)
def test_eager_backward_is_zero_exactly_where_torchs_formula_says(name, fn):
    dtype = formats.resolve(name)
    for row in measured.gate_rows(dtype, fn, ["eager"]):
        assert row["monotone"] in (True, None), row
        assert row["first_zero_grad_input"] == row["law_torch_formula"], row


def test_where_torch_and_a_correctly_rounded_sigmoid_part():
    rows = {(r["dtype"], r["side"]): r for name in ("bf16", "fp32")
            for r in measured.gate_rows(formats.resolve(name), "sigmoid", ["eager"])}
    # bf16: e^−x overflows float32 from x < −88.72, so σ is 0 from −89 although a correctly rounded σ is 0 only from −93
    assert rows[("bfloat16", "−")]["first_zero_grad_input"] == -89.0 and rows[("bfloat16", "−")]["law_exact"] == -93.0
    assert rows[("bfloat16", "+")]["first_zero_grad_input"] == rows[("bfloat16", "+")]["law_exact"] == 6.25
    # fp32: 1 + e^−x rounds to 1 from e^−x ≤ 2^−24, x ≥ 24·ln 2 = 16.64, before the correctly rounded 17.33
    assert rows[("float32", "+")]["first_zero_grad_input"] == pytest.approx(24 * math.log(2), abs=1e-5)
    assert rows[("float32", "+")]["law_exact"] == pytest.approx(25 * math.log(2), abs=1e-5)


def test_a_tiny_stored_sigmoid_still_passes_a_gradient():
    x = np.array([-88.5, -60.0])  # σ subnormal in bf16 at −88.5, normal at −60: both above 0
    grad = measured.gate_gradient(x, BF16, "sigmoid")
    stored = torch.sigmoid(torch.tensor(x).to(torch.bfloat16)).double().numpy()
    assert (stored > 0).all() and stored[0] < float(formats.finfo(BF16).smallest_normal)
    np.testing.assert_array_equal(grad, stored)  # y(1 − y) = y: 1 − y rounds to 1


@pytest.mark.skipif(bool(cxx_compiler_missing()), reason="torch.compile on the CPU needs a C++ compiler")
def test_compiled_bf16_sigmoid_backward_is_zero_where_eager_is():
    rows = measured.gate_rows(BF16, "sigmoid", ["compiled"])
    assert [(r["side"], r["first_zero_grad_input"]) for r in rows] == [("+", 6.25), ("−", -89.0)]
    assert all(r["agrees_with"] in ("both", "torch's formula") and r["monotone"] for r in rows)


# --- the command line -------------------------------------------------------------------------


@pytest.mark.parametrize("args", [
    ("horizon", "--fn", "unknown"),
    ("horizon", "--fn", "sigmoid", "--cap", "30"),
    ("horizon", "--fn", "softplus", "--at", "3"),
    ("horizon", "--fn", "sigmoid", "--path", "torch-eager-cpu"),
    ("horizon", "--fn", "sigmoid", "--dtype", "e4m3fn"),
    ("horizon", "--fn", "sigmoid", "--dtype", "nope"),
    ("knee", "--fn", "softplus", "--cap", "30"),
    ("knee", "--fn", "softplus", "--backend", "torch"),
    ("knee", "--fn", "softplus", "--plot", "knee.png"),
    ("knee", "--fn", "softmax"),
])
def test_bad_gate_input_is_one_line_and_exit_2(cli, args):
    code, _, out, err = cli(*args)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, (code, out, err)
    assert err.startswith("softcapgrad: error:")


def test_knee_softplus_json(cli):
    code, data, _, _ = cli("knee", "--fn", "softplus", "--dtype", "bf16", "--json")
    assert code == 0 and data["params"]["fns"] == ["softplus"]
    points = {r["point"]: r["first_input"] for r in data["gate_rows"]}
    assert points == {"equals_x": 4.15625, "grad_one": 6.25, "grad_zero": -93.0, "output_zero": -93.0}
    assert "4.15625" in data["answer"][0]


def test_knee_sigmoid_keeps_its_knee_and_adds_both_sides(cli):
    code, data, _, _ = cli("knee", "--fn", "sigmoid", "--json")
    assert code == 0 and data["rows"][0]["first_saturating_input"] == 6.25
    assert {r["point"]: r["torch_formula"] for r in data["gate_rows"]}["zero"] == -89.0
    assert len(data["answer"]) == 2 and "-93" in data["answer"][1]


@pytest.mark.skipif(bool(cxx_compiler_missing()), reason="torch.compile on the CPU needs a C++ compiler")
def test_horizon_fn_sigmoid_json(cli):
    code, data, _, _ = cli("horizon", "--fn", "sigmoid", "--json")
    assert code == 0 and data["params"] == {"fn": "sigmoid", "dtype": "bfloat16", "engines": ["eager", "compiled"],
                                            "upstream": 1.0, "loss_scale": 1.0, "g": 1.0}
    assert [(r["side"], r["engine"], r["first_zero_grad_input"]) for r in data["rows"]] == [
        ("+", "eager", 6.25), ("+", "compiled", 6.25), ("−", "eager", -89.0), ("−", "compiled", -89.0)]
    assert 1 <= len(data["answer"]) <= 3 and "-89" in data["answer"][0]


# --- an upstream gradient other than 1 ----------------------------------------------------------

UPSTREAMS = [1.0, 1e-3, 1e-6]  # ones; a small gradient; the one at which fp16's σ dies from |x| ≈ 3.5


def _brute_zeros(dtype: np.dtype, fn: str, side: str, g: float) -> tuple[float | None, float | None]:
    """(first zero, start of the last run of zeros) of torch's eager backward with every element's upstream g, over
    every value of the format on one side, going out from 0."""
    sign = 1.0 if side == "+" else -1.0
    v = formats.positive_values(dtype).astype(np.float64)
    x = torch.from_numpy(sign * v).to(formats.torch_dtype(dtype)).requires_grad_()
    f = torch.sigmoid if fn == "sigmoid" else torch.nn.functional.softplus
    y = f(x)
    (grad,) = torch.autograd.grad(y, x, torch.full_like(y, g))
    zero = (grad == 0).numpy()
    if not zero.any():
        return None, None
    live = np.flatnonzero(~zero)
    last = int(live[-1]) + 1 if live.size else 0
    return sign * v[int(np.argmax(zero))], (sign * v[last] if last < v.size else None)


@pytest.mark.parametrize("upstream", UPSTREAMS)
@pytest.mark.parametrize("fn", gates.GATES)
@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_the_first_zero_for_an_upstream_g_is_torch_s_backward_over_every_value(name, fn, upstream):
    """gate_rows with an upstream g against autograd over every value of the format: the first zero and where every
    gradient is 0 from, each side; and the law (torch's formula times g) gives the first zero too."""
    dtype = formats.resolve(name)
    g = measured.upstream_in(dtype, upstream)
    for row in measured.gate_rows(dtype, fn, ["eager"], g=g):
        want = _brute_zeros(dtype, fn, row["side"], g)
        assert (row["first_zero_grad_input"], row["every_zero_from"]) == want, row
        assert row["law_torch_formula"] == want[0] and row["agrees_with"] in ("both", "torch's formula"), row


@pytest.mark.parametrize("upstream", UPSTREAMS)
@pytest.mark.parametrize("fn", gates.GATES)
def test_the_fp32_first_zero_for_an_upstream_g_is_where_torch_s_backward_turns_0(fn, upstream):
    """fp32 is bisected: torch's backward is 0 at the first zero found, not at the value just inside it, and
    torch's formula times g puts it at the same value."""
    dtype = formats.resolve("fp32")
    for row in measured.gate_rows(dtype, fn, ["eager"], g=upstream):
        x = row["first_zero_grad_input"]
        if x is None:
            assert fn == "softplus" and row["side"] == "+"  # σ(x)·g ≥ g/2 for x > 0: never 0
            continue
        inside = float(np.nextafter(np.float32(x), np.float32(0)))
        grads = measured.gate_gradient(np.array([x, inside]), dtype, fn, g=upstream)
        assert grads[0] == 0 and grads[1] != 0 and row["law_torch_formula"] == x, row


def test_fp16_sigmoid_at_a_small_upstream_dies_early_and_not_monotonically():
    """fp16, g = fp16(1e-6) ≈ 1.013e-6 (subnormal): (g·(1 − y))·y rounds to 0 from x ≈ 3.49 and −3.43, far inside the
    points for g = 1 (8.32 and −17.34); on the negative side some inputs past the first zero get a gradient again."""
    rows = {r["side"]: r for r in measured.gate_rows(FP16, "sigmoid", ["eager"], g=measured.upstream_in(FP16, 1e-6))}
    assert rows["+"]["first_zero_grad_input"] == rows["+"]["every_zero_from"] == 3.4921875
    assert rows["−"]["first_zero_grad_input"] == -3.43359375 and rows["−"]["every_zero_from"] == -3.498046875
    assert rows["−"]["monotone"] is False


def test_horizon_upstream_and_loss_scale_json(cli, monkeypatch):
    """--upstream G --loss-scale S: g = G·S rounded to the format, in the params and rows; S = 2^16 brings fp16's
    g = 1e-6 back to where g = 1e-6·2^16 puts the first zero; a product that rounds to 0 is one line, exit 2."""
    monkeypatch.setattr(measured.runners, "cxx_compiler_missing", lambda: "not compiled here")  # eager rows only
    code, data, _, _ = cli("horizon", "--fn", "sigmoid", "--dtype", "fp16", "--upstream", "1e-6", "--loss-scale",
                           "65536", "--json")
    g = float(np.float16(1e-6 * 65536))
    assert code == 0 and data["params"]["g"] == g and data["params"]["loss_scale"] == 65536
    scaled = {r["side"]: r["first_zero_grad_input"] for r in data["rows"] if r["engine"] == "eager"}
    plain = {r["side"]: r["first_zero_grad_input"] for r in measured.gate_rows(FP16, "sigmoid", ["eager"], g=g)}
    assert scaled == plain and scaled["+"] > 3.5
    code, _, _, err = cli("horizon", "--fn", "sigmoid", "--dtype", "fp16", "--upstream", "1e-9")
    assert code == 2 and "rounds to 0" in err and len(err.strip().splitlines()) == 1
    code, _, _, err = cli("horizon", "--upstream", "0.5")
    assert code == 2 and "--upstream" in err


def test_stacks_gate_rows_take_the_upstream_as_horizon_does(cli):
    """stacks --upstream G --loss-scale S: each format's gate rows for g = G·S rounded to it, the rows gate_rows gives
    there (tested above against autograd over every value); fp16 at g = 1e-6 dies from 3.49, not 8.32; a G·S that
    rounds to 0 in one format is one line, exit 2."""
    code, data, _, _ = cli("stacks", "--upstream", "1e-6", "--json")
    assert code == 0 and data["params"]["upstream"] == 1e-6 and data["params"]["loss_scale"] == 1.0
    fp16 = [r for r in data["gates"] if r["dtype"] == "float16" and r["fn"] == "sigmoid"]
    g = measured.upstream_in(FP16, 1e-6)
    assert fp16 == measured.gate_rows(FP16, "sigmoid", ["eager"], g=g) and fp16[0]["upstream"] == g
    assert {r["side"]: r["first_zero_grad_input"] for r in fp16}["+"] == 3.4921875
    code, _, _, err = cli("stacks", "--upstream", "1e-9")
    assert code == 2 and "rounds to 0 in float16" in err and len(err.strip().splitlines()) == 1
