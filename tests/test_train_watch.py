"""The attention cap's watch as a verdict (engines/training/watch.py): a route whose step made no attention-cap call
is ``ignored`` where the references left it undecided, and only there."""

from __future__ import annotations

import numpy as np

from softcapgrad.engines.training import reference as tr
from softcapgrad.engines.training import verdict as tv
from softcapgrad.engines.training import watch


def _step(attention):
    return tr.Step(0.0, np.zeros((2, 2)), {}, attention=attention)


def _rows(cell=None, verdict=tv.NOT_BOUND):
    return [{"cap": "attention", "c": 50.0, "verdict": verdict, "hint": "the returned logits match no reference",
             "forward_cell": cell},
            {"cap": "final", "c": 30.0, "verdict": tv.NOT_BOUND, "hint": "", "forward_cell": cell}]


NONE = np.zeros((0, 4))
CALL = np.array([[3.0, 0.5, 0.6, 50.0]])


def test_a_watched_step_without_an_attention_cap_call_is_ignored_with_the_evidence():
    rows = watch.rule(_rows(), {"capped": _step(NONE), "sweep": _step(NONE), "rows": _step(None)})
    assert rows[0]["verdict"] == tv.IGNORED
    assert "made no attention-cap call" in rows[0]["hint"] and "2 runs" in rows[0]["hint"]
    assert rows[0]["hint"].endswith("the returned logits match no reference")  # the comparison's words kept
    assert rows[1]["verdict"] == tv.NOT_BOUND  # the final cap is not the watch's to judge


def test_the_forward_of_a_cell_without_the_attention_cap_also_takes_the_rule():
    assert watch.rule(_rows("attention off"), {"capped": _step(NONE)})[0]["verdict"] == tv.IGNORED


def test_a_seen_call_an_unwatched_capped_run_or_a_capped_forward_leave_the_row_as_judged():
    planted = _rows()
    assert watch.rule(planted, {"capped": _step(NONE), "sweep": _step(CALL)}) == planted
    assert watch.rule(planted, {"capped": _step(None), "sweep": _step(NONE)}) == planted
    assert watch.rule(planted, {"sweep": _step(NONE)}) == planted
    capped = _rows("capped")  # the capped model's logits while the watch saw nothing: the watch was escaped
    assert watch.rule(capped, {"capped": _step(NONE)}) == capped


def test_only_an_undecided_row_changes():
    applied = _rows(verdict=tv.APPLIED)
    assert watch.rule(applied, {"capped": _step(NONE)}) == applied


def _row(engine, route, cap, verdict=tv.NOT_BOUND, model="gemma2"):
    return {"engine": engine, "route": route, "cap": cap, "verdict": verdict, "model": model, "hint": ""}


def test_a_default_route_left_undecided_is_named_a_gap_not_a_verdict():
    from softcapgrad.engines.training import results

    rows = [_row("peft-trl", "sft", "attention"), _row("peft-trl", "sft-eager", "attention"),
            _row("unsloth", "full", "attention", tv.IGNORED), _row("transformers", "default", "final", tv.APPLIED)]
    second = results.answer({"rows": rows, "models": []})[1]
    assert ("Undecided on routes users run by default, a gap in the answer and not a verdict: peft-trl (sft) "
            "attention on gemma2.") in second
    assert "nearer) on other routes: peft-trl (sft-eager) attention." in second
    assert "unsloth" not in second  # decided by the watch: no gap
    decided = results.answer({"rows": rows[1:], "models": []})[1]
    assert "gap" not in decided and "nearer): peft-trl (sft-eager) attention." in decided


def test_a_step_seen_without_the_attention_cap_is_placed_among_the_references_without_it(monkeypatch):
    calls = []

    def judge(step, reference, unit, once=0.0, without=frozenset()):
        calls.append(without)
        return _rows("attention off" if without else None)  # placed only among the references without the cap

    monkeypatch.setattr(tv, "judge", judge)
    rows = watch.judged(None, None, tv.BF16, {"capped": _step(NONE)})
    assert calls == [frozenset(), frozenset({"attention"})]
    final = next(r for r in rows if r["cap"] == "final")
    assert "placed among the references without the attention cap" in final["hint"]
    assert next(r for r in rows if r["cap"] == "attention")["verdict"] == tv.IGNORED
    calls.clear()
    assert watch.judged(None, None, tv.BF16, {"capped": _step(CALL)}) == _rows() and calls == [frozenset()]
