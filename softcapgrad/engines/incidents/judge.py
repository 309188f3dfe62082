"""Caught or missed: each incident's two sides judged against the verdicts its catalogue entry names; the report.

Pure functions over plain dicts. A side is what the tool said on one release::

    {"release": "transformers 4.44.2", "state": "ran" | "from results" | "not built" | "could not run",
     "verdict": "ignored", "detail": "...", "command": "..."}

An incident is *caught* when the before side's verdict is one of those that say the cap is not applied (or wrong)
and the after side's one of those that say it is; *missed* when a side that ran says otherwise, or when the tool
cannot reach it (``out of reach``); *not replayed* when a side could not run or its environment is not built; *not
checked here* when it needs a GPU. An incident with no fixed release is judged on its before side alone, and says so.
"""

from __future__ import annotations

from softcapgrad.engines.incidents.catalog import Incident

OUTCOMES = ("caught", "missed", "not replayed", "not checked here")
RAN = ("ran", "from results")


def judge(incident: Incident, before: dict | None, after: dict | None) -> tuple[str, str]:
    """(outcome, why) for one incident, from its sides (None: no such release)."""
    if incident.reach == "out of reach":
        return "missed", f"out of reach: {incident.why}"
    if incident.reach == "gpu":
        return "not checked here", f"GPU only: {incident.why}"
    j = incident.judge
    if j is None or before is None:
        return "not replayed", "no verdict names this incident"
    sides = [("before", before, j.before)] + ([("after", after, j.after)] if after is not None else [])
    for name, side, _ in sides:
        if side["state"] not in RAN:
            return "not replayed", f"{name} ({side['release']}): {side['state']}: {side.get('detail', '')}".rstrip(
                ": ")
    for name, side, wanted in sides:
        if side["verdict"] not in wanted:
            return "missed", (f"{name} ({side['release']}) the tool says {side['verdict']!r} on the {j.cap} cap, "
                              f"not {' or '.join(repr(w) for w in wanted)}"
                              + (f"; {incident.why}" if incident.why and name == "before" else ""))
    if after is None:
        return "caught", f"before side only: {incident.why}"
    return "caught", ""


def row(incident: Incident, before: dict | None, after: dict | None) -> dict:
    """The incident's row of results/incidents.json."""
    outcome, why = judge(incident, before, after)
    j = incident.judge
    return {"id": incident.id, "thread": incident.thread or "not confirmed here", "library": incident.library,
            "broke": incident.broke, "reach": incident.reach, "replay": incident.replay,
            "command": incident.command, "before": before, "after": after, "outcome": outcome, "why": why,
            "decides": (f"{j.engine} route {j.route}, {j.model}, {j.cap} cap: before {' or '.join(j.before)}, "
                        f"after {' or '.join(j.after)}") if j else ""}


def counts(rows: list[dict]) -> dict[str, int]:
    return {o: sum(r["outcome"] == o for r in rows) for o in OUTCOMES}


def answer(rows: list[dict]) -> tuple[str, ...]:
    """One to three sentences: how many were caught, missed (and how many of those are reach), not replayed."""
    if not rows:
        return ("No incident was replayed.",)
    n = counts(rows)
    caught = [r["id"] for r in rows if r["outcome"] == "caught"]
    missed = [r for r in rows if r["outcome"] == "missed"]
    reach = sum(r["reach"] == "out of reach" for r in missed)
    says = [f"Of {len(rows)} incident{'s' if len(rows) > 1 else ''}, the tool caught {n['caught']}"
            + (f" ({', '.join(caught)})" if caught else "")
            + f" and missed {n['missed']}" + (f", {reach} of them out of its reach today" if missed else "") + "."]
    rest = [f"{n['not replayed']} not replayed (an environment not built or a release that could not run)"
            if n["not replayed"] else "",
            f"{n['not checked here']} need a GPU (prepared commands below)" if n["not checked here"] else ""]
    rest = [r for r in rest if r]
    if rest:
        text = "; ".join(rest)
        says.append(text[:1].upper() + text[1:] + ".")
    wrong = [r["id"] for r in missed if r["reach"] != "out of reach"]
    if wrong:
        says.append("Missed where the tool ran: " + ", ".join(wrong) + " (the rows say why).")
    return tuple(says)


def _none(row: dict) -> str:
    """What a missing side means: no release with the fix on the index, or no release pair confirmed at all."""
    return "none on the index" if row["reach"] in ("cpu", "no fix") else "not confirmed here"


def _said(side: dict | None, none: str = "") -> str:
    if side is None:
        return none
    if side["state"] in RAN:
        return side["verdict"] + (" (committed results)" if side["state"] == "from results" else "")
    return side["state"]


def _release(side: dict | None, none: str = "none") -> str:
    return side["release"] if side else none


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(rows: list[dict], said: tuple[str, ...]) -> str:
    lines = ["# The public soft-cap incidents, replayed", "", *said, "",
             "Each incident's release before and after the fix, as the package index lists them, replayed with the "
             "tool's own commands (`softcapgrad incidents`): *caught* when the tool says the cap is not applied "
             "(or wrong) before and applied after, on the row named under *decides*. A side read from the "
             "committed results says so; it was not re-run by this command. Threads are cited as issue 55 "
             "gives them; one it does not give is *not confirmed here*.", "",
             "| incident | thread | before | tool says | after | tool says | outcome |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        none = _none(r)
        cells = [r["id"], r["thread"], _release(r["before"], none), _said(r["before"], ""),
                 _release(r["after"], none), _said(r["after"], ""), r["outcome"]]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    lines += ["", "## Each incident", ""]
    for r in rows:
        lines += [f"### {r['id']}", "", f"- library: {r['library']}; what broke: {r['broke']}",
                  f"- reach: {r['reach']}" + (f"; replayed as: {r['replay']}" if r["replay"] else "")]
        lines += [f"- decides: {r['decides']}"] if r["decides"] else []
        for name in ("before", "after"):
            side = r[name]
            if side:
                text = f"- {name}: {side['release']}: {_said(side)}"
                text += f"; {side['detail']}" if side.get("detail") else ""
                text += f"; command: `{side['command']}`" if side.get("command") else ""
                lines.append(text)
        lines += [f"- command: `{r['command']}`"] if r["command"] and not (r["before"] or r["after"]) else []
        lines += [f"- outcome: {r['outcome']}" + (f": {r['why']}" if r["why"] else ""), ""]
    return "\n".join(lines)
