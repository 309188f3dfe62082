"""Every tiny model parity builds is numerically healthy (forward/conditioning.py): its norms see inputs far above
their epsilon, each cap moves the log-probabilities far past its fp32 tolerance, and fp32 rounding stays inside the
whole-model tolerance, and exchanging two norms of a layer is seen. The measurement itself catches the models the
earlier builder made."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")

from softcapgrad.engines.forward import alternatives, conditioning, modeltypes, norms, parity  # noqa: E402
from softcapgrad.engines.forward import reference as ref  # noqa: E402
from softcapgrad.models import audit  # noqa: E402

TOKENS = 16  # parity's default


def _bound(label: str, extra: tuple = ()):
    src = audit.source(None, modeltypes.model_type(label), ref.tiny_sets(label) + list(extra))
    model = ref.build(src, 0)
    ids = audit.random_ids(src.config, 1, TOKENS, 0).numpy().reshape(-1)
    reference = ref.reference(model, ids, ref.bind(model, ids))
    return model, ids, reference


@pytest.fixture(scope="module", params=list(modeltypes.LABELS))
def measured(request):
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model, ids, reference = _bound(request.param)
        return reference, conditioning.measure(model, ids, reference, request.param)
    finally:
        torch.set_num_threads(threads)


def test_every_norm_sees_inputs_far_above_its_epsilon(measured):
    _, c = measured
    assert c.norms > 0, "no norm module was found"
    assert c.norm_ratio >= conditioning.NORM_MIN, f"{c.norm}: mean square {c.norm_ratio:.3g} ε"


def test_each_cap_moves_the_log_probs_far_past_its_tolerance(measured):
    reference, c = measured
    assert c.final is not None and c.final >= conditioning.CAP_MIN
    attention_judged = reference.caps["attention"] is not None
    assert (c.attention is not None) == attention_judged
    if attention_judged:
        assert c.attention >= conditioning.CAP_MIN


def test_fp32_rounding_stays_inside_the_whole_model_tolerance(measured):
    _, c = measured
    assert 0 < c.noise <= conditioning.NOISE_MAX  # 0 would mean the fp64 copy never ran in fp64
    assert all(c.healthy.values())


def test_the_earlier_spread_of_weights_is_caught():
    """The config classes' own initializer_range (0.02): Gemma 2's post-feedforward norms see a few ε."""
    model, ids, reference = _bound("gemma2", ("initializer_range=0.02",))
    c = conditioning.measure(model, ids, reference, "gemma2")
    assert c.norm_ratio < conditioning.NORM_MIN and not c.healthy["norms"]
    assert "feedforward" in c.norm


def test_query_pre_attn_scalar_apart_from_head_dim_is_what_transformers_scales_by():
    model, ids, reference = _bound("gemma2+qpas")
    config = model.config
    assert config.query_pre_attn_scalar != config.head_dim
    attention = [m for m in model.modules() if hasattr(m, "attn_logit_softcapping")]
    assert attention and all(m.scaling == config.query_pre_attn_scalar ** -0.5 for m in attention)
    assert reference.reach["attention"] == pytest.approx(ref.TARGET, rel=1e-3)
    for m in attention:  # an engine scaling by head_dim instead: far outside the attention check's tolerance
        m.scaling = config.head_dim ** -0.5
    try:
        wrong = ref.logits(model, ids, off=("final",))
    finally:
        for m in attention:
            m.scaling = config.query_pre_attn_scalar ** -0.5
    from softcapgrad.engines.forward import verdict

    moved = verdict.error(verdict.log_probs(wrong), verdict.log_probs(reference.logits["final off"])).value
    tol = verdict.tolerance(verdict.FP32, float(np.abs(reference.logits["final off"]).max()), reference.width)
    assert moved > 1000 * tol


def test_rows_of_an_earlier_generation_are_marked_in_the_markdown():
    row = {"engine": "transformers", "route": "eager", "model": "gemma2", "cap": "final", "verdict": "applied",
           "error": 0.0, "error_off": 1.0, "tolerance": 1e-4, "where": "token 0, id 0", "hint": ""}
    model = {"model": "gemma2", "caps": {}, "reach": {"final": 4.0}, "tokens": 16, "vocabulary": 256}
    data = {"models": [model], "rows": [row, {**row, "engine": "inductor", "generation": ref.GENERATION}],
            "engines": []}
    md = parity.markdown(data, ("answer",))
    lines = [line for line in md.splitlines() if line.startswith(("| transformers |", "| inductor |"))]
    assert "| 1 (earlier models) |" in lines[0] and f"| {ref.GENERATION} |" in lines[1]
    assert "not re-run on the current ones" in md
    assert "1 of the 2 rows were measured on the models an earlier builder made (engines transformers)" in md
    assert "| gemma2 | not measured (generation 1) |" in md


def test_an_engine_scaling_by_head_dim_is_named(tmp_path):
    """The alternative parity offers on gemma2+qpas is what transformers computes with the head size's scale."""
    from softcapgrad.engines.forward import verdict

    src = audit.source(None, "gemma2", ref.tiny_sets("gemma2+qpas"))
    reference, model, ids = parity._prepare(src, TOKENS, 0, tmp_path)
    assert alternatives.SCALED in reference.alternatives
    attention = [m for m in model.modules() if hasattr(m, "attn_logit_softcapping")]
    for m in attention:
        m.scaling = model.config.head_dim ** -0.5
    wrong = ref.logits(model, ids, off=("final",))
    row = verdict.attention_verdict(wrong, reference.caps["attention"], reference, 0.0)
    assert row["verdict"] == "different" and row.get("fits") == alternatives.SCALED


def test_every_exchange_of_two_norms_moves_the_log_probs_far_past_the_tolerance(measured):
    _, c = measured
    assert c.identical == 0
    assert c.exchange is None or c.exchange >= conditioning.EXCHANGE_MIN, c.exchanged
    assert (c.pairs == 0) == (c.exchange is None and c.symmetric == 0)


def test_norms_left_at_the_class_init_are_caught():
    """Gemma 2 with its norms back at the class's gain (w = 0, gain 1 + w): each of the 2 × 6 pairs of a layer's
    four norms is identical, exchanging them is no change, and the figure fails its bound."""
    import torch

    model, ids, reference = _bound("gemma2")
    with torch.no_grad():
        for norm, _ in norms.norm_modules(model).values():
            norm.weight.zero_()
    reference = ref.reference(model, ids, {})
    c = conditioning.measure(model, ids, reference, "gemma2")
    assert c.pairs == 6 * model.config.num_hidden_layers and c.identical == c.pairs
    assert not c.healthy["norm exchange"]


def test_scalar_query_and_key_gains_exchange_symmetrically():
    """A query and a key norm whose gains are two scalars: q·k carries their product, whichever holds which, so the
    exchange moves the log-probs by rounding alone and is counted as a symmetry, not judged."""
    import torch

    model, ids, reference = _bound("gemma3_text")
    for m in model.modules():
        if hasattr(m, "q_norm"):
            with torch.no_grad():
                m.q_norm.weight.fill_(-0.5)  # gain 1 + w: 0.5 on every channel
                m.k_norm.weight.zero_()  # 1
    reference = ref.reference(model, ids, {})
    c = conditioning.measure(model, ids, reference, "gemma3_text")
    assert c.symmetric == model.config.num_hidden_layers


def test_a_per_head_layer_norm_is_probed_per_head():
    """xLSTM's multi-head norm takes (batch, positions, heads, head size) and subtracts each head's mean: it is
    found to multiply by w (not 1 + w), where Gemma 2's norms multiply by 1 + w."""
    gemma, _, _ = _bound("gemma2")
    xlstm, _, _ = _bound("xlstm")
    multihead = [m for n, (m, _) in norms.norm_modules(xlstm).items() if n.endswith("multihead_norm")]
    assert multihead and not any(norms.plus_one(m) for m in multihead)
    assert all(norms.plus_one(m) for m, _ in norms.norm_modules(gemma).values())
