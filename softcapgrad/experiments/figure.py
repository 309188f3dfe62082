"""The experiment's figure: per depth, the per-seed paired step ratios (eager ÷ patched and the dead zone alone,
control ÷ patched), for each shift, with their geometric means; drawn with softcapgrad.core.plot."""

from __future__ import annotations

import math

MARKS = {"rotation": "o", "band": "x"}
COLOURS = {"total": "tab:red", "dead_zone": "tab:blue"}
LABELS = {"total": "eager ÷ patched", "dead_zone": "control ÷ patched"}


def experiment_figure(res: dict):
    from softcapgrad.core.plot import DPI, SIZE, pyplot

    plt = pyplot()
    depths = list(dict.fromkeys(r["depth"] for r in res["paired"]))
    cols = min(3, len(depths)) or 1
    rows = math.ceil(len(depths) / cols) or 1
    fig, axes = plt.subplots(rows, cols, figsize=SIZE, dpi=DPI, sharey=True, squeeze=False)
    for i, ax in enumerate(axes.flat):
        if i >= len(depths):
            ax.set_visible(False)
            continue
        depth = depths[i]
        for r in (x for x in res["paired"] if x["depth"] == depth):
            for j, kind in enumerate(("total", "dead_zone")):
                p = r[kind]
                if p is None or not p["ratios"]:
                    continue
                offset = (0 if r["shift"] == "rotation" else 2) + j
                xs = [offset + 0.3 * (k / max(1, len(p["ratios"]) - 1) - 0.5) for k in range(len(p["ratios"]))]
                ax.scatter(xs, p["ratios"], s=6, marker=MARKS.get(r["shift"], "."), color=COLOURS[kind],
                           label=f"{LABELS[kind]}, {r['shift']}" if i == 0 else None, linewidths=0.7)
                ax.plot([offset - 0.25, offset + 0.25], [p["geomean"]] * 2, color="black", lw=1.0)
        ax.axhline(1.0, color="grey", lw=0.6, ls=":")
        ax.set_xticks([0, 1, 2, 3], ["tot.\nrot.", "dz\nrot.", "tot.\nband", "dz\nband"], fontsize=5)
        ax.set_title(f"{depth:g}×", fontsize=7, pad=2)
        ax.tick_params(labelsize=6)
    for row in axes:
        row[0].set_ylabel("per-seed step ratio", fontsize=6)
    axes.flat[0].legend(fontsize=5, loc="upper left")
    fig.suptitle("paired per-seed step ratios by depth past the bf16 horizon (bar: geometric mean)"
                 + (" (--quick)" if res["quick"] else ""), fontsize=7)
    fig.tight_layout()
    return fig
