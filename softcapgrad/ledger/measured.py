"""The ledger's claims that rest on a committed run (results/*.json), read, never rerun: reproduce stays fast.
``make experiment`` / ``softcapgrad tether-experiment`` regenerate them."""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "results"


EXPERIMENT = RESULTS / "experiment.json"
TETHER = RESULTS / "tether-experiment.json"


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
def tether() -> dict | None:
    """The committed tether-experiment run."""
    return _read(TETHER)


def _tether_pair(name: str) -> dict | None:
    return next((p for p in (tether() or {}).get("pairs", []) if p["pair"] == name), None)


def tether_closed_low() -> float:
    """Lower end of the paired plain − tether share of gates closed at the switch: above 0 = the patch held gates."""
    p = _tether_pair("plain ÷ tether")
    return math.nan if p is None or p["closed"]["low"] is None else p["closed"]["low"]


def why_tether() -> str:
    res = tether()
    p, c = _tether_pair("plain ÷ tether"), _tether_pair("plain ÷ reinit")
    if res is None or p is None:
        return "results/tether-experiment.json is missing or unreadable: run softcapgrad tether-experiment"
    arms, n = res["arms"], len(res["design"]["seeds"])
    closed = {a: sum(v["closed_share"]) / len(v["closed_share"]) for a, v in arms.items()}
    s, f = p["steps"], "{0[geomean]:.4g} [{0[low]:.4g}, {0[high]:.4g}]"
    return (f"beyond the document, from results/tether-experiment.json{' (--quick)' if res['quick'] else ''}: tiny "
            f"Qwen3-Next gated attention, AdamW with weight decay, the branch useless then needed; share of gates "
            f"closed at the switch, mean over {n} seeds: " + ", ".join(f"{a} {v:.3g}" for a, v in closed.items())
            + f"; paired plain − tether {p['closed']['mean']:.3g} [{p['closed']['low']:.3g}, {p['closed']['high']:.3g}]"
            f"; steps to recover, plain ÷ tether {f.format(s)}"
            + (f", plain ÷ reinit {f.format(c['steps'])}" if c else "")
            + f"; torch {res['provenance']['torch']}, transformers {res['provenance']['transformers']}")
