"""GateMonitor per head: a head planted shut on a tiny Laguna (softplus, one gate per head) and Qwen3-Next (sigmoid,
one gate per channel of each head) is the one the per-head figures name.

The plant: every token embedding gets +8 on coordinate 0 (init std 0.02 elsewhere), so after layer 0's RMSNorm that
coordinate is ≈ √D ≈ 5.7 for every token; the planted head's gate rows read −10 times it and nothing else, an input of
≈ −57, where softplus and σ are ≈ e^−57 ≈ 2e-25, far below 1e-3 in every format. The other heads' rows are the init's
(std 0.02: inputs of order 0.1), open at ≈ 0.7 (softplus) and ≈ 0.5 (σ).
"""

import pytest
import torch

pytest.importorskip("transformers")

from softcapgrad.training.gatehealth import GateMonitor  # noqa: E402
from softcapgrad.training.gateheads import head_count  # noqa: E402
from tests.test_tether_patch import IDS, laguna, qwen3_next  # noqa: E402

SHUT = 2  # the planted head (of 4)


def _plant(model, rows) -> None:
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] += 8.0
        w = rows(model.model.layers[0].self_attn)
        w.zero_()
        w[:, 0] = -10.0


def laguna_planted():
    model = laguna()
    _plant(model, lambda a: a.g_proj.weight[SHUT:SHUT + 1])  # one gate per head: row SHUT
    return model, "model.layers.0.self_attn", "softplus"


def qwen3_next_planted():
    model = qwen3_next().to(torch.bfloat16)
    d = 8  # q_proj's rows per head: d of query, then d of gate
    _plant(model, lambda a: a.q_proj.weight[SHUT * 2 * d + d:(SHUT + 1) * 2 * d])
    return model, "model.layers.0.self_attn", "sigmoid"


@pytest.mark.parametrize("make", [laguna_planted, qwen3_next_planted], ids=["laguna", "qwen3_next"])
def test_a_head_planted_shut_is_the_one_the_per_head_figures_name(make):
    model, module, fn = make()
    model.train()
    monitor = GateMonitor()
    for _ in range(2):  # the first step over every op, the second through the learnt watch
        with monitor.step():
            (model(input_ids=IDS).logits.float() ** 2).mean().backward()
    rows = {(r.module, r.fn): r for r in monitor.rows()}
    row = rows[(module, fn)]
    assert row.steps == 2 and len(row.per_head) == 4
    closed = [c for _, c in row.per_head]
    assert closed[SHUT] == 1.0 and [c for i, c in enumerate(closed) if i != SHUT] == [0.0] * 3
    assert row.closed_share == 0.25  # one head of four, every element of it
    means = [m for m, _ in row.per_head]
    assert means[SHUT] < 1e-3 < min(m for i, m in enumerate(means) if i != SHUT)
    # each head holds a quarter of the elements: the heads' means average to the site's (float64 sums, n·2⁻⁵²)
    assert sum(means) / 4 == pytest.approx(row.mean_gate, rel=row.count * 2.0**-52, abs=0)
    report = monitor.report()
    assert any(f"closed most in head {SHUT} of 4" in s for s in report.answer)
    other = rows.get(("model.layers.1.self_attn", fn))
    if other is not None:  # Laguna's second layer: per head, and nothing planted there
        assert len(other.per_head) == 4 and all(c == 0.0 for _, c in other.per_head)


def test_only_a_last_dimension_of_heads_is_per_head():
    attn = laguna().model.layers[0].self_attn  # 4 heads of 8
    assert [head_count(attn, "sigmoid", n) for n in (4, 32, 8, 33)] == [4, 4, None, None]
    assert head_count(attn, "softmax", 4) is None and head_count(None, "sigmoid", 4) is None
    assert head_count(torch.nn.Linear(2, 2), "sigmoid", 4) is None  # a module that names no heads


@pytest.mark.parametrize("n", [4, 8])  # one gate per head; two channels per head
def test_a_small_call_counted_from_python_floats_gives_the_tensors_per_head_sums(n):
    from softcapgrad.training.gateheads import add_heads

    y = (0.5 + torch.rand(3, 5, n, generator=torch.Generator().manual_seed(n)) / 2).to(torch.bfloat16)  # open
    y[..., n // 4:n // 2] = 1e-4  # head 1 shut, in both layouts
    listed, total = add_heads(None, y, 4, 1, y.reshape(-1).tolist())
    reduced, total2 = add_heads(None, y, 4, 1)
    assert listed[0] == reduced[0] == [0, 15 * n // 4, 0, 0]
    # the same values summed in another order (fsum against float64 sums): within 60·2⁻⁵² of the total, each head
    assert listed[1] == pytest.approx(reduced[1], rel=60 * 2.0**-52) and total == pytest.approx(total2, rel=60 * 2.0**-52)
