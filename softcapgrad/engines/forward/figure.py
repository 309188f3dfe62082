"""The parity figure: engine and route × model type and cap, the verdict as a colour, drawn with core.plot."""

COLOURS = {"applied": "tab:green", "ignored": "tab:red", "different": "tab:orange", "not finite": "tab:purple",
           "ignores the folder's caps": "tab:pink", "not bound": "tab:brown", "unused by transformers": "tab:olive",
           "not deterministic": "tab:gray", "not exercised on these inputs": "tab:cyan",
           "could not run": "lightgrey", "no such architecture": "whitesmoke", "not set": "white"}
ADDED = "applied by the engine, unused by transformers"
CELL = (0.42, 0.26)  # inches per column and per row, so that a matrix of many engines and types stays legible


def parity_figure(rows: list[dict]):
    """Engines × caps (per model): the verdict as a colour (a legend names each), the largest log-prob error as
    text where the engine gave one."""
    from softcapgrad.core.plot import DPI, SIZE, pyplot

    plt = pyplot()
    columns = list(dict.fromkeys((r["model"], r["cap"]) for r in rows))
    engines = list(dict.fromkeys(f"{r['engine']} {r['route']}" for r in rows))
    size = (max(SIZE[0], CELL[0] * len(columns) + 3.0), max(SIZE[1], CELL[1] * len(engines) + 2.5))
    fig, ax = plt.subplots(figsize=size, dpi=DPI)
    seen = {}
    for r in rows:
        x, y = columns.index((r["model"], r["cap"])), engines.index(f"{r['engine']} {r['route']}")
        added = r["verdict"] == "unused by transformers" and "the engine applies it" in (r.get("hint") or "")
        label = ADDED if added else r["verdict"]
        colour = "tab:red" if added else COLOURS.get(r["verdict"], "white")
        seen.setdefault(label, colour)
        ax.add_patch(plt.Rectangle((x - 0.48, y - 0.48), 0.96, 0.96, color=colour, ec="k", lw=0.3))
        if isinstance(r.get("error"), float):
            ax.text(x, y, f"{r['error']:.1g}", ha="center", va="center", fontsize=5)
    ax.set_xlim(-0.5, len(columns) - 0.5)
    ax.set_ylim(len(engines) - 0.5, -0.5)
    ax.set_xticks(range(len(columns)), [f"{m} {c}" for m, c in columns], fontsize=6, rotation=90)
    ax.set_yticks(range(len(engines)), engines, fontsize=6)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c, ec="k", lw=0.3) for c in seen.values()]
    ax.legend(handles, list(seen), fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.set_title("verdict per engine and cap; in each cell, the largest |Δ log-prob| against the capped form",
                 fontsize=8)
    fig.tight_layout()
    return fig
