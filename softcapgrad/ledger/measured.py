"""The ledger's claims that rest on a committed run (results/*.json), read, never rerun: reproduce stays fast.
``make experiment`` / ``softcapgrad tether-experiment`` regenerate them."""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "results"


EXPERIMENT = RESULTS / "experiment.json"


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


@cache
def experiment() -> dict | None:
    """The committed end-to-end measurement (``make experiment`` regenerates it; reading it keeps reproduce fast)."""
    return _read(EXPERIMENT)


def paired_totals(res: dict | None) -> list[dict]:  # the AdamW cells (depth, shift) with a paired eager ÷ patched
    return [r for r in (res or {}).get("paired", []) if r.get("total") and r["total"]["geomean"] is not None]


def experiment_low() -> float:
    """The largest lower end over depths and shifts of the paired eager ÷ patched interval: above 1 = a cost."""
    return max((r["total"]["low"] for r in paired_totals(experiment())), default=math.nan)


def why_experiment() -> str:
    res = experiment()
    if res is None:
        return "results/experiment.json is missing or unreadable: run make experiment"
    p, d, f = res["provenance"], res["design"], "{0[geomean]:.4g} [{0[low]:.4g}, {0[high]:.4g}]"
    per = "; ".join(f"{r['depth']:g}× {r['shift']}: {f.format(r['total'])}" for r in paired_totals(res))
    return (f"beyond the document, from results/experiment.json{' (--quick)' if res['quick'] else ''}: tiny Gemma 2, "
            f"AdamW, {d['task']['shift_fraction']:.0%} of the targets shifted after a confident phase; paired eager ÷ "
            f"patched step ratios, geometric mean [95% bootstrap] by depth and shift: {per}; seeds {len(p['seeds'])}, "
            f"torch {p['torch']}, transformers {p['transformers']}, CPU {p['cpu_capability']}")


@cache
def tether(name: str = "tether-experiment") -> dict | None:
    """A committed tether-experiment run: tether-experiment (train-all) or tether-collapse (--scenario gates-only)."""
    return _read(RESULTS / f"{name}.json")


def _tether_pair(pair: str, name: str = "tether-experiment") -> dict | None:
    return next((p for p in (tether(name) or {}).get("pairs", []) if p["pair"] == pair), None)


def tether_closed_low(name: str = "tether-experiment") -> float:
    """Lower end of the paired plain − tether share of gates closed at the switch: above 0 = the patch held gates."""
    p = _tether_pair("plain ÷ tether", name)
    return math.nan if p is None or p["closed"]["low"] is None else p["closed"]["low"]


def _p(x: float | None) -> str:
    return "no p (every difference 0)" if x is None else f"Wilcoxon p {x:.3g}"


def why_tether(name: str = "tether-experiment") -> str:
    res = tether(name)
    p, c = _tether_pair("plain ÷ tether", name), _tether_pair("plain ÷ reinit", name)
    if res is None or p is None:
        return f"results/{name}.json is missing or unreadable: run softcapgrad tether-experiment" + (
            " --scenario gates-only" if name == "tether-collapse" else "")
    arms, n = res["arms"], len(res["design"]["seeds"])
    closed = {a: sum(v["closed_share"]) / len(v["closed_share"]) for a, v in arms.items()}
    s, f = p["steps"], "{0[geomean]:.4g} [{0[low]:.4g}, {0[high]:.4g}]"
    what = ("AdamW with weight decay" if res.get("scenario", "train-all") == "train-all" else
            "phase A trains only the gates (AdamW, weight decay)")
    return (f"beyond the document, from results/{name}.json{' (--quick)' if res['quick'] else ''}: tiny "
            f"Qwen3-Next gated attention, {what}, the branch useless then needed; share of gates "
            f"closed at the switch, mean over {n} seeds: " + ", ".join(f"{a} {v:.3g}" for a, v in closed.items())
            + f"; paired plain − tether {p['closed']['mean']:.3g} [{p['closed']['low']:.3g}, {p['closed']['high']:.3g}]"
            + (f", {_p(p['closed']['wilcoxon_p'])}" if "wilcoxon_p" in p["closed"] else "")
            + f"; steps to recover, plain ÷ tether {f.format(s)}, {_p(s['wilcoxon_p'])}"
            + (f", plain ÷ reinit {f.format(c['steps'])}, {_p(c['steps']['wilcoxon_p'])}" if c else "")
            + f"; torch {res['provenance']['torch']}, transformers {res['provenance']['transformers']}")
