"""The watch with no mode (training/gategraph.py) on the feeds Laguna's gates have: a cast of a child's output
(softplus(g_proj(h).float())) and the gate module's own output (a router's σ of the logits it returns).

Each model here is watched four steps on the same input: the first by the dispatch mode over every op, the second
by the dispatch mode over the gate modules (with the probe beside it), the third and fourth with no mode. The counts
of every step must be the first step's, which the brute force of test_gate_monitor checks on the real models; and
a feed that changes (another cast, the child's output changed in place) is not counted from a guess but said."""

import pytest
import torch

from softcapgrad.training.gatehealth import GateMonitor

F = torch.nn.functional


class CastFed(torch.nn.Module):
    """A bfloat16 projection whose output the gate reads cast to ``cast`` (Laguna's head gate in small);
    ``poke``: the projection's output is changed in place, without autograd, after the gate read its cast."""

    def __init__(self, fn: str = "softplus") -> None:
        super().__init__()
        self.g_proj = torch.nn.Linear(8, 8, bias=False, dtype=torch.bfloat16)
        with torch.no_grad():
            self.g_proj.weight.mul_(8.0)  # inputs of a few hundred: gates closed, gradients 0 on both sides
        self.fn, self.cast, self.poke = fn, torch.float32, False

    def forward(self, h):
        g = self.g_proj(h)
        gate = (F.softplus if self.fn == "softplus" else torch.sigmoid)(g.to(self.cast))
        if self.poke:
            with torch.no_grad():
                g.add_(1.0)
        return h * gate.to(h.dtype)


class Router(torch.nn.Module):
    """σ of logits the router computes with its own weight and returns (Laguna's router in small)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(6, 8) * 4.0)

    def forward(self, h):
        logits = F.linear(h, self.weight).float()
        scores = torch.sigmoid(logits)
        top, chosen = torch.topk(scores, 2, dim=-1)
        return logits, (top / top.sum(-1, keepdim=True)).to(h.dtype), chosen


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn, self.router = CastFed(), Router().to(torch.bfloat16)

    def forward(self, h):
        _, weights, _ = self.router(h)
        return self.attn(h) * weights[..., :1]  # the weights' sum, 1, has no gradient


def _step(model, h, monitor) -> None:
    with monitor.step():
        y = model(h)
        (y.float() * torch.arange(y.numel()).view_as(y)).sum().backward()  # a zero upstream at element 0


def _input() -> torch.Tensor:
    return (torch.randn(4, 8, generator=torch.Generator().manual_seed(0)) * 40).bfloat16()  # some gates closed


@pytest.mark.parametrize("fn", ["softplus", "sigmoid"])
def test_a_cast_of_a_child_s_output_and_a_router_s_own_output_are_read_by_their_nodes(fn):
    torch.manual_seed(0)
    model, h = Block(), _input()
    model.attn.fn = fn
    monitor = GateMonitor()
    for _ in range(4):
        _step(model, h, monitor)
    feeds = {site.module: feed for site, (_, feed, _) in monitor._feeds.items()}
    assert feeds["attn"][0]() is model.attn.g_proj and feeds["attn"][1:] == (None, torch.float32)
    assert feeds["router"] == (None, 0, None)  # the router's output 0: its logits
    rows = {r.module: r for r in monitor.rows()}
    assert set(rows) == {"attn", "router"} and monitor.unfound == 0
    for r in rows.values():  # the steps with no mode count what the modes counted
        assert r.steps == 4 and len(set(r.per_step)) == 1 and r.dtype == "float32"
    assert rows["attn"].zero_grad_cast_share is not None and rows["router"].zero_grad_cast_share is not None
    for r in rows.values():  # closed gates, and exactly-zero gradients under a non-zero upstream
        assert r.closed_share > 0 and r.zero_grad_share > 0


def test_a_feed_that_changes_is_not_counted_from_a_guess():
    """A cast to another format than the probe saw (the node's input metadata tells), and a child's output changed
    in place after the gate read its cast (its version tells): neither call is counted, each is said, and the next
    step is watched by the calls, which count what ran."""
    torch.manual_seed(0)
    model, h = CastFed(), _input()
    monitor = GateMonitor()
    for _ in range(4):
        _step(model, h, monitor)
    assert monitor._feeds is not None
    model.cast = torch.float64
    _step(model, h, monitor)
    assert monitor.unfound == 1 and monitor._feeds is None
    _step(model, h, monitor)  # the calls watch: counted, in float64
    (r64,) = [r for r in monitor.rows() if r.dtype == "float64"]
    assert r64.steps == 1

    model, monitor = CastFed(), GateMonitor()
    for _ in range(4):
        _step(model, h, monitor)
    model.poke = True
    _step(model, h, monitor)
    assert monitor.unfound == 1 and monitor._feeds is None
    _step(model, h, monitor)
    (row,) = monitor.rows()
    assert row.steps == 5 and len(set(row.per_step)) == 1  # the poked step holds no entry; the next counts as before


def test_the_probe_does_not_take_a_child_s_output_changed_in_place_before_the_module_returned():
    torch.manual_seed(0)
    model, h = CastFed(), _input()
    model.poke = True
    monitor = GateMonitor()
    for _ in range(4):
        _step(model, h, monitor)
    assert monitor._calls_ok and monitor._feeds is None and monitor.unfound == 0
    (row,) = monitor.rows()
    assert row.steps == 4 and len(set(row.per_step)) == 1
