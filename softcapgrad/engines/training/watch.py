"""The attention cap's watch as evidence: a route whose own step made no attention-cap call did not apply the cap.

An adapter that reads the attention cap's calls (a function mode over the step: a/c, then tanh of that
quotient, then times c; the call's a kept with dL/da and dL/dz, a call the backward never reached dropped)
writes one row per score of every call it kept, and an empty array where it watched and kept none. A
step whose capped run was watched, and whose watched runs (the capped folder, each sweep folder) kept no
call, computed no attention cap that training reaches, whatever its precision can tell from the logits
and gradients: its attention row is ``ignored`` (the cap was not applied), the record as the evidence,
where the comparison with the references left it undecided (``not bound``).

The rule does not overrule a forward that matches a reference with the attention cap on: a step that
matches the capped model within the tolerance while the watch saw no call is a watch the route's code
escapes (a fused or compiled kernel), and its row is left as judged.
"""

from __future__ import annotations

from softcapgrad.engines.training import verdict as tv

NO_CALL = ("the route's own step made no attention-cap call: the watch over its step (a/c, tanh, times c, with "
           "dL/da and dL/dz kept) saw none in any of its {runs} runs, so the cap was not applied")


def no_call(steps: dict) -> str | None:
    """The evidence where the capped run (``steps``: folder -> Step) carries the watch's record and no watched run
    holds a call; None where the capped run was not watched (the adapter reads no attention) or a call was seen."""
    watched = [s for s in steps.values() if s.attention is not None]
    if "capped" not in steps or steps["capped"].attention is None or any(s.attention.size for s in watched):
        return None
    return NO_CALL.format(runs=len(watched))


def judged(step, reference, unit: float, steps: dict) -> list[dict]:
    """verdict.judge's rows for the capped step; where the watch saw no attention-cap call and the forward matches
    no reference with that cap on, judged again among the references without it (the capped model and its
    variants left out: the step is seen not to compute them), the attention row then ``rule``'s."""
    rows = tv.judge(step, reference, unit)
    cell = rows[0].get("forward_cell") if rows else None
    if no_call(steps) is None or (cell is not None and "attention" in tv.ON.get(cell, {"attention"})):
        return rows
    again = tv.judge(step, reference, unit, without=frozenset({"attention"}))
    for row in again:
        if row["cap"] != "attention" and row["verdict"] not in (tv.NOT_SET, tv.NOT_FINITE):
            row["hint"] = (f"{row.get('hint') or ''}; placed among the references without the attention cap, the "
                           "watch having seen the step make no attention-cap call").lstrip("; ")
    return rule(again, steps)


def rule(rows: list[dict], steps: dict) -> list[dict]:
    """``rows`` (verdict.judge's) with the attention row made ``ignored`` where the watch saw no attention-cap
    call, the row was undecided, and its forward matches no reference with the attention cap on."""
    evidence = no_call(steps)
    if evidence is None:
        return rows
    out = []
    for row in rows:
        cell = row.get("forward_cell")
        if row["cap"] == "attention" and row["verdict"] == tv.NOT_BOUND \
                and (cell is None or "attention" not in tv.ON.get(cell, {"attention"})):
            row = {**row, "verdict": tv.IGNORED,
                   "hint": f"{evidence}; judged on the logits and gradients alone: {row.get('hint') or ''}".rstrip()}
        out.append(row)
    return out
