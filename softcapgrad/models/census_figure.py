"""The census's figure (figures/census.png): per model type with a tanh soft-cap field, its caps by what the model
does with them. Drawn with softcapgrad.core.plot, beside the census report it draws (models/census.py)."""

from __future__ import annotations


def census_figure(result):
    """Per model type with a cap: its caps by status (applied, off, dead config), one bar each."""
    from softcapgrad.core.plot import DPI, SIZE, pyplot

    plt = pyplot()
    statuses = ("applied", "off", "dead config")
    colours = {"applied": "tab:blue", "off": "tab:grey", "dead config": "tab:red"}
    rows = [r for r in result.rows if any(c["status"] in statuses for c in r.caps)]
    fig, ax = plt.subplots(figsize=SIZE, dpi=DPI)
    left = [0] * len(rows)
    for status in statuses:
        n = [sum(c["status"] == status for c in r.caps) for r in rows]
        ax.barh(range(len(rows)), n, left=left, color=colours[status], label=status)
        left = [a + b for a, b in zip(left, n)]
    ax.set_yticks(range(len(rows)), [r.model_type for r in rows], fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("tanh soft-cap fields, by what the model does with them")
    counts = result.counts()
    ax.set_title(f"transformers {result.transformers}, found by running each model type tiny: "
                 f"{counts['model types that apply a cap']} apply a soft-cap; dead config: {counts['caps dead config']}")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig
