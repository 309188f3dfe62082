"""The experiment's results: the JSON (every number), the Markdown (the design, then the results) and the
report the command line prints. Nothing here depends on the time a run took, so a rerun on the same
machine writes the same bytes.
"""

from __future__ import annotations

import platform
from dataclasses import asdict

from softcapgrad.core.report import Report, Table
from softcapgrad.experiments import stats
from softcapgrad.experiments.design import Design, lines
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


def results(measured: Measured) -> dict:
    d = measured.design
    arms: dict = {}
    for arm in d.arms:
        arms[arm] = {}
        for depth in d.depths:
            runs = sorted((r for r in measured.runs if r.arm == arm and r.depth == depth), key=lambda r: r.seed)
            s = stats.summary([r.steps for r in runs], d.phase2_steps)
            arms[arm][_depth(depth)] = {
                "steps": s.steps, "median": s.median, "low": s.low, "high": s.high, "recovered": s.recovered,
                "censored": s.censored,
                "at_shift": {site: _fractions(runs, site, True) for site in SITES},
                "after_shift": {site: _fractions(runs, site, False) for site in SITES},
                "hook_zero_grad_fraction": [r.hook_zero_grad_fraction for r in runs],
                "hook_dead_fraction": [r.hook_dead_fraction for r in runs],
                "hook_largest": [r.hook_largest for r in runs],
                "windows": {str(r.seed): [asdict(w) for w in r.windows] for r in runs},
                "curves": {str(r.seed): {"shifted_loss": r.shifted_loss, "other_loss": r.other_loss,
                                         "new_probability": r.new_probability} for r in runs},
            }
    by_depth = []
    prediction = single_logit(measured)
    for depth in d.depths:
        key = _depth(depth)
        if "bf16-eager" in arms and "bf16-patch" in arms:
            r = stats.ratio(stats.summary(arms["bf16-eager"][key]["steps"], d.phase2_steps).counted,
                            stats.summary(arms["bf16-patch"][key]["steps"], d.phase2_steps).counted,
                            d.bootstrap, d.confidence, d.bootstrap_seed)
            row = asdict(r)
        else:
            row = {"ratio": None, "low": None, "high": None, "verdict": "bf16-eager or bf16-patch not run"}
        row["excludes_1"] = row["low"] is not None and (row["low"] > 1.0 or row["high"] < 1.0)
        by_depth.append({"depth": depth, **row, "single_logit": prediction[key]})
    out = {
        "command": "experiment", "quick": d.quick, "model": measured.model,
        "design": {**asdict(d), "text": lines(d)}, "provenance": provenance(d),
        "horizon": measured.horizon,
        "first_zero": {a: {"value": v, "source": why} for a, (v, why) in measured.first_zero.items()},
        "shifts": [asdict(s) for s in measured.shifts],
        "arms": arms, "verdict": {"by_depth": by_depth},
    }
    out["verdict"]["answer"] = list(answer(out))
    return out


def _steps_text(entry: dict) -> str:
    ge = "≥" if entry["censored"] else ""
    return f"{ge}{entry['median']:g} (range {entry['low']}–{entry['high']})"


def answer(res: dict) -> tuple[str, ...]:
    d = res["design"]
    depths = res["verdict"]["by_depth"]
    deepest = depths[-1]
    key = _depth(deepest["depth"])
    arms = res["arms"]
    if deepest["ratio"] is None:
        return (f"No bf16-eager ÷ bf16-patch ratio: {deepest['verdict']}.",)
    eager, patched = arms["bf16-eager"][key], arms["bf16-patch"][key]
    first = (f"At depth {deepest['depth']:g}× the bf16 horizon (largest pre-cap logit {deepest['single_logit']['a0']:g} "
             f"at c = {d['final_cap']:g}), bf16 eager took a median of {_steps_text(eager)} steps over "
             f"{len(d['seeds'])} seeds to learn the shifted targets and the patched model {_steps_text(patched)}: "
             f"ratio {deepest['ratio']:g}, {d['confidence']:.0%} bootstrap interval [{deepest['low']:g}, "
             f"{deepest['high']:g}], which {'excludes' if deepest['excludes_1'] else 'includes'} 1 "
             f"({deepest['verdict']}).")
    per = "; ".join(f"{r['depth']:g}×: {r['ratio']:g} [{r['low']:g}, {r['high']:g}]" for r in depths if r["ratio"])
    costly = [r["depth"] for r in depths if r["verdict"] == "bf16 eager slower"]
    second = (f"Ratio by depth: {per}; " + (f"the dead zone costs steps from depth {min(costly):g}× on."
                                           if costly else "no depth shows a measurable cost."))
    others = [f"{a} {_steps_text(arms[a][key])}" for a in ("bf16-compile", "fp32-eager", "no-cap") if a in arms]
    third = f"At {key.replace('x', '×')}: " + ", ".join(others) + "." if others else ""
    return tuple(x for x in (first, second, third) if x)


def rows(res: dict) -> list[dict]:
    out = []
    for arm in res["design"]["arms"]:
        for depth in res["design"]["depths"]:
            e = res["arms"][arm][_depth(depth)]
            final = e["at_shift"]["final logits"]
            zero = [x for x in e["hook_zero_grad_fraction"] if x is not None]
            dead = [x for x in e["hook_dead_fraction"] if x is not None]
            out.append({
                "arm": arm, "depth": f"{depth:g}×", "median_steps": ("≥" if e["censored"] else "") + f"{e['median']:g}",
                "spread": f"{e['low']}–{e['high']}", "recovered": f"{e['recovered']}/{len(e['steps'])}",
                "monitor_dead": final["dead_fraction"], "monitor_zero_grad": final["zero_grad_fraction"],
                "hook_zero_grad": sum(zero) / len(zero) if zero else None,
                "hook_past_own_first_zero": sum(dead) / len(dead) if dead else None,
                "attention_dead": e["at_shift"]["attention"]["dead_fraction"],
            })
    return out


def verdict_rows(res: dict) -> list[dict]:
    return [{"depth": f"{r['depth']:g}×", "a0": r["single_logit"]["a0"], "ratio": r["ratio"], "low": r["low"],
             "high": r["high"], "verdict": r["verdict"],
             "single_logit_bf16": r["single_logit"]["bf16"]["status"],
             "single_logit_float64_ratio": r["single_logit"]["float64"]["ratio_to_uncapped"]}
            for r in res["verdict"]["by_depth"]]


def design_markdown(d: Design) -> str:
    head = ["# Does the bf16 dead zone change training? (`softcapgrad experiment`)", "",
            "## Design, fixed before the results", "",
            "Written and committed before the default run; `make experiment` regenerates this file with the results "
            "below it. One `--quick` run (2 seeds) was looked at before it was committed, to check that the dead "
            "zone occurs and that the arms really differ (their curves do); no number of the design changed after it.",
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
            "", "### The bf16-eager ÷ patched ratio by depth, beside the single-logit model", "",
            *_md_table(verdict_rows(res)), "", "### Steps to recover and the monitor at the shift (final logits)", "",
            *_md_table(rows(res)), "",
            "Shares of the final logits at the shift, averaged over seeds. monitor dead: past the path's first "
            "zero-gradient input as DeadZoneMonitor counts it (for an eager tanh: stored as exactly ±1, which it "
            "reads as dead whatever the backward; the patched arm's backward does not die there); monitor zero grad: "
            "its exactly-0 gradients from a non-zero upstream (seen only where the backward is aten's tanh_backward; "
            "— otherwise). hook zero grad: the same count by autograd hooks on the cap's input and output (eager "
            "arms); hook past own first zero: the share at or past the arm's own first zero-gradient input from the "
            "stack table. Every figure, per seed and window, is in experiment.json.", ""]
    return design_markdown(design) + "\n".join(body)


def experiment_report(res: dict, note: tuple[str, ...] = ()) -> Report:
    return Report(
        command="experiment",
        params={"quick": res["quick"], "seeds": res["design"]["seeds"], "arms": res["design"]["arms"],
                "depths": res["design"]["depths"], "model": res["model"]},
        tables=(Table("rows", "steps to recover from the shift, and the dead zone at it (final logits)", rows(res),
                      ("arm", "depth", "median_steps", "spread", "recovered", "monitor_zero_grad", "hook_zero_grad"),
                      wide=("monitor_dead", "hook_past_own_first_zero", "attention_dead")),
                Table("verdict", "bf16 eager ÷ patched, median steps, by depth", verdict_rows(res),
                      ("depth", "ratio", "low", "high", "verdict"), wide=("a0", "single_logit_bf16",
                                                                          "single_logit_float64_ratio"))),
        notes=note,
        answer=tuple(res["verdict"]["answer"]),
    )
