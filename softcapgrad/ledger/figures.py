"""Figures drawn from the same Report objects the tables print: no second computation.

How a figure is drawn and written (size, dpi, fixed metadata, matplotlib as an optional extra) is
``softcapgrad.core.plot``: the same for the figures here and those beside other layers' reports.
"""

from __future__ import annotations

from pathlib import Path

from softcapgrad.core.checks import InputError
from softcapgrad.core.plot import DPI, SIZE, png_bytes, pyplot, save  # noqa: F401 (re-exported)
from softcapgrad.core.report import Report


def _label(ax, x: str, y: str, title: str, legend: bool = False) -> None:
    """Axis labels (words with units), the title, and the legend when the axes carry labelled lines."""
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.set_title(title)
    if legend:
        ax.legend(fontsize=7)


def _table(report: Report, key: str) -> list[dict]:
    for t in report.tables:
        if t.key == key:
            return t.rows
    raise InputError(f"{report.command}: the figure needs the '{key}' data, which this run did not produce")


def attenuation_figure(identity: Report):
    plt = pyplot()
    rows = _table(identity, "curve")
    fig, ax = plt.subplots(figsize=SIZE, dpi=DPI)
    x = [r["a_over_c"] for r in rows]
    ax.semilogy(x, [r["attenuation"] for r in rows], label="sech²(a/c), exact")
    ax.semilogy(x, [r["asymptote"] for r in rows], "--", label="asymptote 4·exp(−2a/c)")
    for r in _table(identity, "horizons"):
        ax.axvline(r["a_over_c"], color="grey", lw=0.8, ls=":")
        ax.annotate(f"{r['dtype']} horizon", (r["a_over_c"], 2.0), rotation=90, fontsize=7, ha="right", va="top")
    _label(ax, "pre-cap input a / cap c (dimensionless)", "dz/da (dimensionless, log scale)",
           "Attenuation falls exponentially with confidence; past each format's horizon it is exactly 0")
    ax.legend(loc="lower left", bbox_to_anchor=(0.0, 0.12))
    return fig


def knee_figure(knee: Report):
    """The knee per format for tanh (or, when only the sigmoid was asked, for the sigmoid)."""
    plt = pyplot()
    fns = [r["fn"] for r in knee.tables[0].rows]
    fn = "tanh" if "tanh" in fns else fns[0]
    rows = [r for r in knee.tables[0].rows if r["fn"] == fn]
    backends = [b for b in _table(knee, "backends") if b["fn"] == fn and b["supported"] and b["backend"] != "exact"]
    fig, ax = plt.subplots(figsize=SIZE, dpi=DPI)
    names = [r["dtype"] for r in rows]
    pos = {n: i for i, n in enumerate(names)}
    if fn == "tanh":
        ax.scatter([pos[n] for n in names], [r["knee_doc_formula"] for r in rows], marker="v",
                   label="document formula (ln2/2)(p+2)")
    ax.scatter([pos[n] for n in names], [r["knee_spacing"] for r in rows], marker="^",
               label="spacing below 1.0: ½ln(4/ε₋)" if fn == "tanh" else "spacing below 1.0: ln(2/ε₋)")
    ax.scatter([pos[n] for n in names], [r["knee_exact"] for r in rows], marker="o", facecolors="none", edgecolors="k", s=60,
               label="exact atanh(1 − ε₋/2)" if fn == "tanh" else "exact logit(1 − ε₋/2)")
    for backend, marker in (("numpy", "x"), ("torch", "+")):
        pts = [b for b in backends if b["backend"] == backend and b["dtype"] in pos]
        left_out = [b["dtype"] for b in pts if b.get("varies_with_cpu")]  # the figure is the same on every CPU
        pts = [b for b in pts if not b.get("varies_with_cpu")]
        if not pts:
            continue
        ax.scatter([pos[b["dtype"]] for b in pts], [b["first_saturating_input"] for b in pts], marker=marker, s=60,
                   label=f"{backend}: first input stored as 1.0"
                         + (f" ({', '.join(left_out)} not drawn: it depends on the CPU)" if left_out else ""))
    ax.set_xticks(range(len(names)), names, rotation=35, ha="right", fontsize=7)
    ax.set_ylabel(f"x where {fn}(x) is stored as 1.0 (dimensionless)")
    ax.set_title("The document's knee formula sits below every real knee; fp32 backends differ" if fn == "tanh"
                 else "Where sigmoid(x) is stored as exactly 1.0, per format")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def horizon_figure(horizon: Report):
    plt = pyplot()
    rows = _table(horizon, "curve")
    fig, ax = plt.subplots(figsize=SIZE, dpi=DPI)
    for cap in sorted({r["cap"] for r in rows}):
        pts = [r for r in rows if r["cap"] == cap]
        a = [r["a"] for r in pts]
        line, = ax.semilogy(a, [r["grad_exact"] for r in pts], label=f"exact sech²(a/c), c = {cap:g}")
        live = [r for r in pts if r["grad_autograd"] > 0]
        dead = [r for r in pts if r["grad_autograd"] == 0]
        ax.step([r["a"] for r in live], [r["grad_autograd"] for r in live], where="mid", color=line.get_color(), alpha=0.6,
                label=f"{horizon.params['dtype']} autograd, c = {cap:g}")
        if dead:
            floor = min(r["grad_exact"] for r in pts) / 4
            ax.plot([r["a"] for r in dead], [floor] * len(dead), "x", color=line.get_color(),
                    label=f"autograd exactly 0.0 (drawn at {floor:.1e}), c = {cap:g}")
    _label(ax, "pre-cap input a (logit units)", "dz/da through the cap (log scale)",
           f"In {horizon.params['dtype']} the gradient is a coarse staircase, then exactly zero past the horizon", legend=True)
    return fig


def ratchet_figure(ratchet: Report):
    plt = pyplot()
    rows = _table(ratchet, "curve")
    fig, ax = plt.subplots(figsize=SIZE, dpi=DPI)
    ax2 = ax.twinx()
    for cap in sorted({r["cap"] for r in rows}):
        pts = [r for r in rows if r["cap"] == cap]
        ax.semilogx([1 - r["f"] for r in pts], [r["a"] for r in pts], label=f"a = c·atanh(f), c = {cap:g}")
    first = [r for r in rows if r["cap"] == rows[0]["cap"]]
    ax2.loglog([1 - r["f"] for r in first], [r["gradient"] for r in first], "k--", label="gradient 1 − f² (any c)")
    shown = ratchet.tables[0].rows
    ax.plot([1 - r["f"] for r in shown], [r["a"] for r in shown], "ko", ms=3, label="table rows")
    ax.invert_xaxis()
    ax.set_xlabel("1 − f, distance of the confidence f = z/c from 1 (log scale, reversed)")
    ax.set_ylabel("pre-activation a needed (logit units)")
    ax2.set_ylabel("gradient at that a (log scale)")
    ax.set_title("Confidence needs an unbounded input while the gradient that grows it vanishes")
    lines, lines2 = ax.get_legend_handles_labels(), ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="center left", fontsize=7)
    return fig


def dynamics_figure(reports: list[Report]):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=SIZE, dpi=DPI)
    for report in reports:
        rows = _table(report, "sweep")
        label = report.params["dtype"]
        ok = [r for r in rows if r["status"] == "converged"]
        line, = ax.semilogy([r["a0"] for r in ok], [r["ratio"] for r in ok], "o-", ms=3, label=f"{label}: capped/uncapped steps")
        stalled = [r["a0"] for r in rows if r["status"] == "stalled"]
        if stalled:
            ax.axvspan(min(stalled), max(stalled), color=line.get_color(), alpha=0.15, label=f"{label}: stalled (gradient exactly 0)")
    first = _table(reports[0], "sweep")
    ax.semilogy([r["a0"] for r in first], [r["pointwise_factor"] for r in first], "k:", label="pointwise factor 1/sech²(a0/c)")
    _label(ax, "starting pre-cap logit a0 of the wrong class (logit units)", "slowdown (ratio, log scale)",
           "End-to-end slowdown: mild at moderate a0, steep for deep starts; bf16 stalls past its horizon", legend=True)
    return fig


def gates_figure(gates: Report):
    plt = pyplot()
    rows = gates.tables[0].rows if gates.tables[0].rows and "softmax" in gates.tables[0].rows[0] else _table(gates, "competition")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=SIZE, dpi=DPI)
    idx = [r["i"] + 1 for r in rows]
    w = 0.38
    for ax, key, title in ((ax1, "softmax", "softmax: shares compete"), (ax2, "softplus", "softplus: strengths independent")):
        ax.bar([i - w / 2 for i in idx], [r[key] for r in rows], w, label="logits [1, 2, 3]")
        ax.bar([i + w / 2 for i in idx], [r[f"{key}_after"] for r in rows], w, label="z₃ raised by 1")
        ax.set_xticks(idx, [f"z{i}" for i in idx])
        _label(ax, "output index", f"{key} output (dimensionless)", title, legend=True)
    fig.suptitle("Raising z₃ takes share from every other softmax output; the other softplus outputs do not move")
    fig.tight_layout()
    return fig


def tether_figure(tether: Report):
    plt = pyplot()
    rows = _table(tether, "collapse_curve")
    push = _table(tether, "wd")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=SIZE, dpi=DPI)
    steps = [r["step"] for r in rows]
    ax1.plot(steps, [r["plain_mean_gate"] for r in rows], label="plain learned gate")
    ax1.plot(steps, [r["tether_mean_gate"] for r in rows], label="TetherGate (wd = 20)")
    ax1.plot(steps, [r["tether_floor"] for r in rows], ":", label="TetherGate floor F")
    _label(ax1, "training step", "mean gate opening (0–1)", "collapse vs tether", legend=True)
    for wd in sorted({r["wd"] for r in push}, reverse=True):
        pts = [r for r in push if r["wd"] == wd and r["regime"] in ("ok", "lr·wd not ≪ 1")]
        ax2.loglog([r["lr"] for r in pts], [r["offset"] for r in pts], "o-", label=f"measured, wd = {wd:g}")
        ax2.axhline(1 / wd, ls=":", color=ax2.lines[-1].get_color(), lw=0.8)
    _label(ax2, "learning rate (log scale)", "θ − θ* at equilibrium (dotted: 1/wd)",
           "equilibrium offset vs lr", legend=True)
    fig.suptitle("A plain gate collapses; the tether holds it near g_target, θ settling ≈ 1/wd off for lr·wd ≪ 1")
    fig.tight_layout()
    return fig


def audit_figure(audit: Report):
    """Each soft-cap site's largest |a| against its path's first zero-gradient input, with the dead config."""
    plt = pyplot()
    rows = [r for r in audit.tables[0].rows if r["max_abs"] is not None and r["first_zero_grad_input"]]
    fig, ax = plt.subplots(figsize=SIZE, dpi=DPI)
    labels = [f"{r['implementation']} · {r['module']}" for r in rows]
    ratio = [r["max_abs"] / r["first_zero_grad_input"] for r in rows]
    floor = min([q for q in ratio if q > 0] + [1.0]) / 10  # a site whose inputs were all 0 is drawn at the floor
    colours = {"attention": "tab:blue", "final logits": "tab:orange", "other": "tab:grey"}
    ax.barh(range(len(rows)), [max(q, floor) for q in ratio], color=[colours[r["caps"]] for r in rows], log=True)
    for i, r in enumerate(rows):
        ax.annotate(f" c = {r['cap']:g}, {r['dtype']}: {r['fraction']:.2%} past {r['first_zero_grad_input']:g}",
                    (max(ratio[i], floor), i), va="center", fontsize=7)
    ax.axvline(1.0, color="k", ls=":", lw=1)
    ax.set_xlim(floor / 2, max(ratio + [1.0]) * 300)  # room for the labels right of the longest bar
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("largest |pre-cap a| ÷ first zero-gradient input of the path (log scale; past 1: gradient exactly 0)")
    from matplotlib.patches import Patch

    handles = [Patch(color=colour, label=kind) for kind, colour in colours.items() if any(r["caps"] == kind for r in rows)]
    dead = [r["field"] for r in _table(audit, "config") if r["status"] == "dead config"]
    refused = [r["implementation"] for r in _table(audit, "implementations") if r["status"].startswith("refused")]
    extra = "; ".join(part for part in (f"dead config: {', '.join(dead)}" if dead else "",
                                         f"refused by {', '.join(refused)}" if refused else "") if part)
    ax.set_title(f"{audit.params['model_class']}: how close each soft-cap site's inputs come to the dead zone"
                 + (f"\n{extra}" if extra else ""))
    if handles:
        ax.legend(handles=handles, fontsize=7, loc="upper right")
    fig.tight_layout()
    return fig


BUILDERS = {
    "identity": attenuation_figure,
    "knee": knee_figure,
    "horizon": horizon_figure,
    "ratchet": ratchet_figure,
    "dynamics": lambda r: dynamics_figure([r]),
    "gate-demo": gates_figure,
    "tether-demo": tether_figure,
    "audit-model": audit_figure,
}


def check_plot_path(path: Path) -> None:
    """Before any computation: the extra is installed and the path names a PNG."""
    pyplot()
    if Path(path).suffix.lower() != ".png":
        raise InputError(f"--plot {path}: figures are written as .png; give a path ending in .png")


def plot(report: Report, path: Path) -> Path:
    check_plot_path(path)
    return save(BUILDERS[report.command](report), path)


REPRODUCED = ("attenuation.png", "knee.png", "horizon.png", "ratchet.png", "dynamics.png", "gates.png", "tether.png",
              "audit.png")  # audit.png only with transformers installed


def reproduce_figures() -> dict[str, bytes]:
    """Every figure `make reproduce` regenerates, as PNG bytes by file name, each from the report its table would print."""
    import numpy as np

    from softcapgrad.laws import formats
    from softcapgrad.laws.attenuation import identity_report, ratchet_report
    from softcapgrad.laws.horizon import horizon_report
    from softcapgrad.laws.knee import BACKENDS, knee_report
    from softcapgrad.laws.dynamics import Setting, dynamics_report
    from softcapgrad.demos.gates import Config, Shape, gate_demo_report
    from softcapgrad.demos.tether_demo import tether_demo_report

    starts = [float(x) for x in range(10, 131, 10)]
    setting = Setting(cap=30.0)
    dynamics = [dynamics_report(40.0, setting, None if name == "fp64" else formats.resolve(name), starts)
                for name in ("fp64", "fp16", "bf16")]
    figs = {
        "attenuation.png": attenuation_figure(identity_report(30.0, 2001, -8.0, 8.0, [1.0, 2.0, 4.0], curve=True)),
        "knee.png": knee_figure(knee_report(formats.resolve_many(["all"]), [], list(BACKENDS), ["tanh"])),
        "horizon.png": horizon_figure(horizon_report([30.0, 50.0], np.dtype(formats.resolve("bf16")), None, 6, curve=True)),
        "ratchet.png": ratchet_figure(ratchet_report([30.0, 50.0], [0.9, 0.99, 0.999], curve=True)),
        "dynamics.png": dynamics_figure(dynamics),
        "gates.png": gates_figure(gate_demo_report(["competition"], 0, Shape(), Config(), [48], [1024])),
        "tether.png": tether_figure(tether_demo_report(["collapse", "wd"], 0, curve=True)),
    }
    try:
        import transformers  # noqa: F401  (the 'hf' extra)
    except ImportError:
        pass
    else:
        from softcapgrad.models.audit import example_report

        figs["audit.png"] = audit_figure(example_report())
    return {name: png_bytes(fig) for name, fig in figs.items()}
