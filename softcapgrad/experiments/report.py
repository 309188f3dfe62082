"""The experiment's results: the JSON (every number), the Markdown (the design, then the results) and the
report the command line prints. Nothing here depends on the time a run took, so a rerun on the same
machine writes the same bytes.
"""

from __future__ import annotations

import platform
from dataclasses import asdict

from softcapgrad.core.report import Report, Table
from softcapgrad.experiments import stats
from softcapgrad.experiments.design import CORE, Design, lines
from softcapgrad.experiments.loop import SITES
from softcapgrad.experiments.runner import Measured


def provenance(design: Design) -> dict:
    import numpy
    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__, "numpy": numpy.__version__,
            "python": platform.python_version(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "threads": design.threads, "seeds": list(design.seeds)}


def _depth(d: float) -> str:
    return f"{d:g}x"


def _fractions(runs, site: str, at_shift: bool) -> dict:
    """Monitor fractions of one site over runs: at the shift (step 0) or after it, weighted by values."""
    rows = [w for r in runs for w in r.windows if w.site == site and (w.start == 0) == at_shift]
    values = sum(w.values for w in rows)
    dead = [w for w in rows if w.dead_fraction is not None]
    zero = [w for w in rows if w.zero_grad_fraction is not None]
    return {
        "values": values,
        "dead_fraction": sum(w.dead_fraction * w.values for w in dead) / sum(w.values for w in dead) if dead else None,
        "zero_grad_fraction": sum(w.zero_grad_fraction * w.values for w in zero) / sum(w.values for w in zero)
        if zero else None,
        "largest": max((w.largest for w in rows), default=None),
    }


def single_logit(measured: Measured) -> dict:
    """The document's single-logit model (``dynamics``: one logit, plain gradient descent) at each depth's a0."""
    from softcapgrad.laws import formats
    from softcapgrad.laws.descent import Setting
    from softcapgrad.laws.dynamics import sweep

    d = measured.design
    a0 = [depth * measured.horizon * d.depth_margin for depth in d.depths]
    s = Setting(cap=d.final_cap)
    low = sweep(a0, s, formats.resolve("bfloat16"))
    exact = sweep(a0, s)
    return {_depth(depth): {"a0": round(x, 4), "bf16": {"status": lo["status"], "steps": lo["steps_capped"]},
                            "float64": {"status": ex["status"], "steps": ex["steps_capped"],
                                        "ratio_to_uncapped": None if ex["ratio"] is None else round(ex["ratio"], 4)}}
            for depth, x, lo, ex in zip(d.depths, a0, low, exact)}


def _entry(runs, budget: int) -> dict:
    s = stats.summary([r.steps for r in runs], budget)
    return {
        "steps": s.steps, "median": s.median, "low": s.low, "high": s.high, "recovered": s.recovered,
        "censored": s.censored,
        "at_shift": {site: _fractions(runs, site, True) for site in SITES},
        "after_shift": {site: _fractions(runs, site, False) for site in SITES},
        "hook_zero_grad_fraction": [r.hook_zero_grad_fraction for r in runs],
        "hook_dead_fraction": [r.hook_dead_fraction for r in runs],
        "hook_largest": [r.hook_largest for r in runs],
        "mass_lost_at_shift": [r.mass_lost_at_shift for r in runs],
        "mass_lost_after_shift": _lost_after(runs),
        "windows": {str(r.seed): [asdict(w) for w in r.windows] for r in runs},
        "curves": {str(r.seed): {"shifted_loss": r.shifted_loss, "other_loss": r.other_loss,
                                 "new_probability": r.new_probability} for r in runs},
    }


def _lost_after(runs) -> float | None:
    """The share of exact L1 mass lost over every watched window after the shift, pooled (mean of window shares)."""
    shares = [w.mass_lost for r in runs for w in r.windows if w.start > 0 and w.mass_lost is not None]
    return sum(shares) / len(shares) if shares else None


def _grouped(runs, arms, depths, shifts, budget: int) -> dict:
    out: dict = {}
    for arm in arms:
        for shift in shifts:
            for depth in depths:
                mine = sorted((r for r in runs if r.arm == arm and r.depth == depth and r.shift == shift),
                              key=lambda r: r.seed)
                if mine:
                    out.setdefault(arm, {}).setdefault(shift, {})[_depth(depth)] = _entry(mine, budget)
    return out


RATIOS = (("total", "bf16-eager", "bf16-patch"), ("dead_zone", "bf16-patch-deadzone", "bf16-patch"),
          ("rounding", "bf16-eager", "bf16-patch-deadzone"))


def _pairs(arms: dict, shift: str, key: str, d: Design, budget: int) -> dict:
    row: dict = {}
    for name, top, bottom in RATIOS:
        if top in arms and bottom in arms and key in arms[top].get(shift, {}) and key in arms[bottom].get(shift, {}):
            a = stats.summary(arms[top][shift][key]["steps"], budget).counted
            b = stats.summary(arms[bottom][shift][key]["steps"], budget).counted
            row[name] = asdict(stats.paired(a, b, d.bootstrap, d.confidence, d.bootstrap_seed))
            if name == "total":
                row["medians"] = asdict(stats.ratio(a, b, d.bootstrap, d.confidence, d.bootstrap_seed))
        else:
            row[name] = None
    return row


def _fidelity_summary(fidelity, shift: str, depth: float) -> dict:
    out = {}
    for arm in ("bf16-eager", "bf16-patch-deadzone"):
        mine = [f for f in fidelity if f.shift == shift and f.depth == depth and f.arm == arm]
        out[arm] = None if not mine else {
            "relative_error": [round(f.relative_error, 6) for f in mine],
            "relative_error_mean": round(sum(f.relative_error for f in mine) / len(mine), 6),
            "zero_not_patch": [f.zero_not_patch for f in mine],
            "zero_not_patch_mean": sum(f.zero_not_patch for f in mine) / len(mine)}
    return out


def _mean(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _sgd(measured: Measured) -> dict | None:
    d = measured.design
    if measured.sgd_runs is None:
        return None
    arms = _grouped(measured.sgd_runs, [a for a in d.arms if a in CORE], d.sgd_depths, ("rotation",), d.sgd_steps)
    paired = [{"depth": depth, **_pairs(arms, "rotation", _depth(depth), d, d.sgd_steps)} for depth in d.sgd_depths]
    low = next((p for p in paired if p["depth"] == min(d.sgd_depths)), None)
    rounding = low and low["rounding"]
    chaotic = bool(rounding and rounding["low"] is not None and (rounding["low"] < 0.95 or rounding["high"] > 1.05))
    return {"lr": measured.sgd_lr, "pilot": measured.sgd_pilot,
            "pilot_stable": any(p["stable"] for p in measured.sgd_pilot or ()), "chaotic": chaotic,
            "steps": {a: {s: {k: v["steps"] for k, v in e.items()} for s, e in by.items()} for a, by in arms.items()},
            "paired": paired}


def results(measured: Measured) -> dict:
    d = measured.design
    budget = d.phase2_steps
    arms = _grouped(measured.runs, d.arms, d.depths, d.shifts, budget)
    prediction = single_logit(measured)
    paired = []
    for shift in d.shifts:
        for depth in d.depths:
            key = _depth(depth)
            if not any(key in arms.get(a, {}).get(shift, {}) for a in d.arms):
                continue  # this shift does not run at this depth
            eager = arms.get("bf16-eager", {}).get(shift, {}).get(key)
            found = [s for s in measured.shifts if s.depth == depth]
            paired.append({
                "shift": shift, "depth": depth, **_pairs(arms, shift, key, d, budget),
                "mass_lost_at_shift": None if eager is None else _mean(eager["mass_lost_at_shift"]),
                "mass_lost_after_shift": None if eager is None else eager["mass_lost_after_shift"],
                "fidelity": _fidelity_summary(measured.fidelity, shift, depth),
                "band_found": None if shift != "band" else [s.band_found for s in found],
                "single_logit": prediction[key]})
    out = {
        "command": "experiment", "quick": d.quick, "model": measured.model,
        "design": {**asdict(d), "text": lines(d)}, "provenance": provenance(d),
        "horizon": measured.horizon,
        "first_zero": {a: {"value": v, "source": why} for a, (v, why) in measured.first_zero.items()},
        "shifts": [asdict(s) for s in measured.shifts],
        "arms": arms, "paired": paired, "sgd": _sgd(measured),
        "natural": None if measured.natural is None else asdict(measured.natural),
        "verdict": {},
    }
    out["verdict"]["answer"] = list(answer(out))
    return out


def _steps_text(entry: dict) -> str:
    ge = "≥" if entry["censored"] else ""
    return f"{ge}{entry['median']:g} (range {entry['low']}–{entry['high']})"


def _short(p: dict | None) -> str:
    if p is None or p["geomean"] is None:
        return "—"
    return f"{p['geomean']:.4g} [{p['low']:.4g}, {p['high']:.4g}]"


def answer(res: dict) -> tuple[str, ...]:
    d = res["design"]
    rows = [r for r in res["paired"] if r["total"] is not None and r["total"]["geomean"] is not None]
    if not rows:
        return ("No bf16-eager ÷ bf16-patch ratio: bf16-eager or bf16-patch was not run.",)
    deepest = max(r["depth"] for r in rows)
    at = [r for r in rows if r["depth"] == deepest]
    n = len(d["seeds"])
    first = (f"Over {n} seed{'s' if n != 1 else ''}, bf16 eager against the patch (geometric mean of the paired "
             f"per-seed step ratios, {d['confidence']:.0%} bootstrap interval) at depth {deepest:g}× " +
             "; ".join(f"{r['shift']} shift: {r['total']['verdict']}" for r in at) + ".")
    costly = [r for r in rows if r["total"]["low"] > 1.0]
    if costly:
        worst = max(costly, key=lambda r: r["total"]["geomean"])
        second = (f"{len(costly)} of {len(rows)} depth-and-shift cells show a cost, the largest at "
                  f"{worst['depth']:g}× ({worst['shift']}): {worst['total']['verdict']}; ")
    else:
        top = max(rows, key=lambda r: r["total"]["high"])
        second = (f"No depth or shift shows a cost: the largest any interval leaves possible is "
                  f"{100 * (top['total']['high'] - 1):.1f} % ({top['depth']:g}×, {top['shift']}); ")
    dz = [r for r in at if r["dead_zone"] is not None]
    second += "the dead zone alone (control ÷ patched) at " + f"{deepest:g}×: " + (
        "; ".join(f"{r['shift']} {r['dead_zone']['verdict']}" for r in dz) if dz else "not run") + "."
    third = ""
    nat = res.get("natural")
    if nat:
        third = (f"Without the scaled head, {nat['steps']} hot AdamW steps (lr {nat['lr']:g}, no weight decay, "
                 f"{nat['arm']}) took the largest pre-cap logit to {nat['largest']:.4g} against the bf16 horizon "
                 f"{res['horizon']:g} ({100 * nat['dead_share']:.3g} % of the logits past it): the dead zone here is "
                 f"{'reached' if nat['dead_share'] > 0 else 'not reached'} by training alone.")
    return tuple(x for x in (first, second, third) if x)


def rows(res: dict) -> list[dict]:
    out = []
    for arm, by in res["arms"].items():
        for shift, depths in by.items():
            for key, e in depths.items():
                final = e["at_shift"]["final logits"]
                out.append({
                    "arm": arm, "shift": shift, "depth": key.replace("x", "×"),
                    "median_steps": ("≥" if e["censored"] else "") + f"{e['median']:g}",
                    "spread": f"{e['low']}–{e['high']}", "recovered": f"{e['recovered']}/{len(e['steps'])}",
                    "mass_lost": _mean(e["mass_lost_at_shift"]),
                    "monitor_zero_grad": final["zero_grad_fraction"],
                    "hook_zero_grad": _mean(e["hook_zero_grad_fraction"]),
                    "monitor_dead": final["dead_fraction"],
                    "attention_dead": e["at_shift"]["attention"]["dead_fraction"],
                })
    return out


def verdict_rows(res: dict, which: str = "paired") -> list[dict]:
    table = res["paired"] if which == "paired" else (res["sgd"] or {}).get("paired", [])
    out = []
    for r in table:
        t = r["total"]
        eager = (r.get("fidelity") or {}).get("bf16-eager")
        out.append({
            "shift": r.get("shift", "rotation"), "depth": f"{r['depth']:g}×", "total": _short(t),
            "dead_zone": _short(r["dead_zone"]), "rounding": _short(r["rounding"]),
            "slow_tie_fast": "—" if t is None else f"{t['slower']}/{t['tied']}/{t['faster']}",
            "wilcoxon_p": None if t is None else t["wilcoxon_p"],
            "mass_lost": r.get("mass_lost_at_shift"), "mass_lost_after": r.get("mass_lost_after_shift"),
            "grad_error": None if eager is None else eager["relative_error_mean"],
            "zero_not_patch": None if eager is None else eager["zero_not_patch_mean"],
            "medians": _short({"geomean": r["medians"]["ratio"], "low": r["medians"]["low"],
                               "high": r["medians"]["high"]}) if r.get("medians") and r["medians"]["ratio"] else "—",
            "verdict": "—" if t is None else t["verdict"],
        })
    return out


def design_markdown(d: Design) -> str:
    head = ["# Does the bf16 dead zone change training? (`softcapgrad experiment`)", "",
            "## Design, fixed before the results", "",
            "Written and committed before the default run; `make experiment` regenerates this file with the results "
            "below it. One `--quick` run (2 seeds, depths 0.5×, 1.25×, 4×) was looked at before this design was "
            "first committed, to check that every arm, shift and table runs. The design was then cut once, before "
            "any default run ended: a first start got a sixth of a core on the shared machine, so the band shift now "
            "runs only where the negative logits reach the band (2×, 4×) and the compiled arm left the default arms; "
            "no seed count, depth, learning rate or criterion changed.",
            ""]
    return "\n".join(head + lines(d)) + "\n"


def _md_table(table: list[dict]) -> list[str]:
    if not table:
        return []
    keys = list(table[0])
    fmt = lambda v: "—" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)  # noqa: E731
    return ["| " + " | ".join(keys) + " |", "| " + " | ".join("---" for _ in keys) + " |"] + [
        "| " + " | ".join(fmt(r[k]) for k in keys) + " |" for r in table]


def markdown(res: dict, design: Design) -> str:
    p = res["provenance"]
    body = ["", "## Results" + (" (--quick: fewer seeds and steps, not the default run)" if res["quick"] else ""), "",
            *res["verdict"]["answer"], "",
            f"Model: {res['model']}. Provenance: torch {p['torch']}, transformers {p['transformers']}, numpy "
            f"{p['numpy']}, Python {p['python']}, CPU capability {p['cpu_capability']}, {p['threads']} thread(s), "
            f"seeds {', '.join(map(str, p['seeds']))}. bf16 first zero-gradient input at c = "
            f"{design.final_cap:g}: {res['horizon']:g}; each arm's own: " +
            ", ".join(f"{a} {res['first_zero'][a]['value'] or '—'}" for a in res["design"]["arms"]) + ".",
            "", "### The paired ratios by depth and shift (AdamW)", "", *_md_table(verdict_rows(res)), "",
            "total: bf16-eager ÷ bf16-patch; dead_zone: bf16-patch-deadzone ÷ bf16-patch; rounding: bf16-eager ÷ "
            "bf16-patch-deadzone; each the geometric mean of the per-seed step ratios [95 % paired bootstrap "
            "interval]. slow_tie_fast: seeds where eager was slower / tied / faster than the patch. mass_lost: "
            "share of the exact gradient's L1 mass at the final cap's input that eager's backward set to 0, at the "
            "shift (mean over seeds) and over the watched windows after it. grad_error: relative L2 error of eager's "
            "full parameter gradient against the patch's at the shift; zero_not_patch: parameter elements exactly 0 "
            "in eager's gradient and not in the patch's. medians: the ratio of medians (secondary).", ""]
    sgd = res.get("sgd")
    if sgd:
        body += ["### SGD", "",
                 f"Learning rate {sgd['lr']:g} from the pilot (" + ", ".join(
                     f"lr {x['lr']:g}: {'stable' if x['stable'] else 'not stable'}" for x in sgd["pilot"]) + "); " +
                 ("chaotic: rounding alone moves the steps at 0.5× by more than 5 %." if sgd["chaotic"] else
                  "not chaotic by the design's test (rounding alone within 5 % at 0.5×).") +
                 ("" if sgd["pilot_stable"] else " No learning rate of the grid passed the pilot: the smallest ran."),
                 "", *_md_table(verdict_rows(res, "sgd")), ""]
    nat = res.get("natural")
    if nat:
        body += ["### Natural confidence", "",
                 *_md_table([{"step": t["step"], "largest_pre_cap": t["largest"], "past_horizon": t["dead_share"],
                              "loss": t["loss"]} for t in nat["trace"]]), ""]
    body += ["### Steps to recover and the dead zone at the shift (final logits)", "", *_md_table(rows(res)), "",
             "mass lost: as above, the arm's own backward; monitor zero grad: DeadZoneMonitor's exactly-0 gradients "
             "from a non-zero upstream; hook zero grad: the same by autograd hooks; monitor dead: past the path's "
             "first zero-gradient input. Every figure, per seed and window, is in experiment.json.", ""]
    return design_markdown(design) + "\n".join(body)


def experiment_report(res: dict, note: tuple[str, ...] = ()) -> Report:
    return Report(
        command="experiment",
        params={"quick": res["quick"], "seeds": res["design"]["seeds"], "arms": res["design"]["arms"],
                "depths": res["design"]["depths"], "model": res["model"]},
        tables=(Table("verdict", "paired step ratios by depth and shift (AdamW)", verdict_rows(res),
                      ("shift", "depth", "total", "dead_zone", "rounding", "slow_tie_fast", "mass_lost"),
                      wide=("wilcoxon_p", "mass_lost_after", "grad_error", "zero_not_patch", "medians")),
                Table("rows", "steps to recover, and the dead zone at the shift", rows(res),
                      ("arm", "shift", "depth", "median_steps", "spread", "recovered", "mass_lost"),
                      wide=("monitor_zero_grad", "hook_zero_grad", "monitor_dead", "attention_dead"))),
        notes=note,
        answer=tuple(res["verdict"]["answer"]),
    )
