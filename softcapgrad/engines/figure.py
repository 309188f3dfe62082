"""The parity figure: engine and route × model type and cap, the verdict as a colour, drawn with core.plot."""

COLOURS = {"applied": "tab:green", "ignored": "tab:red", "different": "tab:orange", "not finite": "tab:purple",
           "not bound": "tab:olive", "unused by transformers": "tab:olive", "could not run": "lightgrey",
           "no such architecture": "whitesmoke", "not set": "white"}


def parity_figure(rows: list[dict]):
    """Engines × caps (per model): the verdict as a colour, the largest log-prob error as text."""
    from softcapgrad.core.plot import DPI, SIZE, pyplot

    plt = pyplot()
    columns = list(dict.fromkeys((r["model"], r["cap"]) for r in rows))
    engines = list(dict.fromkeys(f"{r['engine']} {r['route']}" for r in rows))
    fig, ax = plt.subplots(figsize=SIZE, dpi=DPI)
    for r in rows:
        x, y = columns.index((r["model"], r["cap"])), engines.index(f"{r['engine']} {r['route']}")
        added = r["verdict"] == "unused by transformers" and "the engine applies it" in (r.get("hint") or "")
        colour = "tab:red" if added else COLOURS.get(r["verdict"], "white")
        ax.add_patch(plt.Rectangle((x - 0.48, y - 0.48), 0.96, 0.96, color=colour, ec="k"))
        error = "" if r["error"] is None else f"\n{r['error']:.2g}"
        text = "applied by the engine,\nunused by transformers" if added else r["verdict"]
        ax.text(x, y, text + error, ha="center", va="center", fontsize=7)
    ax.set_xlim(-0.5, len(columns) - 0.5)
    ax.set_ylim(len(engines) - 0.5, -0.5)
    ax.set_xticks(range(len(columns)), [f"{m}\n{c} cap" for m, c in columns], fontsize=7)
    ax.set_yticks(range(len(engines)), engines, fontsize=8)
    ax.set_title("verdict per engine and cap; below it, the largest |Δ log-prob| against the capped form", fontsize=9)
    fig.tight_layout()
    return fig
