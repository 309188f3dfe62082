"""gate-demo: every law against autograd, the Laguna backward by hand, overflow points, cost counts."""

import math

import numpy as np
import pytest
import torch

from softcapgrad.laws import formats
from softcapgrad.demos import gates


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_backward_laws_against_autograd(seed):
    rows = gates.backward_laws(seed)
    assert len(rows) == 5
    for row in rows:
        assert row["max_abs_error"] <= 1e-12, row
    assert rows[1]["min_value"] > 0  # softplus is convex


def test_competition_and_independence():
    rows = gates.competition([1.0, 2.0, 3.0], 2, 1.0)
    assert sum(r["softmax"] for r in rows) == pytest.approx(1.0, abs=4e-16)
    assert all(r["softmax_after"] < r["softmax"] for r in rows[:2])
    assert all(r["softplus_after"] == r["softplus"] for r in rows[:2])  # bit-identical: no shared denominator
    e = np.exp([1.0, 2.0, 3.0])
    np.testing.assert_allclose([r["softmax"] for r in rows], e / e.sum(), rtol=4e-16)
    assert gates.softplus_at(0.0) == math.log(2)


def test_asymptotes_tighten():
    rows = gates.asymptotes([-20, -10, -5, 5, 10, 20])
    neg, pos = rows[:3], rows[3:]
    assert abs(neg[0]["rel_error_vs_exp"]) < abs(neg[1]["rel_error_vs_exp"]) < abs(neg[2]["rel_error_vs_exp"])
    assert pos[0]["abs_error_vs_x"] > pos[1]["abs_error_vs_x"] > pos[2]["abs_error_vs_x"] > 0


SHAPES = [
    gates.Shape(B=1, T=4, D=16, H_q=2, H_kv=2, d_h=4),
    gates.Shape(B=3, T=7, D=24, H_q=6, H_kv=2, d_h=8),
    gates.Shape(B=2, T=5, D=16, H_q=4, H_kv=1, d_h=4),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"B{s.B}T{s.T}Hq{s.H_q}Hkv{s.H_kv}")
@pytest.mark.parametrize("seed", [0, 7])
def test_laguna_hand_gradients_match_autograd(shape, seed):
    rows = gates.laguna_check(shape, seed)
    names = [r["gradient"] for r in rows]
    assert names == ["∂L/∂A", "∂L/∂G", "∂L/∂Z_g", "∂L/∂W_g", "∂L/∂H|gate", "∂L/∂H|attention", "∂L/∂H"]
    for row in rows:
        # float64 sums of O(D) terms: relative to the gradient's scale, well inside 1e-12
        assert row["max_abs_error"] <= 1e-12 * max(1.0, row["max_abs_value"]), row
    shapes = {r["gradient"]: r["shape"] for r in rows}
    assert shapes["∂L/∂G"] == [shape.B, shape.T, shape.H_q]  # one gate per head: the reduction over d_h happened
    assert shapes["∂L/∂W_g"] == [shape.D, shape.H_q]


def test_missing_channel_reduction_is_wrong():
    shape = SHAPES[1]
    p = gates._weights(shape, 0)
    f = gates.gated_attention(p, shape)
    hand = gates.gate_backward_by_hand(p, f, shape)
    U = (p["R"] @ p["W_O"].T).view(shape.B, shape.T, shape.H_q, shape.d_h)
    one_channel = (U * f["A"])[..., 0]
    assert (one_channel - hand["G"]).abs().max() > 1e-3


def test_gate_rounding_within_unit_roundoff():
    out = gates.gate_rounding(SHAPES[1], 0)
    assert 0 < out["max_rel_rounding_error"] <= out["unit_roundoff"] == 2.0**-8


@pytest.mark.parametrize("name", ["fp16", "bf16", "fp32", "fp64"])
def test_overflow_point_against_ln_max(name):
    row = gates.overflow_point(formats.resolve(name))
    assert row["last_finite_input"] <= row["ln_overflow_threshold"] <= row["first_overflow_input"]
    assert row["first_overflow_input"] >= row["ln_max"]
    assert row["naive"] == math.inf
    assert row["stable"] == row["torch_softplus"] == row["first_overflow_input"]  # softplus(x) rounds to x there
    assert row["naive_sigmoid_exp_ratio"] == "∞/∞, undefined" and row["sigmoid_two_branch"] == 1.0
    assert 0 < row["sigmoid_two_branch_at_minus_x"] < 1e-4


def test_cost_counts_against_closed_forms():
    cfg = gates.Config(D=3072, H_kv=8, d_h=128)
    layer = gates.layer_cost(cfg, 48)
    assert layer["gate_values_per_token"] == 48 and layer["attention_channels_per_token"] == 48 * 128
    assert layer["gate_params"] == 3072 * 48
    assert layer["qkvo_params"] == 3072 * 128 * (48 + 8 + 8 + 48)
    t1, t2 = gates.flops(cfg, [48, 32], 1000), gates.flops(cfg, [48, 32], 2000)
    assert t2["gate_flops"] == 2 * t1["gate_flops"]  # linear in T
    assert t2["attention_core_flops"] * 1000 * 1001 == t1["attention_core_flops"] * 2000 * 2001  # T(T+1)
    assert t1["gate_flops"] == sum(1000 * h * (2 * 3072 + 1 + 128) for h in (48, 32))


def test_cli_sections_json_and_bad_input(cli):
    code, data, _, _ = cli("gate-demo", "--section", "cost", "--heads", "48", "--heads", "32", "--tokens", "4096", "--json")
    assert code == 0 and [r["H_q"] for r in data["rows"]] == [48, 32]
    assert data["cost_tokens"][0]["T"] == 4096
    code, data, _, _ = cli("gate-demo", "--json")
    assert code == 0 and {"rows", "backward", "laguna", "cost_layers", "stability"} <= set(data)
    for args in (["--heads", "0"], ["--tokens", "-5"], ["--section", "nope"], ["--model-dim", "0"]):
        code, _, _, err = cli("gate-demo", *args)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
