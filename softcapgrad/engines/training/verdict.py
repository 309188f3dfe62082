"""What a route's training step did with each cap: forward and backward, against the float64 references.

Three comparisons place the step among the references of engines/training/reference.py (the model with
both caps, each off, none; the caps' values swapped):

- forward: the returned logits' log-probs (largest |Δ|), and apart from them the loss, which the model
  computes from logits that need not be the returned ones;
- backward: every parameter's gradient, the largest |Δ| over all of them relative to the reference's
  largest gradient component; candidates are the reference of the forward's cell and the caps
  computed forward exactly with another backward (straight-through, detached, the gradient of
  a·tanh(a/c), the backward rounded to bf16, no other gradient for a route in bf16 or coarser);
- at the final cap, where the route exposes its input a and the gradients at a and at the returned
  logits z: z against c·tanh(a/c) of its own a, and dL/da against dL/dz·sech²(a/c), the cap's own
  arithmetic, to the route's precision at the scale of c (and of dL/dz).

A step is placed in a cell when it lies within the tolerance of that reference and outside every
other's; or, where the tolerance cannot tell the references apart (bf16), when it is ``RATIO`` times
nearer one than any other; else the row says the precision cannot decide (``not bound``).

Tolerances, from the format: a log-prob (and the loss, a mean of them) within 2δ, δ = n·u·M, as
verdict.tolerance has it (n the model's longest reduction, u the unit roundoff, M the largest
|logit|). A gradient component is the backward's reduction of the same width over the forward's:
relative to the largest one, within 2·(2n·u). The local checks allow K = 16 roundings (verdict.K)
at the scale c for z and at the scale of dL/dz for dL/da.
"""

from __future__ import annotations

import numpy as np

from softcapgrad.engines.forward import verdict
from softcapgrad.engines.forward.alternatives import WINDOWLESS
from softcapgrad.engines.training.reference import (
    FORM_NAMES, HIDDEN, HIDDEN_EXCHANGED, OFF, OUTSIDE, ROUNDED, SWAPPED, WHOLE_FORMS, Z_TANH, lora_view,
    next_token_log_probs, upstream,
)

APPLIED = "applied forward and backward"
OTHER = "applied forward, another gradient"
IGNORED = "ignored"
ELSEWHERE = "applied to another tensor"
NOT_FINITE = "not finite"
NOT_RUN = "could not run"
DIFFERENT = "different"
NOT_BOUND = "not bound"
NOT_SET = "not set"
NO_ARCHITECTURE = "no such architecture"
WRONG = "wrong form"  # the final cap computed as another function of a (a·tanh(a/c)): not "applied"
BAD = (OTHER, IGNORED, ELSEWHERE, NOT_FINITE, DIFFERENT, WRONG)
ON = {"capped": {"attention", "final"}, "attention off": {"final"}, "final off": {"attention"}, "uncapped": set(),
      HIDDEN: {"attention"}, HIDDEN_EXCHANGED: {"attention"},  # the attention cap in place, the final one elsewhere
      Z_TANH: {"attention"},  # the attention cap in place, the final one in another form
      WINDOWLESS: {"attention", "final"},  # both caps, the local layers' window dropped
      **{n: {"attention", "final"} for n in OUTSIDE}, **{n + OFF: {"final"} for n in OUTSIDE}}  # other deviations
BF16 = 2.0 ** -8
LOWER = "computed in a lower precision than the forward"


def _finite(x) -> bool:
    return x is None or bool(np.all(np.isfinite(x)))


def logit_error(step, other, ids=None) -> float:
    """The largest |Δ log-prob| of the returned logits; where a fused head returned only each position's log-prob
    of the next token, of those."""
    if step.logits is None:
        return float(np.abs(step.token_log_probs - next_token_log_probs(other.logits, ids)).max())
    return verdict.error(verdict.log_probs(step.logits), verdict.log_probs(other.logits)).value


def grad_error(mine: dict, other: dict) -> tuple[float, str]:
    """The largest |Δ gradient| over every parameter, relative to ``other``'s largest component, and where. A
    parameter without a gradient on one side (nothing reached it) counts as zeros there."""
    scale = max((float(np.abs(g).max()) for g in other.values() if g.size), default=0.0) or 1.0
    worst, where = 0.0, ""
    for name in sorted(set(mine) | set(other)):
        a, b = mine.get(name), other.get(name)
        a = np.zeros_like(b) if a is None else a
        b = np.zeros_like(a) if b is None else b
        if a.shape != b.shape:
            return float("inf"), f"{name} of shape {a.shape}, expected {b.shape}"
        e = float(np.abs(a - b).max()) / scale if a.size else 0.0
        if e > worst:
            worst, where = e, name
    return worst, where


def loss_scale(step, cell, tol: dict) -> float | None:
    """s where the step's dL/dz is s times the reference cell's (least squares, the rest within the gradient
    tolerance) and its loss s times that cell's (within the forward tolerance), s not 1: a loss normalised by
    another count (transformers 4.57.6's Trainer divides by every label, n, where the model averages n − 1)."""
    if cell is None or step.logits_grad is None or cell.logits_grad is None \
            or step.logits_grad.shape != cell.logits_grad.shape:
        return None
    mine, other = np.asarray(step.logits_grad, np.float64), np.asarray(cell.logits_grad, np.float64)
    norm = float(np.vdot(other, other))
    if not norm:
        return None
    s = float(np.vdot(mine, other)) / norm
    if not s or abs(s - 1.0) <= tol["grad"] or grad_error({"z": mine / s}, {"z": other})[0] > tol["grad"]:
        return None
    return s if abs(step.loss - s * cell.loss) <= tol["forward"] else None


def tolerances(reference, unit: float, once: float = 0.0) -> dict:
    m = float(np.abs(reference.steps["capped"].logits).max())
    return {"forward": verdict.tolerance(unit, m, reference.width, once),
            "grad": verdict.tolerance(unit, 1.0, 2 * reference.width, once)}


def nearest(errors: dict, tol: float) -> tuple[str | None, str]:
    """The one candidate the step lies within ``tol`` of (none other), or ``RATIO`` times nearer than any other (a
    lone candidate only within ``tol``: with no other, nearer says nothing)."""
    ranked = sorted(errors.items(), key=lambda kv: kv[1])
    best, e = ranked[0]
    if len(ranked) == 1:
        return (best, "within tolerance") if e <= tol else (None, f"nearest {best} ({e:.3g}), no other reference")
    second = ranked[1][1]
    if e <= tol and second > tol:
        return best, "within tolerance"
    if e * verdict.RATIO < second:
        return best, f"{verdict.RATIO:g} times nearer than any other reference"
    return None, f"nearest {best} ({e:.3g}), next {ranked[1][0] if len(ranked) > 1 else '-'} ({second:.3g})"


def local_final(step, c: float, unit: float, ids=None) -> dict | None:
    """The final cap's own arithmetic on the route's own a: forward (z against c·tanh(a/c) and against a) and
    backward (dL/da against dL/dz·sech²(a/c), the upstream unchanged, zero); None where a is not exposed."""
    if step.precap is None or step.logits is None or step.precap.shape != step.logits.shape:
        return None
    a, z = step.precap, step.logits
    tol = verdict.tolerance(unit, c)
    capped, plain = float(np.abs(z - c * np.tanh(a / c)).max()), float(np.abs(z - a).max())
    out = {"forward": "applied" if capped <= tol < plain else "ignored" if plain <= tol < capped else "different",
           "local_error": capped, "local_tolerance": tol}
    g, derived = upstream(step, ids) if ids is not None else (step.logits_grad, "")
    if step.precap_grad is None or g is None:
        out["backward"] = None
        return out
    da = step.precap_grad
    scale = float(np.abs(g).max()) or 1.0
    exact = float(np.abs(da - g / np.cosh(a / c) ** 2).max()) / scale
    through = float(np.abs(da - g).max()) / scale
    gtol = verdict.tolerance(unit, 1.0)
    if exact <= gtol:
        backward = "exact"
    elif through <= gtol:
        backward = FORM_NAMES[0]
    elif not np.any(da):
        backward = FORM_NAMES[1]
    elif exact <= verdict.tolerance(max(unit, BF16), 1.0):
        backward = f"{LOWER} (within bf16's bound {verdict.tolerance(BF16, 1.0):.3g}, beyond {gtol:.3g})"
    else:
        backward = "another function's"
    out.update(backward=backward, local_grad_error=exact, local_grad_tolerance=gtol, local_upstream=derived)
    return out


def distinct(reference) -> dict:
    """The references that are different models: where a cap is not set, or transformers' code never applies it,
    switching it off changes nothing (``attention off`` is ``capped``, ``uncapped`` is ``final off``), and such a
    twin would make every step equally near two cells; the first of each pair is kept."""
    inert = {cap for cap in ("attention", "final") if reference.caps[cap] is None or not reference.applied[cap]}
    kept, seen = {}, set()
    for name, step in reference.steps.items():  # capped, attention off, final off, uncapped
        key = frozenset(ON[name] - inert)
        if key not in seen:
            seen.add(key)
            kept[name] = step
    return kept


def _row(cap: str, c, verdict_: str, hint: str = "", **extra) -> dict:
    return {"cap": cap, "c": c, "verdict": verdict_, "hint": hint, **extra}


def _candidates(step, reference, base: str, local) -> tuple[dict, str]:
    """The gradients the step's are compared with: the reference of its cell, and where that is the capped model
    each cap computed with a wrong backward. Where the route exposes dL/da at the final cap, that is carried back
    through the reference instead (training/reference.py's backprop): the final cap is judged on its own arithmetic, the
    rest of the model (the attention cap) alone."""
    if local is not None and local.get("backward") is not None and base == "capped":
        from softcapgrad.engines.training.reference import backprop, forms

        out = {"exact": backprop(reference, step.precap_grad)}
        if "attention" in reference.forms:
            out.update({("attention", n): backprop(reference, step.precap_grad, fn) for n, fn in forms().items()})
        return out, "; the route's own dL/da carried back through the reference"
    out = {"exact": {**reference.steps, **(reference.others or {})}[base].grads}
    if base == "capped":
        out.update({(cap, n): s.grads for cap, named in reference.forms.items() for n, s in named.items()})
    return out, ""


def placeable(others: dict, unit: float) -> dict:
    """The other models a step of this precision can be placed in: a form that rounds part of the model to bf16
    is no other model for a route that computes in bf16 or coarser (its own roundings are of that size), so it is
    left out there, as the tolerance leaves out each rounding of the route's own format."""
    return {k: v for k, v in others.items() if not (unit >= BF16 and k.removesuffix(OFF) in ROUNDED)}


def judge(step, reference, unit: float = verdict.FP32, once: float = 0.0,
          without: frozenset = frozenset()) -> list[dict]:
    """Both caps' rows for one route's step; ``without``: caps the route is seen not to compute (the references
    with them on left out: engines/training/watch.py)."""
    caps = reference.caps
    if not all(_finite(x) for x in (step.logits, step.token_log_probs, np.asarray(step.loss), *step.grads.values())):
        return [_row(cap, caps[cap], NOT_FINITE if caps[cap] is not None else NOT_SET,
                     "the loss, the logits or a gradient is not finite") for cap in ("attention", "final")]
    tol = tolerances(reference, unit, once)
    refs = distinct(reference)
    if reference.swapped is not None:
        refs[SWAPPED] = reference.swapped
    refs.update(placeable(reference.others or {}, unit))
    refs = {k: v for k, v in refs.items() if not ON.get(k, {"attention", "final"}) & without}  # the rest: both on
    forward = {k: logit_error(step, s, reference.ids) for k, s in refs.items()}
    loss = {k: abs(step.loss - s.loss) for k, s in refs.items()}
    f_cell, f_how = nearest(forward, tol["forward"])
    l_cell, _ = nearest(loss, tol["forward"])
    local = local_final(step, caps["final"], unit, reference.ids) if caps["final"] is not None else None
    grads, where, said = {}, {}, ""
    scale = loss_scale(step, refs.get(f_cell), tol) if f_cell is not None and l_cell != f_cell else None
    mine = step.grads
    if scale is not None:  # the logits are the cell's, the loss and dL/dz a constant times its: judged unscaled
        l_cell = f_cell
        said = (f"; the loss and every gradient are {scale:.6g} times the reference's (the loss normalised by "
                "another count), compared once divided by it")
    if f_cell is not None and not set(WHOLE_FORMS) & {f_cell, l_cell}:
        base = l_cell if l_cell not in (None, f_cell) else f_cell
        candidates, how = _candidates(step, reference, base, local)
        said += how
        if scale is not None and not how:  # the route's own dL/da, carried back, is already scaled
            mine = {k: v / scale for k, v in step.grads.items()}
        if step.frozen:  # what the route does not train is left out on every side
            candidates = {k: {n: g for n, g in v.items() if n not in step.frozen} for k, v in candidates.items()}
            said += f"; left out, as the route freezes them: {', '.join(sorted(step.frozen))}"
        view = lora_view(step)
        if view is not None:  # a LoRA step: every reference's gradients as the adapters' B see them
            candidates = {k: view(v) for k, v in candidates.items()}
            said += "; LoRA: the references' dL/dW as dL/dB = scale·(dL/dW)·Aᵀ of the adapted weights"
        for name, other in candidates.items():
            grads[name], where[name] = grad_error(mine, other)
        for cap in reference.forms:
            if (cap, FORM_NAMES[3]) in candidates:  # what one bf16 rounding of this cap's backward does here
                grads[("low", cap)] = grad_error(candidates[(cap, FORM_NAMES[3])], candidates["exact"])[0]
    low = {k[1]: grads.pop(k) for k in list(grads) if k[0] == "low"}
    if unit >= BF16:  # one bf16 rounding of a cap's exact backward is the route's own format, no other gradient
        grads = {k: v for k, v in grads.items() if not (isinstance(k, tuple) and k[1] == FORM_NAMES[3])}
    g_cell, g_how = nearest(grads, tol["grad"]) if grads else (None, "")
    shown = g_cell if g_cell is not None else "exact"
    shared = {"forward_cell": f_cell, "loss_cell": l_cell, "forward_error": forward.get(f_cell),
              "forward_tolerance": tol["forward"], "grad_tolerance": tol["grad"], "grad_error": grads.get(shown),
              "grad_where": where.get(shown), "grad_scale": scale}
    rows, unbound = [], unbinding(reference, tol)
    for cap in ("attention", "final"):
        c = caps[cap]
        if c is None:
            rows.append(_row(cap, None, NOT_SET))
            continue
        extra = dict(shared, **({k: v for k, v in local.items() if k.startswith("local")} if cap == "final"
                                and local else {}))
        if not reference.applied[cap]:
            rows.append(_row(cap, c, "unused by transformers", "the reference model never applies this cap", **extra))
            continue
        judged = {"f_cell": f_cell, "f_how": f_how, "f_best": min(forward.values()), "l_cell": l_cell, "g_cell": g_cell, "g_how": g_how + said,
                  "lower": _lower(cap, grads, low.get(cap), tol["grad"])}
        row = _cap_row(cap, c, judged, local if cap == "final" else None, extra)
        if cap in unbound and row["verdict"] in (APPLIED, IGNORED, OTHER, NOT_BOUND):  # a saved model's cap that changes
            row = _row(cap, c, NOT_BOUND, unbound[cap], **extra)  # nothing this precision sees: neither holds
        rows.append(row)
    return rows


UNBOUND = "the cap does not bind on these inputs"


def unbinding(reference, tol: dict) -> dict:
    """Each cap of a saved model (weights not scaled so that it binds) whose switching off moves neither the
    reference's log-probs nor its gradients beyond the tolerance: cap -> why no step can be said to apply or ignore
    it. Parity's tiny models are scaled until every cap binds: none there."""
    if reference.reach is None:
        return {}
    out = {}
    for cap in ("attention", "final"):
        off = reference.steps.get(f"{cap} off")
        if reference.caps[cap] is None or not reference.applied[cap] or off is None:
            continue
        on = reference.steps["capped"]
        f, g = logit_error(off, on), grad_error(off.grads, on.grads)[0]
        if f <= tol["forward"] and g <= tol["grad"]:
            r = reference.reach.get(cap)
            out[cap] = (f"{UNBOUND} (largest |a/c| {'unknown' if r is None else f'{r:.3g}'}): switched off in the "
                        f"float64 reference it moves the log-probs by {f:.3g} (tolerance {tol['forward']:.3g}) and "
                        f"the gradients by {g:.3g} ({tol['grad']:.3g}), so applied and ignored look the same")
    return out


def _lower(cap: str, grads: dict, low: float | None, tol: float) -> str | None:
    """Where the gradients miss the exact backward by about what one bf16 rounding of this cap's backward does on
    this model (at most twice that) and every other wrong backward is ``RATIO`` times farther: the words for it."""
    e = grads.get("exact")
    if low is None or e is None or not tol < e <= 2 * low:
        return None
    others = [v for k, v in grads.items() if k != "exact" and k != (cap, FORM_NAMES[3])]
    if any(v < verdict.RATIO * e for v in others):
        return None
    return (f"{LOWER}: its gradients miss the exact backward's by {e:.3g}, of the size one bf16 rounding of this "
            f"cap's backward gives here ({low:.3g}), beyond fp32's bound {tol:.3g}")


def _cap_row(cap, c, judged, local, extra) -> dict:
    f_cell, f_how, l_cell, g_cell, g_how = (judged[k] for k in ("f_cell", "f_how", "l_cell", "g_cell", "g_how"))
    for form in WHOLE_FORMS:
        if form in (f_cell, l_cell):
            return _row(cap, c, DIFFERENT, f"matches {form}", form=form, **extra)
    grads = (f"its gradients match that model's ({g_how})" if g_cell == "exact" else
             f"its gradients match none of that model's references ({g_how})")
    if cap == "final" and Z_TANH in (f_cell, l_cell):
        return _row(cap, c, WRONG, f"the returned log-probs match {Z_TANH} ({f_how}); {grads}", form=Z_TANH, **extra)
    if f_cell == WINDOWLESS and cap == "attention":  # the window is the attention's: its row says the model differs
        return _row(cap, c, DIFFERENT, f"the returned logits match {WINDOWLESS}, both caps applied ({f_how}); {grads}",
                    form=WINDOWLESS, **extra)
    if f_cell in (HIDDEN, HIDDEN_EXCHANGED) and cap == "final":
        return _row(cap, c, ELSEWHERE, f"the returned logits match {f_cell} ({f_how})", form=f_cell, **extra)
    if f_cell is None:
        own = local and local["forward"] == "applied" and cap == "final"
        if own and local.get("backward") is not None:
            return _from_local(cap, c, local, f"the whole model cannot be placed ({f_how}); judged on the final "
                                              "cap's own arithmetic", extra)
        if judged["f_best"] > verdict.RATIO * extra["forward_tolerance"]:  # far from every model: no precision's
            said = ("; its forward is c·tanh(a/c) of the route's own a, whose gradient the route does not expose"
                    if own else "")
            return _row(cap, c, DIFFERENT, f"the returned logits match no reference, each more than {verdict.RATIO:g} "
                                           f"times the tolerance away: the model differs outside the caps ({f_how})"
                                           f"{said}", **extra)
        return _row(cap, c, NOT_BOUND, f"the returned logits match no reference: {f_how}", **extra)
    if cap not in ON[f_cell]:
        if l_cell is not None and cap in ON[l_cell]:
            return _row(cap, c, ELSEWHERE, f"the loss is computed with the cap (its cell: {l_cell}), the returned "
                                           f"logits without it (their cell: {f_cell})", form="the loss only", **extra)
        if local and local["forward"] == "applied":
            return _row(cap, c, DIFFERENT, "the returned logits are c·tanh(a/c) of the route's own a, but the model "
                                           f"matches the reference without this cap ({f_cell})", **extra)
        return _row(cap, c, IGNORED, f"the returned logits match the reference {f_cell} ({f_how})", **extra)
    if local is not None and local.get("backward") is not None:
        return _from_local(cap, c, local, f"forward: {f_cell} ({f_how})", extra)
    if g_cell is None and judged["lower"]:
        return _row(cap, c, OTHER, f"forward applied ({f_cell}); {judged['lower']}", form=LOWER, **extra)
    if g_cell is None:
        return _row(cap, c, NOT_BOUND if "nearest" in g_how else DIFFERENT,
                    f"forward applied ({f_cell}); the gradients match no reference: {g_how}", **extra)
    if isinstance(g_cell, tuple) and g_cell[0] == cap:
        return _row(cap, c, OTHER, f"forward applied ({f_cell}); its gradient is {g_cell[1]} ({g_how})",
                    form=g_cell[1], **extra)
    said = "" if g_cell == "exact" else f"; the gradients are explained by the {g_cell[0]} cap's {g_cell[1]}"
    return _row(cap, c, APPLIED, f"forward {f_cell} ({f_how}), gradients {g_how}{said}", **extra)


def _from_local(cap, c, local, said, extra) -> dict:
    backward = local["backward"]
    if local.get("local_upstream"):
        said += "; " + local["local_upstream"]
    if backward == "exact":
        return _row(cap, c, APPLIED, f"{said}; dL/da is dL/dz·sech²(a/c) of the route's own a", **extra)
    return _row(cap, c, OTHER, f"{said}; dL/da is {backward}", form=backward, **extra)


def could_not_run(reference, reason: str, verdict_: str = NOT_RUN) -> list[dict]:
    return [_row(cap, reference.caps[cap], verdict_ if reference.caps[cap] is not None else NOT_SET, reason)
            for cap in ("attention", "final")]
