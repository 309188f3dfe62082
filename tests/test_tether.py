"""TetherGate: each behaviour its document lists, plus the engineering contract of the module."""

import math

import pytest
import torch

from softcapgrad.core import chunks
from softcapgrad.core.checks import InputError
from softcapgrad.training.tether import FloorSchedule, TetherGate, floor_schedule, tethergate_step, tethergate_step_per_gate
from softcapgrad.demos.tether_demo import anchors, clamp_recovery, collapse, stability_boundary, steady_push

F32_EPS = torch.finfo(torch.float32).eps
SLEEP = FloorSchedule("exp", ramp_start=10**9)  # F stays 1
AWAKE = FloorSchedule("exp", ramp_start=0, tau=1.0)  # F < 1 from step 1


def _gate(n=4, **kw):
    g = TetherGate(n, **kw)
    return g


def test_forward_floor_formula():
    g = _gate(3)
    g.floor.copy_(torch.tensor([1.0, 0.4, 0.0]))
    s = torch.tensor([[-2.0, 0.1, 0.7]])
    out = g.eval()(s)
    raw = torch.sigmoid(torch.clamp(6.0 * (s - g.theta), -8, 8))
    torch.testing.assert_close(out, g.floor + (1 - g.floor) * raw, rtol=0, atol=0)
    assert out[0, 0] == 1.0 and bool((out >= g.floor).all())


def test_live_gradient_below_the_floor():
    g = _gate(1).eval()
    g.floor.fill_(0.3)
    s = torch.tensor([[-1.0]])  # β(s − θ) = −6: g_raw ≈ 0.0025, far below the floor
    out = g(s)
    (grad,) = torch.autograd.grad(out.sum(), g.theta)
    a = torch.tensor(-6.0)
    expected = -(1 - 0.3) * 6.0 * torch.sigmoid(a) * (1 - torch.sigmoid(a))
    assert float(out.detach()) < 0.31 and grad[0] != 0
    torch.testing.assert_close(grad[0], expected, rtol=4 * F32_EPS, atol=0)


def test_zero_gradient_beyond_clamp_and_recovery_through_spring():
    row = clamp_recovery(1e-2, 20.0, 3.0)
    assert row["loss_grad_on_theta"] == 0.0
    assert row["spring_steps_to_reenter"] == row["closed_form_steps"] > 0


@pytest.mark.parametrize("detach", [True, False])
def test_detach_signal(detach):
    g = _gate(2, detach_signal=detach).eval()
    g.floor.fill_(0.0)
    s = torch.tensor([[0.2, -0.1]], requires_grad=True)
    g(s).sum().backward()
    assert (s.grad is None) == detach


def test_ema_initialises_then_updates_only_in_train():
    g = _gate(2, ema_decay=0.9)
    assert bool(torch.isnan(g.ema_s).all())
    g.train()(torch.tensor([[1.0, 3.0], [3.0, 5.0]]))
    assert g.ema_s.tolist() == [2.0, 4.0]  # first observation: the mean itself
    g(torch.tensor([[12.0, 14.0]]))
    torch.testing.assert_close(g.ema_s, torch.tensor([0.9 * 2 + 0.1 * 12, 0.9 * 4 + 0.1 * 14]))
    before = g.ema_s.clone()
    g.eval()(torch.tensor([[100.0, 100.0]]))
    assert torch.equal(g.ema_s, before)


def test_spring_reaches_its_target_at_the_geometric_rate():
    g = _gate(3)
    g(torch.tensor([[0.5, 1.0, -1.0]]))
    target = g.ema_s - math.log(0.8 / 0.2) / 6.0
    k, n = 1e-2 * 20.0, 60
    start = (g.theta - target).detach().abs()
    for step in range(1, n + 1):
        tethergate_step(g, step, AWAKE, lr=1e-2, wd=20.0, g_target=0.8, anchor="local")
    left = (g.theta - target).detach().abs()
    assert bool((left <= start * (1 - k) ** n + 8 * F32_EPS).all())


def test_sleeping_spring_uses_kappa_and_theta_gets_no_loss_gradient():
    g = _gate(2)
    g(torch.tensor([[1.0, 1.0]]))
    (grad,) = torch.autograd.grad(g.eval()(torch.tensor([[0.3, -0.2]])).sum(), g.theta)
    assert bool((grad == 0).all())  # F = 1: g = 1 + 0·g_raw
    tethergate_step(g, 1, SLEEP, lr=1e-2, wd=20.0, kappa_sleep=0.5)
    torch.testing.assert_close(g.theta.detach(), torch.full((2,), 0.5))  # halfway to θ* = 1
    assert bool((g.floor == 1).all())


def test_equilibrium_independent_of_lr_within_lr_wd():
    rows = steady_push([1e-3, 1e-2, 1e-1], [0.5])
    for r in rows:
        # fixed point (1 − lr·wd)/wd; after 8 time constants e^−8 of the start remains (3.4e-4 relative)
        assert r["offset"] * r["wd"] == pytest.approx(1 - r["lr_wd"], abs=1e-3)
        assert abs(r["offset"] * r["wd"] - 1) <= r["lr_wd"] + 1e-3
        assert r["time_constant"] == pytest.approx(1 / r["lr_wd"], rel=0.05, abs=1)


def test_unstable_spring_is_flagged():
    rows = steady_push([0.15], [20.0])
    assert rows[0]["regime"] == "diverges" and rows[0]["time_constant"] is None
    assert stability_boundary() == pytest.approx(2.0, abs=0.02)  # |1 − lr·wd| < 1


def test_collapse_plain_closes_tether_holds():
    rows = collapse(600, 1e-2, 20.0, 0.5, 0, [600])
    assert rows[-1]["plain_mean_gate"] < 0.05
    assert abs(rows[-1]["tether_mean_gate"] - 0.5) < 0.1


def test_global_vs_local_anchor():
    rows = anchors([-1.0, 0.0, 2.0], 2000, 1e-2, 20.0, 0.5)
    glob = [r for r in rows if r["anchor"] == "global"]
    loc = [r for r in rows if r["anchor"] == "local"]
    assert len({r["theta"] for r in glob}) == 1 and glob[0]["theta"] == pytest.approx(1 / 3, abs=1e-5)
    for r in loc:
        assert r["theta"] == pytest.approx(r["signal_mean"], abs=1e-5)
        assert r["opening_at_mean_signal"] == pytest.approx(0.5, abs=1e-5)


def test_nan_ema_gates_are_skipped():
    g = _gate(3)
    g.ema_s.copy_(torch.tensor([1.0, float("nan"), 2.0]))
    tethergate_step(g, 5, AWAKE, lr=1e-2, wd=20.0, anchor="global")
    assert g.theta[1] == 0.0 and g.floor[1] == 1.0
    assert g.theta[0] == g.theta[2] != 0.0 and g.floor[0] < 1.0
    torch.testing.assert_close(g.theta[0], torch.tensor(0.2 * 1.5))  # mean over the gates with an EMA


@pytest.mark.parametrize("anchor", ["global", "local"])
def test_vectorised_step_matches_per_gate_loop_exactly(anchor):
    gen = torch.Generator().manual_seed(3)
    a, b = _gate(16), _gate(16)
    ema = torch.randn(16, generator=gen)
    ema[[2, 9]] = float("nan")
    theta = torch.randn(16, generator=gen)
    for g in (a, b):
        g.ema_s.copy_(ema)
        with torch.no_grad():
            g.theta.copy_(theta)
    for step in (0, 1, 7, 40):
        for sched in (SLEEP, AWAKE):
            fa = tethergate_step(a, step, sched, lr=3e-3, wd=20.0, g_target=0.7, anchor=anchor)
            fb = tethergate_step_per_gate(b, step, sched, lr=3e-3, wd=20.0, g_target=0.7, anchor=anchor)
            assert fa == fb
            assert torch.equal(a.theta, b.theta) and torch.equal(a.floor, b.floor)


def test_state_dict_round_trip():
    g = _gate(3)
    g.ema_s[0] = 1.5
    g.floor.fill_(0.25)
    with torch.no_grad():
        g.theta.copy_(torch.tensor([0.1, 0.2, 0.3]))
    state = g.state_dict()
    assert set(state) == {"theta", "floor", "ema_s"}
    h = _gate(3)
    h.load_state_dict(state)
    assert torch.equal(h.theta, g.theta) and torch.equal(h.floor, g.floor)
    assert torch.equal(torch.isnan(h.ema_s), torch.isnan(g.ema_s)) and h.ema_s[0] == 1.5


def test_compiled_forward_has_no_graph_break():
    g = _gate(4)
    s = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
    eager = _gate(4)
    compiled = torch.compile(g, fullgraph=True, backend="aot_eager")
    for _ in range(2):  # the first call initialises the EMA, the second blends it
        torch.testing.assert_close(compiled(s), eager(s), rtol=0, atol=0)
    torch.testing.assert_close(g.ema_s, eager.ema_s, rtol=0, atol=0)


def test_floor_schedules():
    assert floor_schedule(50, "exp", ramp_start=100, tau=10) == 1.0
    assert floor_schedule(110, "exp", ramp_start=100, tau=10, f_min=0.2) == pytest.approx(0.2 + 0.8 * math.exp(-1))
    assert floor_schedule(100, "cos", ramp_start=100, ramp_end=300, f_min=0.1) == 1.0
    assert floor_schedule(200, "cos", ramp_start=100, ramp_end=300, f_min=0.1) == pytest.approx(0.55)
    assert floor_schedule(300, "cos", ramp_start=100, ramp_end=300, f_min=0.1) == 0.1
    values = [floor_schedule(t, "exp", 0, 0.05, 30.0) for t in range(0, 500, 10)]
    assert all(x > y for x, y in zip(values, values[1:])) and values[-1] > 0.05


@pytest.mark.parametrize(
    "make",
    [
        lambda: TetherGate(2, beta=0.0),
        lambda: TetherGate(2, beta=-1.0),
        lambda: FloorSchedule(f_min=1.0),
        lambda: FloorSchedule(f_min=-0.1),
        lambda: FloorSchedule("cos", ramp_start=10, ramp_end=10),
        lambda: tethergate_step(TetherGate(2), 1, AWAKE, lr=1e-2, wd=-1.0),
        lambda: tethergate_step(TetherGate(2), 1, AWAKE, lr=1e-2, wd=1.0, g_target=1.0),
        lambda: tethergate_step(TetherGate(2), 1, AWAKE, lr=1e-2, wd=1.0, g_target=0.0),
        lambda: tethergate_step(TetherGate(2), 1, AWAKE, lr=1e-2, wd=1.0, anchor="mean"),
    ],
)
def test_invalid_hyper_parameters(make):
    with pytest.raises(InputError):
        make()


def test_cli_sections(cli):
    code, data, _, _ = cli("tether-demo", "--section", "clamp", "--json")
    assert code == 0 and data["rows"][0]["loss_grad_on_theta"] == 0.0
    code, _, _, err = cli("tether-demo", "--section", "bogus")
    assert code == 2 and len(err.strip().splitlines()) == 1


def test_chunked_gate_matches_the_formula():
    """A signal large enough for the chunked CPU path: the forward bit for bit (NaN, clamp bounds, F = 0
    and F = 1 included); the gradient of θ within float32 rounding of its batch sum of the float64 one."""
    gen = torch.Generator().manual_seed(5)
    n, beta = 96, 4.0
    g = _gate(n, beta=beta)
    with torch.no_grad():
        g.theta.copy_(torch.randn(n, generator=gen))
        g.theta[:4] = 0.0
    g.floor.copy_(torch.rand(n, generator=gen))
    g.floor[4:8], g.floor[8:12] = 1.0, 0.0
    s = torch.randn(700, n, generator=gen) * 2
    s[0, :4] = torch.tensor([2.0, -2.0, 2.0, -2.0])  # β(s − θ) = ±8 exactly: the clamp's bounds pass the gradient
    s[1, 20] = float("nan")
    assert s.numel() > chunks.CHUNK
    out = g.eval()(s)
    (grad,) = torch.autograd.grad(out.sum(), g.theta)
    formula = g.floor + (1 - g.floor) * torch.sigmoid(torch.clamp(beta * (s - g.theta), -8.0, 8.0))
    torch.testing.assert_close(out, formula, rtol=0, atol=0, equal_nan=True)
    s64, theta64 = s.double(), g.theta.detach().double().requires_grad_(True)
    f64 = g.floor.double()
    a = torch.clamp(beta * (s64 - theta64), -8.0, 8.0)
    (exact,) = torch.autograd.grad((f64 + (1 - f64) * torch.sigmoid(a)).sum(), theta64)
    sig = torch.sigmoid(a.detach())
    terms = (beta * (1 - f64) * sig * (1 - sig)).nan_to_num().abs().sum(0)
    assert bool((grad[4:8] == 0).all())  # F = 1: no loss gradient
    assert bool(((grad.double() - exact).abs() <= 8 * F32_EPS * terms).all())


@pytest.mark.parametrize("lr, wd, n", [(1e-3, 0.5, 16_000), (1e-2, 5.0, 1_600), (0.15, 0.5, 107)])
def test_the_push_descent_is_torch_adam_within_its_roundings(lr, wd, n):
    """The wd section's float32 Adam (numpy, one rounding per operation) against torch.optim.Adam and the
    same spring. They may differ only by roundings: a step's update differs by a few ulps of itself
    and each step rounds θ once; the spring shrinks an error by (1 − k) per step, k = lr·wd, so the two
    θ stay within 2·ulp(θ)/k of each other (4 ulps of θ per time constant 1/k)."""
    import numpy as np

    from softcapgrad.demos.tether_demo import adam_push_updates

    theta = torch.zeros(1, requires_grad=True)
    opt = torch.optim.Adam([theta], lr=lr)
    k = torch.tensor([lr * wd])
    ours = np.float32(0.0)
    u = adam_push_updates(lr, n)
    for step in range(n):
        theta.grad = -torch.ones(1)
        opt.step()
        with torch.no_grad():
            theta.sub_(k * theta)
        ours = np.float32(np.float32(ours + u[step]) - np.float32(np.float32(lr * wd) * np.float32(ours + u[step])))
    got = float(theta.detach()[0])
    bound = 2 * float(np.spacing(np.float32(abs(got)))) / (lr * wd)
    assert abs(float(ours) - got) <= bound
    assert abs(float(ours) - (1 - lr * wd) / wd) < 0.02 / wd  # and both sit at the document's 1/wd offset


def test_the_push_descent_updates_are_adams_first_steps():
    """Adam's first update under a constant gradient is lr·|g|/(|g| + ε) exactly up to float32 rounding:
    the bias corrections make m̂ = g and v̂ = g² at t = 1."""
    import numpy as np

    from softcapgrad.demos.tether_demo import adam_push_updates

    u = adam_push_updates(0.01, 3)
    assert u.dtype == np.float32
    assert abs(float(u[0]) - 0.01) <= 2 * float(np.spacing(np.float32(0.01)))
