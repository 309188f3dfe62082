"""What a parity run found, as one report: the answer in three sentences, the verdict table and the engines' times."""

import re

from softcapgrad.cli.common import NO_VERDICT, Report


VERBS = {"ignored": "ignored", "different": "altered", "not finite": "gave non-finite logits with",
         "ignores the folder's caps": "reads from its own config, not the folder,"}
BAD = tuple(VERBS)


def _fix(rows: list[dict], bad: dict) -> str:
    """The route of the same engine that keeps this cap, as the setting to change: one judged at least as strictly
    (a tolerance no wider), so a low-precision route's wide bound is never read as the fix of an fp32 finding."""
    if bad["verdict"] == "ignores the folder's caps":
        return "the cap is set in the engine's own model config, whatever the folder says"
    keeps = [r["route"] for r in rows if r["engine"] == bad["engine"] and r["model"] == bad["model"]
             and r["cap"] == bad["cap"] and r["verdict"] == "applied"
             and (r.get("tolerance") or 0.0) <= (bad.get("tolerance") or 0.0)]
    return f"route {keeps[0]} keeps it" if keeps else "no route of it tried here keeps it"


def _grouped(rows: list[dict], picked: list[dict], say) -> list[str]:
    """One phrase per engine, route, cap and verdict, naming every model type it holds for."""
    groups: dict = {}
    for r in picked:
        groups.setdefault((r["engine"], r["route"], r["cap"], say(r)), []).append(r)
    out = []
    for (engine, route, cap, what), found in groups.items():
        models = ", ".join(dict.fromkeys(r["model"] for r in found))
        fixes = sorted({_fix(rows, r) for r in found})
        out.append(f"{engine} ({route}) {what} the {cap} cap of {models}; {' / '.join(fixes)}")
    return out


def _said(row: dict) -> str:
    """What an engine did with a cap, in a few words: the verdict's verb and the form it matched, if any."""
    if row.get("fits"):
        return f"matched '{row['fits']}' on"
    if row.get("outside"):
        return (f"differs from transformers outside the caps (already {row['outside']:.2g} at the first token, "
                f"where no attention cap acts), beside")
    hint = (row.get("hint") or "").split("; matches none of")[0]
    named = row["verdict"] == "different" and hint.startswith(("matches ", "closest to ", "nearest "))
    return VERBS[row["verdict"]] + (f" ({hint})" if named and not hint.startswith("matches none") else "")


def _sdpa_exports(data: dict) -> set:
    """(engine, route, model) of every route that takes transformers' model as it loads at sdpa and exports it (its
    account of what ran says "(attention sdpa"): where such a route drops the attention cap, transformers' sdpa
    attention, which takes no soft-cap, dropped it before the engine saw the graph."""
    return {(e["engine"], e["route"], e["model"]) for e in data.get("engines", [])
            if re.search(r"\(attention sdpa\b", e.get("did") or "")}


NOT_EXERCISED = "not exercised on these inputs"  # engines/forward/verdict.py's


def judged(rows: list[dict]) -> list[dict]:
    """The rows of engine routes that ran and gave a cap a verdict: not those that could not run or had no such cap,
    nor a cap not exercised on the inputs or undecided in the route's precision ("not bound")."""
    return [r for r in rows if r["verdict"] not in ("could not run", "no such architecture", "not set", NOT_EXERCISED,
                                                    "not bound")]


def _inputs(m: dict) -> str:
    """What a model ran on, and how far each cap was reached: the built models' words, or a model folder's."""
    reach = ", ".join(f"{k} {v:.3g}" for k, v in m["reach"].items() if isinstance(v, float))
    given = m.get("inputs")
    if not isinstance(given, dict):
        return f"{m['model']}: largest |a/c| {reach}"
    if given.get("bound"):
        scaled = ", ".join(f"{k} ×{v:.3g}" for k, v in (m.get("scales") or {}).items())
        return f"{m['model']} on {given['how']}: rescaled {scaled or 'nothing'}; largest |a/c| {reach}"
    past = ", ".join(f"{cap} {c['past']:,} of {c['of']:,} {'logits' if cap == 'final' else 'scores'}"
                     for cap, c in given.get("caps", {}).items() if "of" in c)
    return (f"{m['model']} as saved, on {given['how']}; largest |a/c| {reach}"
            + (f"; at or past fp32's first zero of tanh's gradient (|a/c| ≥ {given['first_zero']:.3g}): {past}"
               if past else ""))


def _unexercised(rows: list[dict], models: list[dict]) -> str:
    """The caps the inputs never exercised, and which engines match transformers on the model there."""
    quiet = [r for r in rows if r["verdict"] == NOT_EXERCISED]
    if not quiet:
        return ""
    knees = {(m["model"], cap): c for m in models if isinstance(m.get("inputs"), dict)
             for cap, c in m["inputs"].get("caps", {}).items()}
    caps = "; ".join(f"the {cap} cap of {model} (largest |a/c| {knees[(model, cap)]['reach']:.3g}, below "
                     f"{knees[(model, cap)]['knee']:.3g})" if (model, cap) in knees else f"the {cap} cap of {model}"
                     for model, cap in dict.fromkeys((r["model"], r["cap"]) for r in quiet))
    off = sorted({f"{r['engine']} ({r['route']})" for r in quiet if not r.get("matches", True)})
    same = sorted({f"{r['engine']} ({r['route']})" for r in quiet} - set(off))
    return (f" Not exercised on these inputs, so not judged (the cap changes its input by less than fp32's rounding "
            f"allowance): {caps}. There, matching transformers on the model: {', '.join(same) or 'none'}"
            + (f"; differing beyond the tolerance: {', '.join(off)}" if off else "") + ".")


def answer_of(data: dict) -> tuple[str, ...]:
    """The finding in three sentences, from the results as parity.as_dict (or merge) gives them."""
    rows = data["rows"]
    exported = _sdpa_exports(data)

    def said(row: dict) -> str:
        if row["cap"] == "attention" and row["verdict"] == "ignored" and \
                (row["engine"], row["route"], row["model"]) in exported:
            return "exports the model at transformers' sdpa attention, which drops"
        return _said(row)

    bad = _grouped(rows, [r for r in rows if r["verdict"] in BAD], said)
    bad += [f"{r['engine']} ({r['route']}) applies the {r['cap']} cap of {r['model']} that transformers leaves unused"
            for r in rows if r["verdict"] == "unused by transformers" and "the engine applies it" in r.get("hint", "")]
    ok = sorted({r["engine"] for r in rows if r["verdict"] == "applied"})
    missing = sorted({r["engine"] for r in rows if r["verdict"] == "could not run"})
    built = [_inputs(m) for m in data["models"] if not isinstance(m.get("inputs"), dict)]
    reach = "; ".join([*(["inputs built so that each cap binds", *built] if built else []),
                       *(_inputs(m) for m in data["models"] if isinstance(m.get("inputs"), dict))])
    coarse = _grouped(rows, [r for r in rows if r["verdict"] == "not bound"], lambda r: "cannot tell, in its precision,")
    ran = judged(rows)
    quiet = any(r["verdict"] == NOT_EXERCISED for r in rows)
    first = ("Caps lost, altered or added: " + "; ".join(bad) if bad else
             "No cap was exercised on these inputs, so none was judged" if not ran and quiet and not coarse else
             "No cap was judged: each was undecided in its route's precision"
             + (" or not exercised on these inputs" if quiet else "") if not ran and coarse else
             "No engine ran, so no cap was judged" if not ran else
             "Every engine that ran applied every cap its precision lets this judge" if coarse else
             "Every engine that ran applied every cap it was given") + f" ({reach})."
    second = (f"Undecided (neither reference ten times nearer): {'; '.join(coarse)}. " if coarse else "") \
        + f"Applied by: {', '.join(ok) or 'none'}." + _unexercised(rows, data["models"])
    from softcapgrad.engines.forward.parity import precap_beyond

    upstream: dict = {}
    for r in rows:
        if r["cap"] == "final" and precap_beyond(r):
            upstream.setdefault(f"{r['engine']} ({r['route']})", []).append(r["model"])
    second += (" Differ from transformers before the final cap by more than the tolerance at that scale, whatever "
               "the verdict (pre-cap error in the tables): "
               + "; ".join(f"{k} on {', '.join(v)}" for k, v in upstream.items()) + "." if upstream else "")
    elsewhere: dict = {}
    for r in rows:
        if r.get("outside_form"):
            elsewhere.setdefault((f"{r['engine']} ({r['route']})", r["outside_form"]), set()).add(r["model"])
    second += (" Compute another model outside the caps, each cap judged on it: "
               + "; ".join(f"{k} on {', '.join(sorted(v))}: {form}" for (k, form), v in elsewhere.items()) + "."
               if elsewhere else "")
    unstable = sorted({f"{r['engine']} ({r['route']}) on {r['model']}" for r in rows
                       if r["verdict"] == "not deterministic"})
    third = (f"Could not run somewhere (rows give why): {', '.join(missing)}." if missing else
             "Every engine listed ran.") + (f" A model that changes from load to load (no cap verdict given): "
                                            f"{'; '.join(unstable)}." if unstable else "") + " GPU kernels (vLLM's CUDA backends, SGLang, flash-attn): not measured here."
    return first, second, third


def parity_report(results, params: dict, written: tuple = (), repro=None, bundled=()) -> Report:
    """The parity run as a report; ``written``: the files put in place (none: nothing was written); ``bundled``: the
    reproduction bundles written in ``repro``."""
    from softcapgrad.core.report import Table
    from softcapgrad.engines.forward import parity

    rows = [{"engine": r["engine"], "route": r["route"], "model": r["model"], "cap": r["cap"],
             "verdict": r["verdict"], "max_logit": r.get("max_logit"), "error": r["error"],
             "error_off": r["error_off"], "tolerance": r["tolerance"], "where": r["where"],
             "note": r.get("hint", ""), "precap_error": r.get("precap_error"), "reach": r["reach"]}
            for p in results for r in p.rows]
    engines = [{"engine": e["engine"], "route": e["route"], "model": e["model"], "cpu_s": e["cpu_s"],
                "wall_s": e["wall_s"], "reason": e["reason"] or "", "did": e["did"] or e["how"]}
               for p in results for e in p.engines]
    return Report(
        command="parity", params=params,
        tables=(
            Table("rows", "verdict per engine and cap (log-prob errors over the whole vocabulary)", rows,
                  ("engine", "route", "model", "cap", "verdict", "max_logit", "error"),
                  wide=("error_off", "tolerance", "where", "note", "precap_error", "reach")),
            Table("engines", "engines: CPU time (user + system) of the child process, conversion included", engines,
                  ("engine", "route", "model", "cpu_s", "wall_s"), wide=("reason", "did")),
            Table("not_measured", "not measured here", parity.not_here(), ("engine", "verdict"), wide=("would_check",)),
        ),
        notes=(f"written: {', '.join(map(str, written))}" if written else "nothing written (no --out)",
               *([f"reproduction bundles in {repro}: {len(bundled)} ("
                  + (", ".join(b["bundle"] for b in bundled) or "no finding") + ")"] if repro is not None else []),
               "error: largest |Δ log-prob| against the capped form; error off: against the uncapped form; the final "
               "cap is judged on the engine's own pre-cap logits, the attention cap against transformers fp32 eager"),
        answer=answer_of(parity.as_dict(results)),
        ok=bool(judged(rows)), exit_code=NO_VERDICT,  # no cap judged is no pass: a script must not read it as one
    )
