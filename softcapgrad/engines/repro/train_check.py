"""The comparison half of a training bundle's script (train-parity --repro), standalone: the standard library and numpy.

train-parity --repro writes this file's text, after the few lines that take the route's training step
(``run_step``: the arrays the step wrote, as a dict), into each bundle's reproduce.py. It reads bundle.json (the caps,
the verdicts train-parity recorded, the tolerances, and which reference file is which model), takes one step on the
folder ``capped`` beside it, and places the step among the references as engines/training/verdict.py does: the
returned logits' log-probabilities (largest |Δ|) and the loss against each reference model, within the forward
tolerance and outside every other's, or ten times nearer one than any other; then every parameter's gradient,
relative to the reference's largest component, against the gradients of the model the forward placed it in (and,
where that is the capped model, each cap computed forward exactly with another backward). The references are
float64 data in reference/*.npz; nothing here recomputes them.

What this script does not repeat: the final cap's own arithmetic on the route's own input a, and the route's dL/da
carried back through the float64 model (train-parity does both where a route exposes a); a verdict that rests on
them is printed with "see REPORT.md", not as reproduced.
"""

import json
import sys
from pathlib import Path

import numpy as np

RATIO = 10.0
APPLIED = "applied forward and backward"
OTHER = "applied forward, another gradient"
IGNORED = "ignored"
ELSEWHERE = "applied to another tensor"


def log_probs(z):
    z = np.asarray(z, dtype=np.float64)
    top = z.max(axis=-1, keepdims=True)
    return z - top - np.log(np.exp(z - top).sum(axis=-1, keepdims=True))


def next_token(logits, ids):
    """log p(x_{t+1}) at each position but the last: what a fused head returns in place of logits."""
    return log_probs(logits)[np.arange(ids.size - 1), ids[1:]]


def arrays(path):
    """A step's arrays (the route's .npz, or a reference's) by kind: loss, logits or token_log_probs, logits_grad,
    the gradients grad/<parameter>, a LoRA step's lora_A/<weight> and lora_scale, and frozen/<parameter>."""
    with np.load(path, allow_pickle=False) as data:
        values = {k: np.asarray(data[k], dtype=np.float64) for k in data.files}
    return step_of(values)


def step_of(values):
    pick = lambda prefix: {k[len(prefix):]: v for k, v in values.items() if k.startswith(prefix)}  # noqa: E731
    return {"loss": float(values["loss"]), "logits": values.get("logits"), "logits_grad": values.get("logits_grad"),
            "token_log_probs": values.get("token_log_probs"), "grads": pick("grad/"), "lora": pick("lora_A/"),
            "lora_scale": float(values["lora_scale"]) if "lora_scale" in values else None,
            "frozen": set(pick("frozen/"))}


def logit_error(step, other, ids):
    if step["logits"] is None:
        return float(np.abs(step["token_log_probs"] - next_token(other["logits"], ids)).max())
    return float(np.abs(log_probs(step["logits"]) - log_probs(other["logits"])).max())


def grad_error(mine, other):
    """The largest |Δ gradient| over every parameter, relative to ``other``'s largest component, and where.

    engines/training/verdict.py's ``grad_error``, carried here because a bundle runs on its own
    (tests/test_train_repro.py holds the two equal)."""
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


def nearest(errors, tol):
    """The one reference within ``tol`` (none other), or ten times nearer than any other; else None, and why."""
    ranked = sorted(errors.items(), key=lambda kv: kv[1])
    best, e = ranked[0]
    if len(ranked) == 1:
        return (best, "within tolerance") if e <= tol else (None, f"nearest {best} ({e:.3g}), no other reference")
    second = ranked[1][1]
    if e <= tol < second:
        return best, "within tolerance"
    if e * RATIO < second:
        return best, f"{RATIO:g} times nearer than any other reference"
    return None, f"nearest {best} ({e:.3g}), next {ranked[1][0]} ({second:.3g})"


def loss_scale(step, cell, tol):
    """s where the step's dL/dz and loss are s times the cell's (s not 1): a loss normalised by another count."""
    if cell is None or step["logits_grad"] is None or cell["logits_grad"] is None \
            or step["logits_grad"].shape != cell["logits_grad"].shape:
        return None
    mine, other = step["logits_grad"], cell["logits_grad"]
    norm = float(np.vdot(other, other))
    s = float(np.vdot(mine, other)) / norm if norm else 0.0
    if not s or abs(s - 1.0) <= tol["grad"] or grad_error({"z": mine / s}, {"z": other})[0] > tol["grad"]:
        return None
    return s if abs(step["loss"] - s * cell["loss"]) <= tol["forward"] else None


def gradients(step, base, bundle, refs, here, scale):
    """The errors of the step's gradients against the base model's and, on the capped model, each named backward."""
    files = {"exact": refs[base]} if refs[base]["grads"] else {}
    if base == "capped":
        files.update({(f["cap"], f["form"]): arrays(here / f["file"]) for f in bundle["forms"]})
    mine = {k: v / scale for k, v in step["grads"].items()} if scale else step["grads"]
    out = {}
    for key, other in files.items():
        theirs = {n: g for n, g in other["grads"].items() if n not in step["frozen"]}
        if step["lora"]:  # a LoRA step's gradients are dL/dB = scale·(dL/dW)·Aᵀ of each adapted weight
            theirs = {n: step["lora_scale"] * theirs[n] @ a.T for n, a in step["lora"].items() if n in theirs}
        out[key] = grad_error(mine, theirs)
    return out


def place(step, bundle, here, ids):
    """Where the step lies: the forward's and the loss's reference, the gradients', and the numbers behind them."""
    tol = bundle["tolerance"]
    refs = {c["name"]: arrays(here / c["file"]) for c in bundle["cells"]}
    forward = {n: logit_error(step, r, ids) for n, r in refs.items()}
    loss = {n: abs(step["loss"] - r["loss"]) for n, r in refs.items()}
    f_cell, f_how = nearest(forward, tol["forward"])
    l_cell = nearest(loss, tol["forward"])[0]
    scale = loss_scale(step, refs.get(f_cell), tol) if f_cell is not None and l_cell != f_cell else None
    l_cell = f_cell if scale is not None else l_cell
    kinds = {c["name"]: c["kind"] for c in bundle["cells"]}
    out = {"forward_cell": f_cell, "forward_how": f_how, "forward_error": forward.get(f_cell, min(forward.values())),
           "forward_tolerance": tol["forward"], "loss_cell": l_cell, "grad_scale": scale, "grad_cell": None,
           "grad_error": None, "grad_where": None, "grad_tolerance": tol["grad"], "grad_how": ""}
    if f_cell is not None and "whole" not in (kinds.get(f_cell), kinds.get(l_cell)):
        out["grad_base"] = l_cell if l_cell not in (None, f_cell) else f_cell
        errors = gradients(step, out["grad_base"], bundle, refs, here, scale)
        if errors:
            g_cell, out["grad_how"] = nearest({k: e for k, (e, _) in errors.items()}, tol["grad"])
            shown = errors.get(g_cell if g_cell is not None else "exact") or min(errors.values())
            out.update(grad_cell=g_cell, grad_error=shown[0], grad_where=shown[1])
        else:
            out["grad_how"] = "not compared: the bundle holds no gradients of that model"
    return out


def verdict(cap, placed, bundle):
    """The cap's verdict from where the step lies, as engines/training/verdict.py gives it from the same places."""
    cells = {c["name"]: c for c in bundle["cells"]}
    f, l_cell, g = placed["forward_cell"], placed["loss_cell"], placed["grad_cell"]
    kind = cells[f]["kind"] if f is not None else None
    if "whole" in (kind, cells.get(l_cell, {}).get("kind")) or (kind == "window" and cap == "attention"):
        return "different"
    if kind == "elsewhere" and cap == "final":
        return ELSEWHERE
    if f is None:
        return "different" if placed["forward_error"] > RATIO * placed["forward_tolerance"] else "not bound"
    if cap not in cells[f]["on"]:
        return ELSEWHERE if l_cell is not None and cap in cells[l_cell]["on"] else IGNORED
    if placed["grad_how"].startswith("not compared"):
        return "applied forward (gradients not compared)"
    if g is None:
        return "not bound" if placed["grad_how"].startswith("nearest") else "different"
    return OTHER if isinstance(g, tuple) and g[0] == cap else APPLIED


def judge(step, bundle, here, ids):
    """Each cap's result: its verdict, the recorded one, and whether this run reproduces it."""
    finite = all(np.all(np.isfinite(v)) for v in (step["logits"], step["token_log_probs"], step["loss"],
                                                   *step["grads"].values()) if v is not None)
    placed = place(step, bundle, here, ids) if finite else {}
    results = []
    for spec in bundle["caps"]:
        got = verdict(spec["cap"], placed, bundle) if finite else "not finite"
        results.append({"cap": spec["cap"], "c": spec["c"], "recorded": spec["recorded"], "verdict": got,
                        "reproduced": got == spec["expect"] if spec["expect"] else None, **placed})
    return results


def main(run_step, argv=None):
    argv = sys.argv[1:] if argv is None else argv
    here = Path(__file__).resolve().parent
    bundle = json.loads((here / "bundle.json").read_text(encoding="utf-8"))
    ids = np.load(here / "ids.npy", allow_pickle=False).astype(np.int64).reshape(-1)
    try:
        results = judge(step_of(run_step(here / "capped", ids)), bundle, here, ids)
    except Exception as err:  # noqa: BLE001 -- the library's failure is what this reproduces
        why = " ".join(f"{type(err).__name__}: {err}".split())[:400]
        results = [{"cap": s["cap"], "c": s["c"], "recorded": s["recorded"], "verdict": "could not run", "why": why,
                    "reproduced": False if s["expect"] else None} for s in bundle["caps"]]
    if "--json" in argv:
        shown = [{k: list(v) if isinstance(v, tuple) else v for k, v in r.items()} for r in results]
        print(json.dumps({"engine": bundle["engine"], "route": bundle["route"], "caps": shown}, indent=1))
    for r in results if "--json" not in argv else ():
        said = {True: "reproduced", False: "NOT reproduced", None: "see REPORT.md"}[r["reproduced"]]
        print(f"{r['cap']} cap (c = {r['c']}): {r['verdict']} (train-parity recorded {r['recorded']}: {said})")
        if "why" in r:
            print(f"  {r['why']}")
        elif "forward_cell" in r:
            print(f"  forward: {r['forward_cell'] or 'no reference'} ({r['forward_how']}; largest |Δ log-prob| "
                  f"{r['forward_error']:.3g}, tolerance {r['forward_tolerance']:.3g}); loss: {r['loss_cell'] or 'no reference'}")
            grad = (f"{r['grad_base']}, exact backward" if r["grad_cell"] == "exact" else
                    f"capped, the {r['grad_cell'][0]} cap's {r['grad_cell'][1]}" if r["grad_cell"] else None)
            print(f"  gradients: {grad or 'no reference'} ({r['grad_how']}" + (
                f"; largest relative |Δ| {r['grad_error']:.3g} at {r['grad_where']}, tolerance "
                f"{r['grad_tolerance']:.3g}" if r["grad_error"] is not None else "") + ")")
            if r["grad_scale"] is not None:
                print(f"  the loss and every gradient are {r['grad_scale']:.6g} times the reference's (a loss "
                      "normalised by another count), compared once divided by it")
    return 0 if all(r["reproduced"] is not False for r in results) else 1
