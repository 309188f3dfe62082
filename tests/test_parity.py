"""parity: planted failures get named, the GGUF conversion is right, engines run when their extra is installed,
and bad input or a failing engine never crashes the tool."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")

from softcapgrad.engines.forward import reference as ref  # noqa: E402
from softcapgrad.engines.forward import verdict  # noqa: E402
from softcapgrad.models import audit  # noqa: E402

from paritymodels import TOKENS, _as_fp32_logprobs, _built, _config  # noqa: E402

SETS = ["final_logit_softcapping=30", "attn_logit_softcapping=50", "query_pre_attn_scalar=32"]


@pytest.fixture(scope="module")
def capped():
    model, ids = _built()
    scales = ref.bind(model, ids)
    return model, ref.reference(model, ids, scales)


def _rows(reference, capped_logits, final_off_logits):
    rows = verdict.verdicts({"capped": capped_logits, "final off": final_off_logits}, reference)
    return {r["cap"]: r for r in rows}


def test_inputs_bind_every_cap(capped):
    _, reference = capped
    assert reference.reach["attention"] == pytest.approx(ref.TARGET, rel=1e-3)
    assert reference.reach["final"] == pytest.approx(ref.TARGET, rel=1e-3)


def test_the_reference_itself_is_applied(capped):
    model, reference = capped
    rows = _rows(reference, reference.logits["capped"], reference.logits["final off"])
    assert rows["attention"]["verdict"] == "applied" and rows["final"]["verdict"] == "applied"


def test_dropped_final_cap_is_ignored(capped):
    _, reference = capped
    rows = _rows(reference, reference.logits["final off"], reference.logits["final off"])
    assert rows["final"]["verdict"] == "ignored"
    assert rows["attention"]["verdict"] == "applied"


def test_an_engine_that_reads_no_cap_from_the_folder_is_named(capped):
    _, reference = capped
    own = reference.logits["capped"]  # its own config caps both runs, whatever the folder says
    rows = _rows(reference, own, own)
    assert rows["final"]["verdict"] == "ignores the folder's caps"
    assert "matches transformers' capped model" in rows["final"]["hint"]
    assert rows["attention"]["verdict"] == "applied"  # judged on the capped pair


def test_an_own_cap_without_the_attention_cap_is_named_on_both(capped):
    _, reference = capped
    own = reference.logits["attention off"]
    rows = _rows(reference, own, own)
    assert rows["final"]["verdict"] == "ignores the folder's caps"
    assert "differs from transformers' capped model" in rows["final"]["hint"]
    assert rows["attention"]["verdict"] == "ignored"


def test_without_the_final_off_run_both_caps_are_judged_against_the_reference(capped):
    _, reference = capped
    failed = {"final off": "TypeError: unsupported operand type(s) for /: 'float' and 'NoneType'"}
    rows = {r["cap"]: r for r in verdict.verdicts({"capped": reference.logits["capped"]}, reference, failed=failed)}
    assert rows["attention"]["verdict"] == "applied" and rows["final"]["verdict"] == "applied"
    assert rows["final"]["hint"].startswith("the folder without its final cap could not run (TypeError")
    dropped = {r["cap"]: r for r in verdict.verdicts({"capped": reference.logits["attention off"]}, reference,
                                                      failed=failed)}
    assert dropped["attention"]["verdict"] == "ignored" and dropped["final"]["verdict"] == "applied"


def test_without_the_capped_run_the_final_cap_says_why(capped):
    _, reference = capped
    failed = {"capped": "RuntimeError: no converter"}
    rows = {r["cap"]: r for r in verdict.verdicts({"final off": reference.logits["final off"]}, reference,
                                                   failed=failed)}
    assert rows["final"]["verdict"] == "could not run" and rows["attention"]["verdict"] == "applied"
    assert rows["final"]["hint"] == "the folder as it is: RuntimeError: no converter"


def test_dropped_attention_cap_is_ignored(capped):
    _, reference = capped
    rows = _rows(reference, reference.logits["attention off"], reference.logits["uncapped"])
    assert rows["attention"]["verdict"] == "ignored"
    assert rows["final"]["verdict"] == "applied"  # the final cap still runs, on the engine's own logits


def test_final_cap_in_bf16_is_named(capped):
    model, reference = capped
    bf16 = verdict.cap_in("bf16")
    planted = bf16(reference.logits["final off"], 30.0)
    rows = _rows(reference, planted, reference.logits["final off"])
    assert rows["final"]["verdict"] == "different"
    assert rows["final"]["hint"] == "matches the cap computed in bf16"
    assert rows["attention"]["verdict"] == "applied"


def test_attention_cap_in_bf16_is_named(capped):
    import torch

    model, reference = capped
    cap = ref.attention_alternatives()["the cap computed in bf16"]
    final_off = ref.logits(model, reference.ids, off=("final",), cap_fn=cap)
    planted = ref.logits(model, reference.ids, cap_fn=cap)
    rows = _rows(reference, planted, final_off)
    assert rows["attention"]["verdict"] == "different"
    assert rows["attention"]["hint"].startswith("closest to the cap computed in bf16")
    assert rows["final"]["verdict"] == "applied"
    assert torch.get_default_dtype() == torch.float32


@pytest.mark.parametrize("form, name", [
    (lambda a, c: a / np.sqrt(1 + (a / c) ** 2), "c·x/sqrt(1+x²) instead of tanh"),
    (lambda a, c: np.clip(a, -c, c), "a hard clip to [-c, c]"),
    (lambda a, c: a * np.tanh(a / c), "x·tanh(x/c) instead of c·tanh(x/c)"),
    (lambda a, c: verdict.exact_cap(verdict.exact_cap(a, c), c), "the cap applied twice"),
])
def test_tanh_replaced_is_named(capped, form, name):
    _, reference = capped
    a = reference.logits["final off"]
    rows = _rows(reference, form(a, 30.0), a)
    assert rows["final"]["verdict"] == "different" and rows["final"]["hint"] == f"matches {name}"


def test_an_unknown_function_is_different_without_a_name(capped):
    _, reference = capped
    a = reference.logits["final off"]
    rows = _rows(reference, 30.0 * np.sin(a / 30.0), a)
    assert rows["final"]["verdict"] == "different" and rows["final"]["hint"].startswith("matches none of")


def test_nan_for_large_logits_is_not_finite(capped):
    _, reference = capped
    a = reference.logits["final off"]
    planted = np.where(np.abs(a) > 60.0, np.nan, verdict.exact_cap(a, 30.0))  # a fused cap failing past 2c
    assert np.isnan(planted).any()
    rows = _rows(reference, planted, a)
    assert rows["final"]["verdict"] == "not finite"


def test_a_cap_that_does_not_bind_is_not_judged():
    model, ids = _built()
    reference = ref.reference(model, ids, {})  # unscaled: the largest |a/c| stays far below 1
    assert reference.reach["final"] < 0.1
    rows = _rows(reference, reference.logits["final off"], reference.logits["final off"])
    assert rows["final"]["verdict"] == "not bound"


# --- bad input and failing engines ---------------------------------------------------------------


def test_absurd_sizes_are_refused_before_building():
    from softcapgrad.core.checks import InputError

    with pytest.raises(InputError, match="refused before building"):
        ref.check(_config(hidden_size=65536, intermediate_size=262144, num_hidden_layers=64, vocab_size=256000))


def test_a_model_without_caps_is_refused():
    from softcapgrad.core.checks import InputError

    with pytest.raises(InputError, match="no soft-cap set"):
        ref.check(_config(final_logit_softcapping=None, attn_logit_softcapping=None))


def test_cli_refuses_bad_input_in_one_line():
    from typer.testing import CliRunner

    from softcapgrad.cli.app import app

    result = CliRunner().invoke(app, ["parity", "--model-type", "llama", "--engine", "torchexport"])
    assert result.exit_code == 2 and "parity runs gemma2" in result.output
    result = CliRunner().invoke(app, ["parity", "--engine", "torchexport", "--set", "num_hidden_layers=100000",
                                      "--set", "hidden_size=100000"])
    assert result.exit_code == 2 and "refused before building" in result.output


def test_an_engine_that_applies_a_cap_transformers_leaves_unused_is_named():
    """Gemma 3's attention cap is dead config in transformers: an engine that applies it is caught."""
    src = audit.source(None, "gemma3_text", SETS)
    model = ref.build(src, 0)
    ids = np.random.default_rng(0).integers(0, 200, TOKENS)
    reference = ref.reference(model, ids, ref.bind(model, ids))
    assert reference.applied == {"attention": False, "final": True}
    assert reference.reach["attention"] == pytest.approx(ref.TARGET, rel=1e-3)  # the dead cap's input binds too
    forced = reference.logits["attention forced"]
    planted = verdict.verdicts({"capped": verdict.exact_cap(forced, 30.0), "final off": forced,
                                "uncapped": reference.logits["final off"]}, reference)
    assert planted[0]["verdict"] == "unused by transformers" and "the engine applies it" in planted[0]["hint"]
    assert planted[1]["verdict"] == "applied"
    faithful = verdict.verdicts({"capped": reference.logits["capped"], "final off": reference.logits["final off"],
                                 "uncapped": reference.logits["final off"]}, reference)
    assert faithful[0]["hint"].startswith("the engine agrees with transformers")


def test_the_cap_on_the_final_hidden_state_is_named(capped):
    """An engine that caps the hidden state before the output projection instead of the logits."""
    model, reference = capped
    planted = ref.hidden_capped(model, reference.ids)
    rows = _rows(reference, planted, reference.logits["final off"])
    assert rows["final"]["verdict"] == "different"
    assert rows["final"]["hint"] == "matches the cap applied to the final hidden state before the output projection"


def test_every_row_carries_the_largest_logit(capped):
    _, reference = capped
    rows = _rows(reference, reference.logits["capped"], reference.logits["final off"])
    assert rows["final"]["max_logit"] == float(np.abs(reference.logits["capped"]).max()) <= 30.0


def test_a_low_precision_route_is_judged_on_its_top_tokens(capped):
    """bf16 rounding of every logit is within a bf16 route's tolerance on the top tokens; a dropped cap is not."""
    _, reference = capped
    bf16 = verdict.cap_in("bf16")
    a = bf16(reference.logits["final off"], 1e30)  # the logits rounded to bf16 (a/c tiny: x itself, rounded)
    capped_bf16 = bf16(reference.logits["capped"], 1e30)
    rows = {r["cap"]: r for r in verdict.verdicts({"capped": capped_bf16, "final off": a}, reference,
                                                  k=8, unit=2.0 ** -8)}
    assert rows["final"]["verdict"] == "applied" and rows["final"]["top_k"] == 8
    dropped = {r["cap"]: r for r in verdict.verdicts({"capped": a, "final off": a}, reference, k=8, unit=2.0 ** -8)}
    assert dropped["final"]["verdict"] == "ignored"


def test_an_engine_returning_only_log_probabilities_is_judged_against_the_reference(capped):
    _, reference = capped
    final_off = _as_fp32_logprobs(reference.logits["final off"])
    assert np.isneginf(final_off).any()  # the uncapped logits span more than fp32's range of probabilities
    rows = {r["cap"]: r for r in verdict.verdicts(
        {"capped": _as_fp32_logprobs(reference.logits["capped"]), "final off": final_off}, reference,
        output="logprobs")}
    assert rows["attention"]["verdict"] == "applied" and rows["final"]["verdict"] == "applied"
    assert rows["final"]["max_logit"] is None  # log-probabilities say nothing of the largest logit
    dropped = {r["cap"]: r for r in verdict.verdicts({"capped": final_off, "final off": final_off}, reference,
                                                      output="logprobs")}
    assert dropped["final"]["verdict"] == "ignored"


def test_minus_infinity_where_the_reference_is_representable_is_an_error(capped):
    _, reference = capped
    lp = verdict.log_probs(reference.logits["capped"])
    broken = lp.copy()
    broken[0, int(np.argmax(lp[0]))] = -np.inf  # the most likely token given probability zero
    assert verdict.error(broken, lp).value == np.inf
    assert verdict.error(_as_fp32_logprobs(reference.logits["final off"]),
                         verdict.log_probs(reference.logits["final off"])).value < 1e-12


def test_an_engine_that_drops_the_sliding_window_with_the_cap_is_named():
    from softcapgrad.engines.forward import alternatives

    model, ids = _built(sliding_window=4)  # shorter than the 12 tokens: the local layer's window binds
    reference = ref.reference(model, ids, ref.bind(model, ids))
    reference.alternatives.update(alternatives.window_alternatives(model, ids))
    assert model.config.sliding_window == 4  # restored
    both = reference.alternatives["the sliding window and the attention cap both dropped"]
    rows = _rows(reference, verdict.exact_cap(both, 30.0), both)
    assert rows["attention"]["verdict"] == "different"
    assert rows["attention"]["hint"].startswith("closest to the sliding window and the attention cap both dropped")
    assert rows["final"]["verdict"] == "applied"
    assert np.abs(both - reference.logits["uncapped"]).max() > 1.0  # the window changes the logits
    # judged on its capped run alone (the folder without the final cap failed): the final cap beside that form
    kept = reference.alternatives[verdict.CAPPED + "the sliding window not applied"]
    alone = {r["cap"]: r for r in verdict.verdicts({"capped": kept}, reference, failed={"final off": "TypeError"})}
    assert alone["attention"]["fits"] == "the sliding window not applied"
    assert alone["final"]["verdict"] == "applied" and alone["final"]["hint"].endswith("the sliding window not applied")


def test_caps_swapped_and_the_final_cap_on_the_hidden_state_are_named(capped):
    from softcapgrad.engines.forward import alternatives

    model, reference = capped
    reference.final_alternatives.update(alternatives.swapped_alternatives(model, reference.ids))
    assert model.config.final_logit_softcapping == 30.0  # restored
    both = reference.final_alternatives[verdict.SWAPPED + ", the final cap on the final hidden state"]
    own = {r["cap"]: r for r in verdict.verdicts({"capped": both, "final off": both}, reference)}
    assert own["final"]["verdict"] == "ignores the folder's caps"
    assert own["attention"]["verdict"] == "different" and own["attention"]["hint"].startswith(
        "matches the two caps' values swapped, the final cap on the final hidden state")
    hidden = reference.final_alternatives["the cap applied to the final hidden state before the output projection"]
    alone = {r["cap"]: r for r in verdict.verdicts({"capped": hidden}, reference, failed={"final off": "TypeError"})}
    assert alone["attention"]["verdict"] == "applied"
    assert alone["final"]["verdict"] == "different" and alone["final"]["hint"].startswith(
        "matches the cap applied to the final hidden state")


def test_a_bf16_row_whose_bound_spans_the_cap_is_judged_by_the_nearer_reference(capped):
    _, reference = capped
    bf16 = lambda z: verdict._round(z, "bf16")  # noqa: E731 -- each logit rounded once to bf16
    rows = {r["cap"]: r for r in verdict.verdicts(
        {"capped": bf16(reference.logits["capped"]), "final off": bf16(reference.logits["final off"])}, reference,
        k=8, unit=2.0 ** -8)}
    assert rows["attention"]["tolerance"] * 10 > rows["attention"]["separation"]  # the γ_n bound alone: not bound
    assert rows["attention"]["verdict"] == "applied" and "10 times nearer" in rows["attention"]["hint"]
    dropped = {r["cap"]: r for r in verdict.verdicts(
        {"capped": bf16(verdict.exact_cap(reference.logits["uncapped"], 30.0)),
         "final off": bf16(reference.logits["uncapped"])}, reference, k=8, unit=2.0 ** -8)}
    assert dropped["attention"]["verdict"] == "ignored"


def test_an_engine_that_ran_only_the_folder_without_any_cap_says_why_on_both_rows(capped):
    _, reference = capped
    failed = {"capped": "ValueError: no attention cap in this engine", "final off": "ValueError: the same"}
    rows = {r["cap"]: r for r in verdict.verdicts({"uncapped": reference.logits["uncapped"]}, reference,
                                                   failed=failed)}
    assert {r["verdict"] for r in rows.values()} == {"could not run"}
    assert rows["final"]["hint"] == ("the folder as it is: ValueError: no attention cap in this engine; "
                                     "only the folder without any cap ran")


def test_a_row_beyond_its_bound_says_which_reference_it_is_nearest(capped):
    _, reference = capped
    noise = 0.01 * np.random.default_rng(1).standard_normal(reference.logits["uncapped"].shape)  # > fp32 bound
    off = reference.logits["uncapped"] + noise
    rows = _rows(reference, verdict.exact_cap(off, 30.0), off)
    assert rows["attention"]["verdict"] == "different"
    assert "nearest the model without the attention cap" in rows["attention"]["hint"]
    # the noise is at the first token as well, where no attention cap acts: part of the difference lies elsewhere
    assert rows["attention"]["hint"].startswith("already ") and "part of the difference" in rows["attention"]["hint"]


def test_a_difference_already_at_the_first_token_is_said_to_lie_outside_the_attention_cap(capped):
    """The first token attends to itself alone, so no attention cap acts on it. An engine whose MLP differs
    (exact erf GELU for Gemma's tanh approximation, as a converter might map it) differs there already, and the
    row says so. An attention cap computed wrongly (c·tanh(s/c)·1.01) leaves that token alone, so it is not said."""
    import torch

    model, reference = capped
    acts = [m for m in model.modules() if hasattr(m, "act_fn")]
    saved = [(m, m.act_fn) for m in acts]
    try:
        for m in acts:
            m.act_fn = torch.nn.GELU()
        rows = _rows(reference, ref.logits(model, reference.ids), ref.logits(model, reference.ids, off=("final",)))
        as_logprobs = {v: verdict.log_probs(ref.logits(model, reference.ids, off=off)) for v, off in
                       (("capped", ()), ("final off", ("final",)))}
        judged = {r["cap"]: r for r in verdict.verdicts(as_logprobs, reference, output="logprobs")}
    finally:
        for m, act in saved:
            m.act_fn = act
    assert rows["attention"]["verdict"] == "different" and rows["attention"]["outside"] > rows["attention"]["tolerance"]
    assert rows["attention"]["hint"].startswith("already ") and "where attention has one key" in rows["attention"]["hint"]
    # an engine that returns log-probabilities has its final cap judged against transformers' models, which
    # cannot tell a difference elsewhere from the cap's: the row says so
    assert judged["final"]["verdict"] == "different" and judged["final"]["hint"].startswith("the model differs outside")

    def wrong(scores, c):
        return ref.tanh_cap(scores, c) * 1.01

    cap_only = _rows(reference, ref.logits(model, reference.ids, cap_fn=wrong),
                     ref.logits(model, reference.ids, off=("final",), cap_fn=wrong))
    assert cap_only["attention"]["verdict"] == "different" and "outside" not in cap_only["attention"]


def test_a_pre_cap_difference_beyond_the_tolerance_is_shown_and_named_whatever_the_verdict():
    """The final row's pre-cap error (the engine's raw logits without the final cap against transformers') is judged
    at the logits' own scale: the row's tolerance times its largest |a/c|; beyond it, the table marks it and the
    answer names the engine even where the cap itself was applied."""
    from softcapgrad.cli.parity_report import answer_of as _answer
    from softcapgrad.engines.forward import parity

    row = {"engine": "e", "route": "r", "model": "gemma2", "cap": "final", "verdict": "applied", "c": 30.0,
           "error": 1e-6, "error_off": 100.0, "tolerance": 1e-4, "reach": 4.0, "where": "token 0, id 0",
           "max_logit": 30.0, "hint": "", "generation": ref.GENERATION}
    inside, beyond = dict(row, precap_error=3.9e-4), dict(row, precap_error=4.1e-4)
    assert not parity.precap_beyond(inside) and parity.precap_beyond(beyond)
    assert parity._precap_cell(beyond).endswith("(beyond)") and parity._precap_cell(dict(row)) == ""
    data = {"rows": [beyond], "models": [{"model": "gemma2", "reach": {"final": 4.0}}]}
    assert "e (r) on gemma2" in _answer(data)[1]
    assert "before the final cap" not in _answer({**data, "rows": [inside]})[1]


def test_entries_below_fp32s_smallest_normal_are_left_out_and_counted():
    """A probability under 2^-126 holds fewer than 24 bits in any fp32 softmax: where both sides lie below its log
    the entry is not compared, and the row counts it; an engine's -inf where the reference's log-prob is above it
    (-80 > log 2^-126 = -87.3) is an error."""
    reference = np.log(np.array([[0.5, 0.5 - 2e-39, 1e-39, 1e-40]]))  # the last two below 2^-126 ≈ 1.18e-38
    engine = reference.copy()
    engine[0, 2:] = -np.inf
    e = verdict.error(engine, reference)
    assert e.value == 0.0 and e.left_out == 2
    row = verdict._row("final", 30.0, "applied", e, e, 1e-6)
    assert row["left_out"] == 2 and "left_out" not in verdict._row("final", 30.0, "applied", verdict.Error(0, 0, 0),
                                                                     None, 1e-6)
    above = np.log(np.array([[0.5, 0.5 - np.exp(-80.0), np.exp(-80.0)]]))
    wrong = above.copy()
    wrong[0, 2] = -np.inf
    assert verdict.error(wrong, above).value == np.inf and verdict.error(wrong, above).left_out == 0


RELOAD = """import sys
import numpy as np
import adapter_protocol as protocol

EXPECTED = {expected!r}


def run_variant(run, variant):
    a = np.load(EXPECTED[variant], allow_pickle=False)
    if {moves}:  # noise of a tenth of a logit, drawn anew on each load
        a = a + np.random.default_rng(int.from_bytes(__import__("os").urandom(8), "little")).normal(0, 0.1, a.shape)
    return 30.0 * np.tanh(a / 30.0) * 1.01 if variant == "capped" else a  # the cap altered: c·tanh(a/c)·1.01

raise SystemExit(protocol.main({{"default": "planted"}}, run_variant))
"""


@pytest.mark.parametrize("moves", [False, True])
def test_a_finding_is_loaded_twice_and_a_model_that_changes_is_not_deterministic(capped, tmp_path, moves):
    """A route with a finding runs its capped folder once more in a new child: a model that moves from load to load
    (here by noise of a tenth of a logit, drawn anew each time) is 'not deterministic' on both rows, never a cap verdict; one that
    gives the same logits keeps its finding, and records how far apart the two loads were (0)."""
    import sys
    from pathlib import Path

    from softcapgrad.engines.forward import catalog, determinism, parity, parity_run
    from softcapgrad.engines.environments import environments

    model, reference = capped
    path = tmp_path / "final-off.npy"
    np.save(path, ref.logits(model, reference.ids, off=("final",)))
    expected = {parity.FOLDERS["capped"]: str(path), parity.FOLDERS["final off"]: str(path)}
    script = tmp_path / "adapter_planted.py"
    script.write_text(RELOAD.format(expected=expected, moves=moves), encoding="utf-8")
    engine = catalog.Engine("planted", "main", script, (catalog.Route("default", "planted"),), "planted")
    state = environments.State("main", "installed", None, Path(sys.executable), {}, 0, "")
    work = tmp_path / "inputs"
    work.mkdir()
    np.save(work / "ids.npy", reference.ids)
    for folder in parity.FOLDERS.values():
        (work / folder).mkdir()
    done = {}
    for _, task in parity_run._tasks(engine, state, [parity_run.Model(parity.Parity("m", reference), work, None)],
                                     120, done, None):
        task()
    rows, info = done[(0, "planted", "default")]
    final = {r["cap"]: r for r in rows}["final"]
    if moves:
        assert {r["verdict"] for r in rows} == {determinism.NOT_DETERMINISTIC}
        assert info["second_load"] > 0 and "loaded twice" in final["hint"]
    else:
        assert final["verdict"] == "different" and info["second_load"] == 0.0


def test_the_results_name_no_folder_of_this_machine(tmp_path, monkeypatch):
    """An engine's error quotes files inside its environment: parity.json writes the engines cache as <engines> and
    the home folder as ~, in new rows and in the earlier rows --update keeps."""
    from pathlib import Path

    from softcapgrad.engines.environments.environments import cache_root
    from softcapgrad.engines.forward.parity import merge, private

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    quoted = f"in file `{cache_root()}/executorch_rt-0123/lib/x.py`, near {Path.home()}/notes"
    assert private({"rows": [{"hint": quoted}]}) == {
        "rows": [{"hint": "in file `<engines>/executorch_rt-0123/lib/x.py`, near ~/notes"}]}
    old = {"models": [{"model": "m"}], "rows": [{"engine": "e", "model": "m", "hint": quoted}], "engines": [],
           "params": {}}
    new = {"models": [], "rows": [], "engines": [], "params": {}}
    assert str(tmp_path) not in str(merge(old, new)) and "<engines>/executorch_rt-0123" in str(merge(old, new))
