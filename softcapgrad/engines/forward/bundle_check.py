"""The comparison half of a reproduction bundle's script (parity --repro), standalone: the standard library and numpy.

parity --repro writes this file's text, after the few lines that run the engine (``engine_logits``), into each
bundle's reproduce.py. It reads bundle.json (written by parity: the caps, the recorded verdicts, the tolerances and
which reference file each cap is judged against), runs the engine on the model folders beside it, and for each cap
prints the reference's and the engine's log-probabilities at the worst position, with the verdict. The reference's
log-probabilities are data in reference/*.npy; nothing here recomputes them.

Each cap is judged as parity judges it: the engine's log-probabilities against the expected form and against the
form without the cap, their largest difference over every position and token (each position's top K tokens where
the row was judged so), within the row's tolerance; "not bound" where the two forms lie within ten tolerances of
each other. A verdict that rests on a further check (an engine that reads its caps from its own config, a named
alternative form) is printed with what this script does and does not repeat.
"""

import json
import sys
from pathlib import Path

import numpy as np

# fp32's smallest normal number: a probability below it holds fewer than 24 bits (none below 2^-149, where it is
# 0), so an engine's log-probability there is not its softmax's to fp32 precision, and such entries are not judged
LN_TINY = float(np.log(2.0 ** -126))
RATIO = 10.0


def log_probs(z):
    z = np.asarray(z, dtype=np.float64)
    top = z.max(axis=-1, keepdims=True)
    return z - top - np.log(np.exp(z - top).sum(axis=-1, keepdims=True))


def top_mask(lp, k):
    if not k:
        return None
    mask = np.zeros(lp.shape, dtype=bool)
    np.put_along_axis(mask, np.argsort(-lp, axis=-1, kind="stable")[:, :min(k, lp.shape[-1])], True, axis=-1)
    return mask


def unrepresentable(lp, other, mask=None):
    """The entries left out of a comparison: both sides below fp32's smallest normal (within ``mask``)."""
    both = (np.asarray(lp) <= LN_TINY) & (np.asarray(other) <= LN_TINY)
    return int((both if mask is None else both & mask).sum())


def worst(lp, other, mask):
    """The largest |Δ log-prob| and where (position, token id), over the entries where either side is at least
    fp32's smallest normal."""
    with np.errstate(invalid="ignore"):
        diff = np.abs(lp - other)
    diff = np.where((lp <= LN_TINY) & (other <= LN_TINY), 0.0, diff)
    if mask is not None:
        diff = np.where(mask, diff, 0.0)
    t, v = np.unravel_index(int(np.argmax(diff)), diff.shape)
    return float(diff[t, v]), int(t), int(v)


def judge(lp, expected, without, tolerance, k=0, ratio=False):
    """The verdict of one cap from the engine's log-probabilities and the two forms, with the numbers behind it."""
    mask = top_mask(lp, k)
    e_on, t, v = worst(lp, expected, mask)
    e_off = worst(lp, without, mask)[0]
    separation = worst(expected, without, mask)[0]
    if ratio:  # a low precision whose bound spans the cap's effect: which form is ten times nearer
        verdict = ("applied" if e_on * RATIO < e_off else "ignored" if e_off * RATIO < e_on else "not bound")
    elif separation <= 10 * tolerance:
        verdict = "not bound"
    else:
        verdict = "applied" if e_on <= tolerance else "ignored" if e_off <= tolerance else "different"
    return {"verdict": verdict, "position": t, "token_id": v, "reference": float(expected[t, v]),
            "engine": float(lp[t, v]), "without_cap": float(without[t, v]), "error": e_on, "error_without": e_off,
            "tolerance": tolerance, "separation": separation}


def forms(spec, here, outputs):
    """The expected form and the form without the cap, as log-probabilities: a reference file, or the cap of the
    engine's own logits without it (c·tanh(a/c), the definition of the cap)."""
    def one(name):
        if name == "own cap":
            a = outputs["final-off"]
            return log_probs(spec["c"] * np.tanh(a / spec["c"]))
        if name == "own":
            return log_probs(outputs["final-off"])
        return np.load(here / name, allow_pickle=False)
    return one(spec["expected"]), one(spec["without"])


def check(spec, here, outputs):
    run = outputs.get(spec["run"])
    if isinstance(run, str):
        return {"verdict": "could not run", "why": run}
    bad = int(np.isnan(run).sum() + np.isposinf(run).sum())  # -inf is a log-probability's zero: judged below
    if bad:
        return {"verdict": "not finite", "why": f"{bad} non-finite values"}
    lp = run if spec.get("output") == "logprobs" else log_probs(run)
    needed = [n for n in (spec["expected"], spec["without"]) if n in ("own cap", "own")]
    if needed and isinstance(outputs.get("final-off"), str):
        return {"verdict": "could not run", "why": "the folder without its final cap: " + outputs["final-off"]}
    expected, without = forms(spec, here, outputs)
    got = judge(lp, expected, without, spec["tolerance"], spec.get("top_k", 0), spec.get("ratio", False))
    if spec.get("kind") == "unused":  # a cap transformers never applies: does the engine apply it?
        got.update(unused(lp, outputs.get("uncapped"), got, spec["tolerance"], spec.get("top_k", 0)))
    return got


def unused(lp, uncapped, got, tolerance, k):
    """The engine applies the cap where removing it from the folder moves its output, or where its output matches
    transformers with the cap forced on rather than as shipped (the expected form here)."""
    moved = None
    if isinstance(uncapped, np.ndarray) and np.isfinite(uncapped).all():
        moved = worst(lp, log_probs(uncapped), top_mask(lp, k))[0]
    if moved is not None and moved > tolerance:
        verdict = "applies the cap"
    elif got["error"] <= tolerance:
        verdict = "agrees with transformers"
    elif got["error_without"] <= tolerance:
        verdict = "applies the cap"
    else:
        verdict = "different"
    return {"verdict": verdict, "moved": moved}


def spec_of(bundle, cap):
    return next(s for s in bundle["caps"] if s["cap"] == cap)


def main(engine_logits, argv=None):
    argv = sys.argv[1:] if argv is None else argv
    here = Path(__file__).resolve().parent
    bundle = json.loads((here / "bundle.json").read_text(encoding="utf-8"))
    ids = np.load(here / "ids.npy", allow_pickle=False).astype(np.int64).reshape(-1)
    outputs = {}
    for folder in bundle["runs"]:
        try:
            outputs[folder] = np.asarray(engine_logits(here / folder, ids), dtype=np.float64)
        except Exception as err:  # noqa: BLE001 -- the engine's failure is what this reproduces
            outputs[folder] = " ".join(f"{type(err).__name__}: {err}".split())[:400]
    results = []
    for spec in bundle["caps"]:
        got = {"cap": spec["cap"], "c": spec["c"], "recorded": spec["recorded"], **check(spec, here, outputs)}
        got["reproduced"] = got["verdict"] == spec["expect"] if spec.get("expect") else None
        results.append(got)
    if "--json" in argv:
        print(json.dumps({"engine": bundle["engine"], "route": bundle["route"], "caps": results}, indent=1))
    else:
        for r in results:
            said = {True: "reproduced", False: "NOT reproduced", None: "see REPORT.md"}[r["reproduced"]]
            print(f"{r['cap']} cap (c = {r['c']}): {r['verdict']} (parity recorded {r['recorded']}: {said})")
            if "position" in r:
                on, off = spec_of(bundle, r["cap"]).get("labels") or ("the reference", "the form without the cap")
                print(f"  worst at position {r['position']}, token id {r['token_id']}: {on} {r['reference']:.6g}, "
                      f"the engine {r['engine']:.6g}, {off} {r['without_cap']:.6g}; largest differences "
                      f"{r['error']:.3g} and {r['error_without']:.3g}, tolerance {r['tolerance']:.3g}")
                if r.get("moved") is not None:
                    print(f"  removing the cap from the folder moves the engine's log-probs by {r['moved']:.3g}")
            else:
                print(f"  {r['why']}")
    return 0 if all(r["reproduced"] is not False for r in results) else 1
