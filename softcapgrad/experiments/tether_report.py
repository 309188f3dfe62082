"""tether-experiment's measurement and results: the JSON (every number), the Markdown (design, then results), the
report the command line prints and the figure. Nothing depends on the time a run took."""

from __future__ import annotations

import math
from dataclasses import asdict

import numpy as np

from softcapgrad.core import progress
from softcapgrad.core.report import Report, Table
from softcapgrad.experiments import stats
from softcapgrad.experiments.tether_design import PAIRS, TINY, Design, all_steps, lines
from softcapgrad.experiments.tether_loop import Run, run_seed


def measure(design: Design) -> list[Run]:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(design.threads)
    try:
        runs: list[Run] = []
        with progress.task("tether-experiment", all_steps(design)) as advance:
            for seed in design.seeds:
                runs += run_seed(design, seed, advance)
        return runs
    finally:
        torch.set_num_threads(threads)


def difference(a: list[float], b: list[float], d: Design) -> dict:
    """Mean of the paired differences a_i − b_i with a percentile bootstrap interval over seeds, and their Wilcoxon
    signed-rank p."""
    x = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    if len(x) == 0:
        return {"mean": None, "low": None, "high": None, "verdict": "no seeds", "wilcoxon_p": None}
    rng = np.random.default_rng(d.bootstrap_seed)
    means = x[rng.integers(0, len(x), size=(d.bootstrap, len(x)))].mean(axis=1)
    tail = (1.0 - d.confidence) / 2.0
    low, high = (float(q) for q in np.quantile(means, [tail, 1.0 - tail]))
    mean = float(x.mean())
    if low > 0:
        word = "higher"
    elif high < 0:
        word = "lower"
    else:
        word = "no difference the interval resolves"
    return {"mean": round(mean, 6), "low": round(low, 6), "high": round(high, 6), "verdict": word,
            "wilcoxon_p": stats.signed_rank_p(x)}


def _counted(runs: list[Run], budget: int) -> list[int]:
    return [budget if r.steps is None else r.steps for r in runs]


def results(runs: list[Run], design: Design) -> dict:
    from softcapgrad.experiments.report import provenance

    by = {a: sorted((r for r in runs if r.arm == a), key=lambda r: r.seed) for a in design.arms}
    closed = {a: [r.closed_at_switch for r in rs] for a, rs in by.items()}
    opening = {a: [r.opening_at_switch for r in rs] for a, rs in by.items()}
    arms = {a: {"closed_share": closed[a], "opening": opening[a], "steps": [r.steps for r in rs],
                "median_steps": stats.summary([r.steps for r in rs], design.steps_b).median,
                "recovered": sum(r.steps is not None for r in rs),
                "health": {str(r.seed): [asdict(h) for h in r.health] for r in rs},
                "loss": {str(r.seed): {"a": r.loss_a, "b": r.loss_b} for r in rs}} for a, rs in by.items()}
    pairs = []
    for a, b in PAIRS:
        if a in by and b in by:
            p = stats.paired(_counted(by[a], design.steps_b), _counted(by[b], design.steps_b), design.bootstrap,
                             design.confidence, design.bootstrap_seed)
            pairs.append({"pair": f"{a} ÷ {b}", "closed": difference(closed[a], closed[b], design),
                          "opening": difference(opening[a], opening[b], design), "steps": asdict(p)})
    res = {"design": asdict(design), "model": TINY, "quick": design.quick, "scenario": design.scenario, "arms": arms, "pairs": pairs,
           "provenance": provenance(design)}
    res["verdict"] = {"answer": answer(res, design)}
    return res


def _share(xs: list[float]) -> str:
    return f"{100 * float(np.mean(xs)):.1f} %" if xs else "—"


def answer(res: dict, d: Design) -> list[str]:
    arms, n = res["arms"], len(d.seeds)
    out = []
    if "plain" in arms:
        plain, c = arms["plain"], next((p["closed"] for p in res["pairs"] if p["pair"] == "plain ÷ tether"), None)
        out.append(f"Over {n} seeds ({d.scenario}), {_share(plain['closed_share'])} of the plain model's gates were "
                   f"closed when the branch became needed (mean opening {np.mean(plain['opening']):.3f})"
                   + (f", {_share(arms['tether']['closed_share'])} under the TetherGate patch (mean opening "
                      f"{np.mean(arms['tether']['opening']):.3f}; paired plain − tether {_pp(c['mean'])} points, "
                      f"{d.confidence:.0%} interval {_pp(c['low'])}–{_pp(c['high'])}, Wilcoxon p {_p(c['wilcoxon_p'])})."
                      if "tether" in arms and c is not None else "."))
    for name, what in (("plain ÷ tether", "against the TetherGate patch"),
                       ("plain ÷ reinit", "against the control that only re-initialises the gates")):
        p = next((p for p in res["pairs"] if p["pair"] == name), None)
        if p is not None and p["steps"]["geomean"] is not None:
            s = p["steps"]
            out.append(f"Steps to recover the loss after the switch, plain {what}: {ratio_words(s)} (geometric mean "
                       f"of the paired per-seed ratios {s['geomean']:.3f}, {d.confidence:.0%} interval "
                       f"{s['low']:.3f}–{s['high']:.3f}; {s['slower']} seeds slower, {s['tied']} tied, "
                       f"{s['faster']} faster; Wilcoxon p {_p(s['wilcoxon_p'])}).")
    return out


def _pp(x: float) -> str:
    return f"{100 * x:.1f}"


def _p(p: float | None) -> str:
    return "—" if p is None else f"= {p:.3g}"


def ratio_words(s: dict) -> str:
    """A paired ratio a ÷ b in words, from its interval alone."""
    if s["low"] > 1.0:
        return f"plain takes {100 * (s['geomean'] - 1):.1f} % more steps"
    if s["high"] < 1.0:
        return f"plain takes {100 * (1 - s['geomean']):.1f} % fewer steps"
    return "no difference the interval resolves"


def _row(p: dict) -> dict:
    s, c = p["steps"], p["closed"]
    return {"pair": p["pair"], "step_ratio": s["geomean"], "low": s["low"], "high": s["high"],
            "slow_tie_fast": f"{s['slower']}/{s['tied']}/{s['faster']}", "closed_diff": c["mean"],
            "opening_diff": p["opening"]["mean"], "wilcoxon_p": s["wilcoxon_p"], "closed_p": c.get("wilcoxon_p"),
            "verdict": s["verdict"]}


def _arm_row(name: str, a: dict, budget: int) -> dict:
    return {"arm": name, "closed_share": round(float(np.mean(a["closed_share"])), 6),
            "opening": round(float(np.mean(a["opening"])), 6), "median_steps": a["median_steps"],
            "recovered": f"{a['recovered']}/{len(a['steps'])}", "budget": budget}


def tether_report(res: dict, note: tuple[str, ...] = ()) -> Report:
    d = res["design"]
    return Report(
        command="tether-experiment",
        params={"quick": res["quick"], "scenario": d.get("scenario", "train-all"), "seeds": d["seeds"],
                "arms": d["arms"], "model": res["model"]},
        tables=(Table("pairs", "paired by seed: steps to recover (ratio), gates closed at the switch (difference)",
                      [_row(p) for p in res["pairs"]],
                      ("pair", "step_ratio", "low", "high", "slow_tie_fast", "closed_diff"),
                      wide=("opening_diff", "wilcoxon_p", "closed_p", "verdict")),
                Table("rows", "per arm: gates closed and mean opening at the switch, steps to recover",
                      [_arm_row(k, v, d["steps_b"]) for k, v in res["arms"].items()],
                      ("arm", "closed_share", "opening", "median_steps", "recovered"), wide=("budget",))),
        notes=note, answer=tuple(res["verdict"]["answer"]))


def markdown(res: dict, design: Design) -> str:
    gates = design.train_a == "gates"
    out = [f"# tether-experiment{' --scenario gates-only' if gates else ''}: does the TetherGate patch keep gates "
           "from collapsing?", "", *res["verdict"]["answer"], "", "## Design (fixed before the run)", "",
           *lines(design), "", "## Results, paired by seed", ""]
    if gates:  # with the p-values (the train-all results keep the table they were committed with)
        out += ["| pair | step ratio | interval | slower/tied/faster | p | closed share, difference | p | mean "
                "opening, difference |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    else:
        out += ["| pair | step ratio | interval | slower/tied/faster | closed share, difference | mean opening, "
                "difference |", "| --- | --- | --- | --- | --- | --- |"]
    for p in res["pairs"]:
        s, c, o = p["steps"], p["closed"], p["opening"]
        ps = (f" {s['wilcoxon_p']} |", f" {c['wilcoxon_p']} |") if gates else ("", "")
        out.append(f"| {p['pair']} | {s['geomean']} | {s['low']}–{s['high']} | {s['slower']}/{s['tied']}/"
                   f"{s['faster']} |{ps[0]} {c['mean']} ({c['low']}–{c['high']}) |{ps[1]} {o['mean']} "
                   f"({o['low']}–{o['high']}) |")
    out += ["", "| arm | closed share at the switch | mean opening | median steps to recover | recovered |",
            "| --- | --- | --- | --- | --- |"]
    for name, a in res["arms"].items():
        r = _arm_row(name, a, design.steps_b)
        out.append(f"| {name} | {r['closed_share']} | {r['opening']} | {r['median_steps']} | {r['recovered']} |")
    out += ["", "Gate health per arm (mean over seeds, one step in " f"{design.every}): see `health` in the JSON "
            "and the figure.", "", "Provenance: " + ", ".join(f"{k} {v}" for k, v in res["provenance"].items()
                                                               if k != "seeds"), ""]
    return "\n".join(out)


def figure(res: dict):
    from softcapgrad.core.plot import DPI, SIZE, pyplot

    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=SIZE, dpi=DPI)
    steps_a = res["design"]["steps_a"]
    for name, a in res["arms"].items():
        curves: dict[int, list[float]] = {}
        for rows in a["health"].values():
            for h in rows:
                curves.setdefault(h["step"] + (steps_a if h["phase"] == "B" else 0), []).append(h["opening"])
        xs = sorted(curves)
        left.plot(xs, [float(np.mean(curves[x])) for x in xs], lw=1.0, label=name)
    left.axvline(steps_a, color="grey", lw=0.6, ls=":")
    left.set_xlabel("step (dotted: the switch)", fontsize=6)
    left.set_ylabel("mean gate opening", fontsize=6)
    left.legend(fontsize=5)
    for i, p in enumerate(res["pairs"]):
        ratios = p["steps"]["ratios"]
        xs = [i + 0.3 * (k / max(1, len(ratios) - 1) - 0.5) for k in range(len(ratios))]
        right.scatter(xs, ratios, s=6)
        if p["steps"]["geomean"] is not None:
            right.plot([i - 0.25, i + 0.25], [p["steps"]["geomean"]] * 2, color="black", lw=1.0)
    right.axhline(1.0, color="grey", lw=0.6, ls=":")
    right.set_xticks(range(len(res["pairs"])), [p["pair"] for p in res["pairs"]], fontsize=5)
    right.set_ylabel("per-seed ratio of steps to recover", fontsize=6)
    for ax in (left, right):
        ax.tick_params(labelsize=6)
    fig.suptitle("TetherGate patch against plain gates and a re-initialising control"
                 + (f" ({res['scenario']})" if res.get("scenario", "train-all") != "train-all" else "")
                 + (" (--quick)" if res["quick"] else ""), fontsize=7)
    fig.tight_layout()
    return fig


def finite(runs: list[Run]) -> bool:
    return all(math.isfinite(x) for r in runs for x in r.loss_a + r.loss_b)
