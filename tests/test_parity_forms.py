"""parity's named forms outside the caps: an engine that computes another model than transformers' (every layer
local, GELU's exact form) is named for it, and its caps are judged on the model as it computes it."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")

from softcapgrad.engines.forward import alternatives  # noqa: E402
from softcapgrad.engines.forward import reference as ref  # noqa: E402
from softcapgrad.engines.forward import verdict  # noqa: E402
from paritymodels import _as_fp32_logprobs, _built, _config  # noqa: E402


@pytest.fixture(scope="module")
def bound():
    model, ids = _built()
    return model, ref.reference(model, ids, ref.bind(model, ids))


def test_the_exact_gelu_form_is_the_model_configured_with_exact_gelu(bound):
    """The planted form is what a model whose config says ``gelu`` computes, bit for bit, and it is restored."""
    from softcapgrad.models import audit
    from transformers.activations import GELUTanh

    model, reference = bound
    forms = alternatives.gelu_alternatives(model, reference.ids)
    assert sum(isinstance(m, GELUTanh) for m in model.modules()) == 2  # restored: one per layer's MLP
    exact = ref.build(audit.Source(_config(hidden_activation="gelu"), None, False), 0)
    exact.load_state_dict(model.state_dict())
    assert np.array_equal(forms[verdict.EXACT_GELU], ref.logits(exact, reference.ids, off=("final",)))
    tol = verdict.tolerance(verdict.FP32, verdict.model_scale(reference), reference.width)
    assert verdict.error(verdict.log_probs(forms[verdict.EXACT_GELU]),
                         verdict.log_probs(reference.logits["final off"])).value > 10 * tol  # it can be told apart


@pytest.mark.parametrize("form, expected", [(verdict.EXACT_GELU, "applied"),
                                            (verdict.EXACT_GELU_DROPPED, "ignored")])
def test_an_engine_with_exact_gelu_has_its_attention_cap_judged_on_that_model(bound, form, expected):
    """ExecuTorch's XNNPACK lowering runs the exact GELU: its attention row says what it did with the cap, and the
    answer names the form, instead of "different" with a difference outside the cap."""
    from softcapgrad.cli.parity_report import answer_of

    model, reference = bound
    reference.alternatives.update(alternatives.gelu_alternatives(model, reference.ids))
    final_off = reference.alternatives[form]
    capped = verdict.exact_cap(final_off, 30.0)
    rows = {r["cap"]: r for r in verdict.verdicts({"capped": capped, "final off": final_off}, reference)}
    assert rows["attention"]["verdict"] == expected and rows["attention"]["outside_form"] == form
    assert rows["final"]["verdict"] == "applied"
    row = {**rows["attention"], "engine": "executorch_rt", "route": "direct", "model": "gemma2"}
    second = answer_of({"models": [], "rows": [row]})[1]
    assert f"Compute another model outside the caps, each cap judged on it: executorch_rt (direct) on gemma2: {form}." \
        in second


def test_an_engine_that_makes_every_layer_local_is_named():
    """mistral.rs's multimodal Gemma 3 reads no layer_types: a 2-layer model is all local. Judged on its capped
    log-probabilities alone, the final row names that form; with every token inside the window the form is the
    reference itself (it plants nothing else)."""
    from softcapgrad.engines.forward import alternatives

    model, ids = _built(sliding_window=4)  # shorter than the 12 tokens: the full layer made local changes it
    reference = ref.reference(model, ids, ref.bind(model, ids))
    forms = alternatives.all_local_alternatives(model, ids)
    local = forms[alternatives.ALL_LOCAL]
    assert alternatives.LOCAL in model.config.layer_types and set(model.config.layer_types) != {alternatives.LOCAL}
    assert np.abs(local - reference.logits["capped"]).max() > 1.0
    short = alternatives.all_local_alternatives(model, ids[:4])[alternatives.ALL_LOCAL]
    assert np.array_equal(short, ref.logits(model, ids[:4]))  # the same masks and kernels: the same bits
    reference.final_alternatives.update(forms)
    rows = {r["cap"]: r for r in verdict.verdicts({"capped": _as_fp32_logprobs(local)}, reference,
                                                   failed={"final off": "TypeError"}, output="logprobs")}
    assert rows["final"]["verdict"] == "different" and rows["final"]["fits"] == alternatives.ALL_LOCAL




def test_the_scaled_windowless_form_is_gemma2_with_no_window_no_attention_cap_and_scores_by_head_dim():
    """CTranslate2's Gemma 2 reads none of the window, the caps and query_pre_attn_scalar: the form that names it
    is, within the fp32 bound, the same weights configured with query_pre_attn_scalar = head_dim, window dropped,
    attention cap off; and it is far from the form that keeps the field."""
    from softcapgrad.models import audit

    model, ids = _built(query_pre_attn_scalar=64, sliding_window=4)
    reference = ref.reference(model, ids, ref.bind(model, ids))
    forms = alternatives.scaling_alternatives(model, ids)
    plain = ref.build(audit.Source(_config(query_pre_attn_scalar=32, sliding_window=4), None, False), 0)
    plain.load_state_dict(model.state_dict())
    with alternatives.window_dropped(plain):
        expected = ref.logits(plain, ids, off=ref.CAPS)
    with alternatives.window_dropped(model):
        kept_field = ref.logits(model, ids, off=ref.CAPS)
    assert ref.logits(model, ids, off=("final",)).tolist() == reference.logits["final off"].tolist()  # restored
    tol = verdict.tolerance(verdict.FP32, verdict.model_scale(reference), reference.width)
    lp = verdict.log_probs(forms[alternatives.SCALED_WINDOWLESS])
    assert verdict.error(lp, verdict.log_probs(expected)).value <= tol
    assert verdict.error(lp, verdict.log_probs(kept_field)).value > 10 * tol


@pytest.mark.parametrize("applies", [True, False])
def test_an_engine_wide_difference_no_form_names_is_judged_on_the_engines_own_pair_of_runs(applies):
    """An engine that computes the exact GELU, with the form not planted: its attention row is decided by its own
    runs with and without the cap where its effect lies ten times nearer the reference's than none, and says how far
    it lies from transformers outside the cap; equal runs are named, not called ignored. Without its own uncapped
    run it stays different."""
    model, ids = _built()
    reference = ref.reference(model, ids, ref.bind(model, ids))  # its own: no planted form among the alternatives
    with alternatives.exact_gelu(model):
        on, off = ref.logits(model, reference.ids, off=("final",)), ref.logits(model, reference.ids, off=ref.CAPS)
    engine = on if applies else off
    rows = {r["cap"]: r for r in verdict.verdicts(
        {"capped": verdict.exact_cap(engine, 30.0), "final off": engine, "uncapped": off}, reference)}
    row = rows["attention"]
    if applies:
        assert row["verdict"] == "applied" and row["own_effect"] > 10 * row["differential"]
        assert row["hint"].startswith("judged on the engine's own runs with and without the cap")
    else:  # equal runs: the folder's cap unread, which an engine with caps of its own (torchtune's builders) shows too
        assert row["verdict"] == "different" and row["own_effect"] == 0.0
        assert "the engine's runs with and without the folder's cap are the same" in row["hint"]
    alone = {r["cap"]: r for r in verdict.verdicts({"capped": verdict.exact_cap(engine, 30.0), "final off": engine},
                                                   reference)}
    assert alone["attention"]["verdict"] == "different" and "differential" not in alone["attention"]


def test_the_differential_cancels_what_both_runs_share_and_sees_the_cap_that_is_missing(bound):
    """The same error in both runs cancels; an engine whose runs are equal has no effect of its own."""
    _, reference = bound
    on, off = reference.logits["final off"], reference.logits["uncapped"]
    assert verdict.differential(on, off, on, off) == (0.0, verdict.error(verdict.log_probs(on),
                                                                          verdict.log_probs(off)).value)
    shift = np.zeros_like(on)
    shift[:, 0] = 3.0  # one logit moved alike in both runs: log-probs change, the cap's effect barely does
    moved, own = verdict.differential(on + shift, off + shift, on, off)
    assert verdict.error(verdict.log_probs(on + shift), verdict.log_probs(on)).value > 100 * moved
    assert verdict.differential(off, off, on, off)[1] == 0.0
