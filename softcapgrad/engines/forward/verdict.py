"""What an engine did with each cap, from full-vocabulary log-probabilities.

Every engine runs the model twice: as it is (``capped``) and with the final cap switched off
(``final off``), which gives the engine's own pre-cap logits a. Then each cap is judged apart:

- final cap: the engine's capped log-probs against log_softmax(c·tanh(a/c)) of its own a, so that
  nothing upstream (attention, MLP, a GELU table) enters: the comparison is the cap's arithmetic
  alone, to fp32 precision at the scale c;
- attention cap: the engine's ``final off`` log-probs against the reference with the final cap
  off, and against the reference with both caps off, to the engine's own precision at the scale of
  the logits.

Verdicts: *applied* (within tolerance of the capped form), *ignored* (within tolerance of the
uncapped form), *different* (neither; the nearest of a few known alternatives is named when it
matches: the cap in bf16 or fp16, a hard clip, x/√(1+x²)), *not finite*, *not bound* (the reference
cannot tell the cap from its absence on these inputs), *not exercised on these inputs* (below, before any
of the others), *unused by transformers* (the field is set but
the reference model never applies it), *ignores the folder's caps* (the folder with its final cap
switched off gives the engine's output unchanged: the engine takes its caps from elsewhere, such as a
named config of its own; its attention cap is then judged on its capped output against transformers'
capped model with and without the attention cap), or *could not run* (per variant: a row that needs
a variant the engine could not run says which and why; the other row is judged).

Tolerances: a log-prob is a logit minus a log-sum-exp, so an error of δ in every logit moves it by
at most 2δ. The final cap's check is its own arithmetic at the scale c (a division, a tanh and a
product, each within a few fp32 ulps): δ = K·u·c with K = 16. The attention check crosses the whole
model: a dot product of n terms in a format of unit roundoff u is within n·u of its magnitude
(the textbook γ_n bound), so δ = (n·u + w)·M, with n the model's longest reduction (its hidden or
MLP width), M the largest |pre-cap logit| (model_scale) and w the unit roundoff of any step an engine rounds once to a
coarser format (llama.cpp's GELU reads an fp16 table). A bf16 cap moves logits by up to half a bf16
ulp of c, 2^-9·c, far outside both.

Not exercised: a cap whose largest |a/c| = x on the inputs stays below the knee where it changes its input by
no more than the fp32 reference's own rounding allowance for that input gets no verdict on the cap, whatever the
engine gave (a model folder run as saved, on text: ``parity DIR``). The final cap moves a logit by c·(x − tanh x),
and the row allows each logit δ = K·u·c: the knee solves x − tanh x = K·u, x ≈ (3·K·u)^(1/3) = 0.0142 in fp32.
The attention cap moves a score by the relative 1 − tanh(x)/x, and the row allows every reduction of the model,
the scores' own dot products included, a relative n·u: the knee solves 1 − tanh(x)/x = n·u, x ≈ √(3·n·u)
(0.00478 for n = 128; judging.exercised_from). The row then says whether the engine matches transformers on
the model itself: its log-probs against the reference's, at the whole-model tolerance.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from softcapgrad.engines.forward.bundle_check import LN_TINY, log_probs, top_mask, unrepresentable, worst  # noqa: F401
from softcapgrad.engines.forward.forms import ALTERNATIVE_UNITS, ALTERNATIVES, _round, cap_in, exact_cap  # noqa: F401
from softcapgrad.engines.forward.forms import EXACT_GELU, EXACT_GELU_DROPPED, EXACT_GELU_WINDOWLESS  # noqa: F401
from softcapgrad.engines.forward.forms import OUTSIDE  # noqa: F401

from softcapgrad.engines.forward.judging import (CAPPED, FP32, MATCH, OWN_PAIR, RATIO, SWAPPED, Error, K,  # noqa: F401
                                                 _nonfinite, _row, differential, error, exercised_from, model_scale,
                                                 tolerance, top)

NOT_EXERCISED = "not exercised on these inputs"
JUDGED = ("applied", "ignored", "different", "not bound", "ignores the folder's caps")  # what NOT_EXERCISED replaces
from softcapgrad.engines.forward.whole_forms import name_whole_form


def final_verdict(capped: np.ndarray, final_off: np.ndarray, c: float | None, reference, k: int = 0,
                  unit: float = FP32, once: float = 0.0) -> dict:
    """The final cap: the engine's capped log-probs against the cap of its own pre-cap logits (on each
    position's top ``k`` tokens when ``k``; in a format of unit roundoff ``unit``)."""
    if c is None:
        return _row("final", None, "not set", None, None, 0.0, hint="")
    bad = _nonfinite(capped)
    if bad:
        return _row("final", c, "not finite", None, None, 0.0, hint=f"{bad} non-finite logits")
    if _nonfinite(final_off):
        return _row("final", c, "could not run", None, None, 0.0,
                    hint="the engine's logits without the final cap are not finite: no pre-cap values to compare")
    a = np.asarray(final_off, dtype=np.float64)
    tol = tolerance(unit, c)
    lp = log_probs(capped)
    mask = top(lp, k)
    applied, ignored = error(lp, log_probs(exact_cap(a, c)), mask), error(lp, log_probs(a), mask)
    precap = error(a, reference.logits["final off"])  # raw logits: the engine's a against transformers' a
    separation = error(log_probs(exact_cap(a, c)), log_probs(a), mask).value
    extra = {"precap_error": precap.value, "precap_where": f"token {precap.token}, id {precap.vocab}",
             "separation": separation}
    if separation <= 10 * tol:
        return _row("final", c, "not bound", applied, ignored, tol, hint="the cap barely changes these logits", **extra)
    if applied.value <= tol:
        return _row("final", c, "applied", applied, ignored, tol, hint="", **extra)
    if ignored.value <= tol:
        return _row("final", c, "ignored", applied, ignored, tol, hint="", **extra)
    hint = _nearest(lp, a, c, applied.value, mask, unit)
    if hint.startswith("matches none"):  # forms that change the model upstream of the logits: whole-model tolerance
        model_tol = tolerance(unit, model_scale(reference), reference.width, once)
        for name, logits in reference.final_alternatives.items():
            e = error(lp, log_probs(logits), mask).value
            if e <= model_tol and e <= MATCH * applied.value:
                hint = f"matches {name}"
    return _row("final", c, "different", applied, ignored, tol, hint=hint, **extra)


def _nearest(lp: np.ndarray, a: np.ndarray, c: float, exact: float, mask=None, unit: float = FP32) -> str:
    """The alternative form the engine's output fits, where one fits within its own tolerance and much better."""
    fits = []
    for name, form in ALTERNATIVES.items():
        e = error(lp, log_probs(form(a, c)), mask).value
        tol = tolerance(max(ALTERNATIVE_UNITS.get(name, FP32), unit), c)
        if e <= tol and e <= MATCH * exact:
            fits.append((e, name))
    return f"matches {min(fits)[1]}" if fits else "matches none of: " + "; ".join(ALTERNATIVES)


def attention_verdict(final_off: np.ndarray, c: float | None, reference, once: float, uncapped=None, k: int = 0,
                      unit: float = FP32, against: tuple[str, str] = ("final off", "uncapped")) -> dict:
    """The attention cap: the engine without its final cap against the reference with and without the attention
    cap (``against``: the reference variants with and without it; the capped pair for an engine that keeps its
    own final cap whatever the folder says)."""
    if c is None:
        return _row("attention", None, "not set", None, None, 0.0, hint="")
    bad = _nonfinite(final_off)
    if not reference.applied["attention"]:
        return _unused(final_off, c, reference, once, bad, uncapped)
    if bad:
        return _row("attention", c, "not finite", None, None, 0.0, hint=f"{bad} non-finite logits")
    on, off = reference.logits[against[0]], reference.logits[against[1]]
    scale = model_scale(reference, on)
    tol = tolerance(unit, scale, reference.width, once)
    lp = log_probs(final_off)
    mask = top(lp, k)
    applied, ignored = error(lp, log_probs(on), mask), error(lp, log_probs(off), mask)
    separation = error(log_probs(on), log_probs(off), mask).value
    extra = {"separation": separation}
    own_pair = uncapped is not None and against == ("final off", "uncapped") and not _nonfinite(uncapped)
    if own_pair:  # the engine's own run without the cap: its own effect of the cap against the reference's
        extra["differential"], extra["own_effect"] = differential(final_off, uncapped, on, off, mask)
    if separation <= 10 * tol and unit > FP32 and separation > 10 * tolerance(FP32, scale, reference.width, once):
        # the worst-case bound of a low precision spans the cap's effect, which fp32 tells apart: which
        # reference the engine is nearer to, by the factor a server's answer is judged by
        said = (f"the worst-case rounding bound of this precision ({tol:.3g}) exceeds a tenth of the cap's effect "
                f"({separation:.3g}): judged by which reference is {RATIO:g} times nearer")
        if applied.value * RATIO < ignored.value:
            return _row("attention", c, "applied", applied, ignored, tol, hint=said, **extra)
        if ignored.value * RATIO < applied.value:
            return _row("attention", c, "ignored", applied, ignored, tol, hint=said, **extra)
        return _row("attention", c, "not bound", applied, ignored, tol, **extra,
                    hint=f"in this precision neither reference is {RATIO:g} times nearer ({applied.value:.3g} from "
                         f"the capped, {ignored.value:.3g} from the uncapped); its worst-case rounding bound "
                         f"({tol:.3g}) spans the cap's effect ({separation:.3g})")
    if separation <= 10 * tol:
        return _row("attention", c, "not bound", applied, ignored, tol,
                    hint="on these inputs the reference cannot tell the cap from its absence", **extra)
    if applied.value <= tol:
        return _row("attention", c, "applied", applied, ignored, tol, hint="", **extra)
    if ignored.value <= tol:
        return _row("attention", c, "ignored", applied, ignored, tol, hint="", **extra)
    forms = _forms(reference.alternatives, against[0] != "final off")
    fits = []
    for name, logits in forms.items():
        e = error(lp, log_probs(logits), mask).value
        if e <= MATCH * applied.value:
            fits.append((e, name))
    best = min(fits) if fits else None
    hint = f"closest to {best[1]} ({best[0]:.2g})" if best else "matches none of: " + "; ".join(forms)
    if not fits and min(applied.value, ignored.value) * RATIO < max(applied.value, ignored.value):
        near = "with" if applied.value < ignored.value else "without"
        hint = (f"nearest the model {near} the attention cap ({min(applied.value, ignored.value):.2g} against "
                f"{max(applied.value, ignored.value):.3g}), beyond this precision's bound; {hint}")
    if best and best[0] <= tol and best[1] in OUTSIDE:  # another model outside the caps, the cap as named
        e, name = best
        said = f"judged on the model as the engine computes it outside the caps: matches {name} ({e:.2g})"
        if OUTSIDE[name] == "different":  # the cap lost with more than the cap: named as the other forms are
            return _row("attention", c, "different", applied, ignored, tol, hint=f"matches {name} ({e:.2g})",
                        fits=name, outside_form=name, **extra)
        applied, ignored = ((replace(applied, value=e), ignored) if OUTSIDE[name] == "applied" else
                            (applied, replace(ignored, value=e)))
        return _row("attention", c, OUTSIDE[name], applied, ignored, tol, hint=said, outside_form=name, **extra)
    if best and best[0] <= tol:  # within the tolerance of a named form: the final cap is judged beside it
        extra["fits"] = best[1]
    first = error(lp[:1], log_probs(on)[:1], None if mask is None else mask[:1]).value
    if not fits and own_pair and extra["differential"] * RATIO < extra["own_effect"]:
        # neither reference and no named form: the engine's own pair of runs decides. Its own effect of the cap ten
        # times nearer the reference's effect than none is the cap applied (an upstream difference alters the cap's
        # effect a little, beyond the fp32 bound at these scales); the rest of its difference lies outside the cap.
        hint = (f"{OWN_PAIR}: removing it moves its log-probs by "
                f"{extra['own_effect']:.3g}, and its effect lies {extra['differential']:.2g} from the reference's; "
                f"it differs from transformers outside the cap by {applied.value:.2g}"
                + (f" ({first:.2g} at the first token)" if first > tol else ""))
        return _row("attention", c, "applied", applied, ignored, tol, hint=hint, **extra,
                    **({"outside": first} if first > tol else {}))
    if not fits and own_pair and extra["own_effect"] <= 2 * tol:  # no effect of its own: named, not judged, since
        # an engine that takes its caps from its own config (torchtune's builders) gives equal runs too
        hint = ("the engine's runs with and without the folder's cap are the same (it ignores that cap, or takes "
                f"its own from elsewhere); {hint}")
    if not fits and first > tol:
        # the first token attends to itself alone: its softmax is 1 whatever the scores, so no attention cap
        # or window acts there, and a difference beyond the tolerance there lies elsewhere in the model
        extra["outside"] = first
        share = "the difference lies" if 2 * first >= applied.value else "part of the difference lies"
        hint = (f"already {first:.2g} at the first token, where attention has one key and no attention cap acts: "
                f"{share} outside the cap; {hint}")
    return _row("attention", c, "different", applied, ignored, tol, hint=hint, **extra)


def _forms(alternatives: dict, capped: bool) -> dict:
    """The attention alternatives computed with the final cap off, or (``capped``) on (``CAPPED + name``)."""
    if not capped:
        return {k: v for k, v in alternatives.items() if not k.startswith(CAPPED)}
    return {k[len(CAPPED):]: v for k, v in alternatives.items() if k.startswith(CAPPED)}


def _unused(final_off: np.ndarray, c: float, reference, once: float, bad: int, uncapped=None) -> dict:
    """A cap set in the config that transformers never applies: does the engine agree with transformers' output?"""
    base = reference.logits["final off"]
    tol = tolerance(FP32, float(np.abs(base).max()), reference.width, once)
    if bad:
        return _row("attention", c, "unused by transformers", None, None, tol, hint=f"{bad} non-finite logits")
    e = error(log_probs(final_off), log_probs(base))
    forced = error(log_probs(final_off), log_probs(reference.logits["attention forced"]))
    moved = None if uncapped is None else error(log_probs(final_off), log_probs(uncapped)).value
    if moved is not None and moved > tol:
        hint = (f"transformers never passes this cap to its attention (dead config); the engine applies it: removing "
                f"it moves the engine's log-probs by {moved:.3g} (against transformers: {e.value:.3g} as shipped, "
                f"{forced.value:.3g} with the cap forced on)")
    elif e.value <= tol:
        hint = "the engine agrees with transformers, which never passes this cap to its attention (dead config)"
    elif forced.value <= tol:
        hint = (f"transformers never passes this cap to its attention (dead config); the engine applies it: it "
                f"matches transformers with the cap forced on ({forced.value:.2g}), not as shipped ({e.value:.3g})")
    else:
        hint = (f"transformers never passes this cap to its attention (dead config); the engine differs from it by "
                f"{e.value:.3g} in log-prob, and from it with the cap forced on by {forced.value:.3g}")
    return _row("attention", c, "unused by transformers", None, e, tol, hint=hint)


def keeps_own_final_cap(capped: np.ndarray, final_off: np.ndarray, reference, unit: float = FP32,
                        once: float = 0.0) -> float | None:
    """The engine's two runs' largest log-prob difference, where the folder without its final cap gives the same
    output as the folder with it although transformers' two differ by far more, and that output is still bounded
    by c (None otherwise): the engine takes its cap from somewhere else than the folder (its own named config), so
    its "final off" run is no pre-cap a. An engine that drops the cap also gives two equal runs, but unbounded
    ones: transformers' pre-cap logits reach several times c here. The bound allows one rounding of the tanh
    and one of the product in the engine's format."""
    c = reference.caps["final"]
    if c is None or _nonfinite(capped, final_off):
        return None
    tol = tolerance(unit, model_scale(reference), reference.width, once)
    same = error(log_probs(capped), log_probs(final_off)).value
    apart = error(log_probs(reference.logits["capped"]), log_probs(reference.logits["final off"])).value
    bounded = float(np.abs(final_off).max()) <= c * (1 + 4 * unit)
    return same if same <= tol and apart > 10 * tol and bounded else None


def _own_cap_row(capped: np.ndarray, c: float, same: float, reference, k: int, unit: float, once: float) -> dict:
    """The final cap of an engine that ignores the folder's caps: its output against transformers' capped model."""
    tol = tolerance(unit, model_scale(reference), reference.width, once)
    lp = log_probs(capped)
    mask = top(lp, k)
    applied = error(lp, log_probs(reference.logits["capped"]), mask)
    ignored = error(lp, log_probs(reference.logits["final off"]), mask)
    agrees = ("its output matches transformers' capped model: the cap it applies is its own config's, equal here "
              "to the folder's" if applied.value <= tol else
              f"its output differs from transformers' capped model by {applied.value:.3g} in log-prob")
    hint = (f"the folder with its final cap switched off gives the same output (largest log-prob difference "
            f"{same:.2g}): the engine reads no cap from the folder; {agrees}")
    return _row("final", c, "ignores the folder's caps", applied, ignored, tol, hint=hint)


def _final_from_reference(capped: np.ndarray, c: float, reference, k: int, unit: float, once: float,
                          said: str, pair: tuple[str, str] = ("capped", "final off")) -> dict:
    """The final cap where the engine's own pre-cap a is unknown: it returns log-probabilities (a log-softmax
    loses the shift, and c·tanh(a/c) depends on it), or it could not run the folder without the cap. Its
    capped run is judged against transformers' capped and final-off models (``pair``; without the attention
    cap where the engine was found to drop it), at the whole model's tolerance."""
    if _nonfinite(capped):
        return _row("final", c, "not finite", None, None, 0.0, hint=f"{_nonfinite(capped)} non-finite log-probs")
    tol = tolerance(unit, model_scale(reference), reference.width, once)
    lp = log_probs(capped)
    mask = top(lp, k)
    forms = {**reference.logits, **reference.alternatives}
    applied = error(lp, log_probs(forms[pair[0]]), mask)
    ignored = error(lp, log_probs(forms[pair[1]]), mask)
    if applied.value <= tol:
        return _row("final", c, "applied", applied, ignored, tol, hint=said)
    if ignored.value <= tol:
        return _row("final", c, "ignored", applied, ignored, tol, hint=said)
    return _row("final", c, "different", applied, ignored, tol, hint=said)


def verdicts(outcome_logits: dict, reference, once: float = 0.0, k: int = 0, unit: float = FP32,
             failed: dict | None = None, output: str = "logits") -> list[dict]:
    """Both caps' rows for one engine's logits {"capped": ..., "final off": ...}, each with the engine's
    largest |logit| (a capped model's never exceed c). ``failed`` names the variants the engine could not run,
    with their reasons: the rows that need them say so, the others are judged."""
    failed = failed or {}
    capped, final_off = outcome_logits.get("capped"), outcome_logits.get("final off")
    caps = reference.caps
    if capped is None and final_off is None:  # only the folder without any cap ran: nothing to judge a cap by
        rows = [_failed("attention", caps["attention"], "final off", failed), _failed("final", caps["final"],
                                                                                        "capped", failed)]
        for row in rows:
            row.update(max_logit=None, top_k=k)
            if row["verdict"] == "could not run":
                row["hint"] += "; only the folder without any cap ran"
        return rows
    same = None if capped is None or final_off is None else keeps_own_final_cap(capped, final_off, reference, unit,
                                                                                 once)
    if final_off is None or same is not None:
        attention = attention_verdict(capped, caps["attention"], reference, once, None, k, unit,
                                      against=("capped", "attention off"))
    else:
        attention = attention_verdict(final_off, caps["attention"], reference, once,
                                      outcome_logits.get("uncapped"), k, unit)
    if capped is None:
        final = _failed("final", caps["final"], "capped", failed)
    elif same is not None:
        final = _own_cap_row(capped, caps["final"], same, reference, k, unit, once)
    elif (final_off is None or output == "logprobs") and caps["final"] is not None:
        said = ("log-probabilities only: judged against transformers' capped and uncapped models, not its own a"
                if final_off is not None else
                f"the folder without its final cap could not run ({failed.get('final off', 'no logits')}): "
                "judged against transformers' capped and uncapped models")
        pair = ("attention off", "uncapped") if attention["verdict"] == "ignored" else ("capped", "final off")
        fits = attention.get("fits")
        if fits and CAPPED + fits in reference.alternatives and fits in reference.alternatives:
            pair = (CAPPED + fits, fits)  # upstream as the engine computes it, with and without the final cap
            said += f", both as {fits}"
        final = _final_from_reference(capped, caps["final"], reference, k, unit, once, said, pair)
    elif final_off is None:
        final = _row("final", None, "not set", None, None, 0.0, hint="")
    else:
        final = final_verdict(capped, final_off, caps["final"], reference, k, unit, once)
    if capped is not None and final["verdict"] in ("ignores the folder's caps", "different") and (
            same is not None or final_off is None or output == "logprobs"):
        name_whole_form(capped, attention, final, reference, k, unit, once)
    if "outside" in attention and final["verdict"] == "different" and (final_off is None or output == "logprobs"):
        final.update(outside=attention["outside"], hint="the model differs outside its caps (the attention row's first "
                     "token), which a comparison with transformers' models cannot tell from the cap; " + final["hint"])
    rows = [attention, final]
    if "uncapped" in failed and attention["verdict"] == "unused by transformers":
        attention["hint"] += f"; the folder without any cap could not run: {failed['uncapped']}"
    shown = capped if capped is not None else final_off
    for i, row in enumerate(rows):
        if row["verdict"] in JUDGED and not exercised(reference, row["cap"]):
            rows[i] = _not_exercised(row["cap"], shown, "capped" if capped is not None else "final off", reference, k,
                                     unit, once)
    finite = np.abs(shown[np.isfinite(shown)])
    largest = None if output == "logprobs" or not finite.size else float(finite.max())
    for row in rows:
        row.update(max_logit=largest, top_k=k)
    return rows


def exercised(reference, cap: str) -> bool:
    """Whether the cap's largest |a/c| on the inputs reaches the knee below which it changes nothing the fp32
    reference can tell from rounding (True where nothing was reached to compare)."""
    x = reference.reach.get(cap)
    return x is None or x >= exercised_from(reference, cap)


def _not_exercised(cap: str, logits: np.ndarray, variant: str, reference, k: int, unit: float, once: float) -> dict:
    """A cap the inputs never exercised: no verdict on it; whether the engine matches transformers' model (its
    ``variant``) at the whole-model tolerance."""
    x, knee = reference.reach[cap], exercised_from(reference, cap)
    tol = tolerance(unit, model_scale(reference), reference.width, once)
    lp = log_probs(logits)
    e = error(lp, log_probs(reference.logits[variant]), top(lp, k))
    what = "a logit" if cap == "final" else "a score, relative to it,"
    said = ("the engine matches transformers on this model" if e.value <= tol else
            f"the engine differs from transformers on this model by {e.value:.3g}, beyond the tolerance: outside "
            "the cap, which changes nothing here")
    return _row(cap, reference.caps[cap], NOT_EXERCISED, e, None, tol, matches=e.value <= tol,
                hint=f"largest |a/c| {x:.3g}, below {knee:.3g}, where the cap changes {what} by less than fp32's "
                     f"rounding allowance: no verdict on the cap; {said}")


def _failed(cap: str, c, variant: str, failed: dict) -> dict:
    if c is None:
        return _row(cap, None, "not set", None, None, 0.0, hint="")
    what = {"capped": "the folder as it is", "final off": "the folder without its final cap"}[variant]
    return _row(cap, c, "could not run", None, None, 0.0, hint=f"{what}: {failed.get(variant, 'no logits')}")


def could_not_run(reference, reason: str, verdict: str = "could not run") -> list[dict]:
    return [_row(cap, reference.caps[cap], verdict, None, None, 0.0, hint=reason, max_logit=None, top_k=0)
            for cap in ("attention", "final")]


def no_architecture(reference, reason: str) -> list[dict]:
    """The engine's own registry does not claim this model type."""
    return could_not_run(reference, reason, "no such architecture")
