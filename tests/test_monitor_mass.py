"""DeadZoneMonitor's "gradient mass lost": the share of the exact gradient's L1 mass that the backward set to 0,
checked against a brute-force fp64 sum, element by element, on a planted tensor (the mode over every op on the
first watched step, the learnt sites' hooks on the next)."""

import math

import pytest

torch = pytest.importorskip("torch")

from softcapgrad.training.monitor import DeadZoneMonitor  # noqa: E402


class Cap(torch.nn.Module):
    def forward(self, a):
        return torch.tanh(a / 30.0) * 30.0


def _planted():
    # bf16 pre-cap values from the live range to well past eager's horizon (|a| ≈ 104 at c = 30), both signs,
    # with upstream gradients of both signs and some exact zeros
    a = torch.linspace(-160.0, 160.0, 1601).to(torch.bfloat16)
    g = (torch.sin(torch.arange(1601, dtype=torch.float64) * 0.37) * 0.01).to(torch.bfloat16)
    g[::50] = 0
    return a, g


def _brute(x: torch.Tensor, upstream: torch.Tensor, grad: torch.Tensor) -> float:
    """Σ|upstream·sech²(x)| over the elements whose gradient is exactly 0, over Σ of all: one Python float (fp64)
    per element, sech² as 1/cosh², a formula of its own (the monitor's is 4e/(1 + e)²)."""
    lost = total = 0.0
    for xi, gi, di in zip(x.double().tolist(), upstream.double().tolist(), grad.double().tolist()):
        exact = abs(gi) / math.cosh(xi) ** 2
        total += exact
        lost += exact if di == 0.0 else 0.0
    return lost / total


def test_mass_lost_matches_a_brute_force_fp64_sum_on_both_watching_paths():
    a, g = _planted()
    # what the tanh itself sees: its input a/30 as bf16 stores it and its upstream 30·g as bf16 rounds it
    x = (a / 30.0)
    leaf = x.clone().requires_grad_(True)
    y = torch.tanh(leaf)
    up = (g * 30.0)
    y.backward(up)
    expected = _brute(x, up, leaf.grad)
    assert 0.0 < expected < 1.0  # some mass is lost, not all
    monitor, model = DeadZoneMonitor(every=1), Cap()
    shares = []
    for _ in range(2):
        with monitor.step():
            pre = a.clone().requires_grad_(True)
            z = model(pre)
            z.backward(g)
        shares.append(monitor.rows()[0].mass_lost)
        if len(shares) == 1:
            first = monitor.rows()[0]
            assert first.cap == 30.0 and first.zero_grad > 0
            monitor = DeadZoneMonitor(every=1, learnt_from=monitor)
            assert monitor.sites_only  # the next step watches the learnt module through hooks, not the mode
    # fp64 sums of the same 1601 terms by two formulas: each term within a few fp64 ulps, so the shares agree to
    # far better than 1e-12 relative
    assert shares[0] == pytest.approx(expected, rel=1e-12)
    assert shares[1] == pytest.approx(expected, rel=1e-12)


def test_nothing_is_lost_where_no_output_rounds_to_one():
    a = torch.linspace(-60.0, 60.0, 401).to(torch.bfloat16).requires_grad_(True)
    monitor = DeadZoneMonitor()
    with monitor:
        Cap()(a).backward(torch.ones(401, dtype=torch.bfloat16))
    row = monitor.rows()[0]
    assert row.zero_grad == 0 and row.mass_lost == 0.0
    assert "mass_lost" in monitor.table(width=100)


def test_no_backward_means_no_mass_figure():
    monitor = DeadZoneMonitor()
    with monitor, torch.no_grad():
        Cap()(torch.ones(4, dtype=torch.bfloat16))
    assert monitor.rows()[0].mass_lost is None
