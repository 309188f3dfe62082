"""The ``softcapgrad`` command line: parse, call one module, render its Report."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Callable, Optional

import typer

from softcapgrad import __version__
from softcapgrad.checks import InputError, at_least, choice, finite, increasing_range, positive, positives, within
from softcapgrad.report import Report, as_json, render_table

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Numerical investigations of tanh soft-capping, softplus gates and anchored residual gates.",
)

Json = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")]
Caps = Annotated[Optional[list[float]], typer.Option("--cap", help="Cap c (repeatable).")]
Dtypes = Annotated[Optional[list[str]], typer.Option("--dtype", help="Float format (repeatable; 'all').")]


def sections_option(names: str):
    return Annotated[Optional[list[str]], typer.Option("--section", help=f"{names} (repeatable; default all).")]


Plot = Annotated[Optional[Path], typer.Option("--plot", help="Also draw the result as a PNG figure (needs the 'plot' extra).")]


def pick(option: str, given: list[str] | None, allowed, default: list[str] | None = None) -> list[str]:
    """Repeatable choices: each checked against ``allowed``; 'all' means all of them; none given means ``default``."""
    if not given:
        return list(allowed) if default is None else default
    if "all" in given:
        return list(allowed)
    return [choice(option, value, allowed) for value in given]


def emit(build: Callable[[], Report], json_out: bool, plot: Path | None = None) -> None:
    """Run a computation; print its report; bad input -> one line on stderr and exit 2."""
    try:
        if plot is not None:
            from softcapgrad import figures

            figures._plt()  # a missing extra is reported before any computation
        report = build()
        if plot is not None:
            figures.plot(report, plot)
    except InputError as err:
        typer.echo(f"softcapgrad: error: {err}", err=True)
        raise typer.Exit(2) from None
    if json_out:
        typer.echo(as_json(report))
    else:
        from rich.console import Console

        console = Console(width=None if sys.stdout.isatty() else int(os.environ.get("COLUMNS", 160)))
        render_table(report, console)
    if not report.ok:
        raise typer.Exit(1)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"softcapgrad {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version and exit.")
    ] = False,
) -> None:
    pass


@app.command()
def identity(
    cap: Annotated[float, typer.Option(help="Cap c.")] = 30.0,
    points: Annotated[int, typer.Option(help="Grid points for the autograd check.")] = 2_000_000,
    range_: Annotated[
        tuple[float, float], typer.Option("--range", help="Range of a for the autograd check, in units of c.")
    ] = (-8.0, 8.0),
    at: Annotated[Optional[list[float]], typer.Option("--at", help="Extra a/c multiples for the table.")] = None,
    json_out: Json = False,
    plot: Plot = None,
) -> None:
    """dz/da = 1 − (z/c)² = sech²(a/c) against autograd, and the attenuation table."""

    def build() -> Report:
        from softcapgrad.attenuation import identity_report

        c = positive("--cap", cap)
        at_least("--points", points, 2)
        lo, hi = increasing_range("--range", *range_)
        multiples = [1.0, 2.0, 4.0] + [float(m) for m in at or [] if m not in (1.0, 2.0, 4.0)]
        return identity_report(c, points, lo, hi, multiples, curve=plot is not None)

    emit(build, json_out, plot)


@app.command()
def ratchet(
    cap: Caps = None,
    level: Annotated[Optional[list[float]], typer.Option("--level", help="Confidence f in [0, 1) (repeatable).")] = None,
    json_out: Json = False,
    plot: Plot = None,
) -> None:
    """The unbounded input behind a bounded output: a = c·atanh(f), gradient 1 − f²."""

    def build() -> Report:
        from softcapgrad.attenuation import ratchet_report

        caps = positives("--cap", cap or [30.0])
        levels = [within("--level", f, 0.0, 1.0, closed_lo=True) for f in (level or [0.9, 0.99, 0.999])]
        return ratchet_report(caps, levels, curve=plot is not None)

    emit(build, json_out, plot)


@app.command()
def knee(
    dtype: Dtypes = None,
    cap: Caps = None,
    backend: Annotated[str, typer.Option(help="exact | numpy | torch | all (torch is imported only when asked).")] = "exact",
    fn: Annotated[Optional[list[str]], typer.Option("--fn", help="tanh | sigmoid (repeatable; default tanh).")] = None,
    json_out: Json = False,
    plot: Plot = None,
) -> None:
    """Where tanh(x) (or a sigmoid) is stored as exactly 1.0 in each float format."""

    def build() -> Report:
        from softcapgrad import formats
        from softcapgrad.deadzone import BACKENDS, FUNCTIONS, knee_report

        dtypes = formats.resolve_many(dtype or ["bf16"])
        caps = positives("--cap", cap or [])
        name = choice("--backend", backend, (*BACKENDS, "all"))
        fns = pick("--fn", fn, FUNCTIONS, ["tanh"])
        return knee_report(dtypes, caps, list(BACKENDS) if name == "all" else [name], fns)

    emit(build, json_out, plot)


@app.command()
def horizon(
    cap: Caps = None,
    dtype: Annotated[str, typer.Option(help="Float format of the scores and the cap.")] = "bf16",
    at: Annotated[Optional[list[float]], typer.Option("--at", help="Probe inputs a (default 4c per cap).")] = None,
    sweep: Annotated[int, typer.Option(help="How many inputs before the horizon to show.")] = 6,
    path: Annotated[
        Optional[list[str]], typer.Option("--path", help="Implementation path (repeatable; 'all'); replaces --dtype.")
    ] = None,
    sigmoid_max: Annotated[Optional[float], typer.Option(help="Sigmoid cap m in m·σ((l + b)/s) (default 2c).")] = None,
    sigmoid_scale: Annotated[Optional[float], typer.Option(help="Sigmoid cap s (default c/2).")] = None,
    sigmoid_shift: Annotated[float, typer.Option(help="Sigmoid cap b.")] = 0.0,
    json_out: Json = False,
    plot: Plot = None,
) -> None:
    """The pre-cap horizon c·x_knee and the first input whose autograd gradient is exactly 0."""

    def build() -> Report:
        from softcapgrad import formats
        from softcapgrad.deadzone import horizon_report

        caps = positives("--cap", cap or [50.0, 30.0])
        if path:
            from softcapgrad.paths import RECIPES, Sigmoid, paths_report

            if plot is not None:
                raise InputError("--plot draws the single-format horizon; drop --path")
            names = pick("--path", path, RECIPES)
            sig = Sigmoid(
                m=None if sigmoid_max is None else positive("--sigmoid-max", sigmoid_max),
                s=None if sigmoid_scale is None else positive("--sigmoid-scale", sigmoid_scale),
                b=finite("--sigmoid-shift", sigmoid_shift),
            )
            probes = [float(positive("--at", a)) for a in at] if at else None
            return paths_report(names, caps, probes, sig)
        fmt = formats.resolve(dtype)
        if formats.torch_dtype(fmt) is None or fmt.itemsize < 2:
            raise InputError(f"--dtype {dtype}: autograd needs a format torch computes in (bf16, fp16, fp32, fp64)")
        probes = [float(positive("--at", a)) for a in at] if at else None
        at_least("--sweep", sweep, 0)
        return horizon_report(caps, fmt, probes, sweep, curve=plot is not None)

    emit(build, json_out, plot)


@app.command()
def dynamics(
    a0: Annotated[float, typer.Option("--a0", help="Starting pre-cap logit of the wrong class.")] = 40.0,
    cap: Annotated[float, typer.Option(help="Cap c.")] = 30.0,
    lr: Annotated[float, typer.Option(help="Gradient-descent learning rate.")] = 1.0,
    threshold: Annotated[float, typer.Option(help="Stop when the wrong class's probability falls below this.")] = 1e-3,
    classes: Annotated[int, typer.Option(help="Number of classes K (the others sit at logit 0).")] = 2,
    correct: Annotated[float, typer.Option(help="The correct class's fixed logit.")] = 0.0,
    max_steps: Annotated[int, typer.Option(help="Give up after this many steps.")] = 100_000,
    dtype: Annotated[str, typer.Option(help="fp64 (numpy), or bf16/fp16/fp32: the cap in that format by torch autograd.")] = "fp64",
    sweep: Annotated[bool, typer.Option("--sweep", help="Also sweep the starting point.")] = False,
    sweep_a0: Annotated[
        Optional[list[float]], typer.Option("--sweep-a0", help="Starting points of the sweep (repeatable; implies --sweep).")
    ] = None,
    backward: Annotated[str, typer.Option(help="eager | remedy (softcapgrad.softcap; low formats only).")] = "eager",
    json_out: Json = False,
    plot: Plot = None,
) -> None:
    """Steps gradient descent needs to correct a confidently wrong logit, with and without the cap."""

    def build() -> Report:
        from softcapgrad import formats
        from softcapgrad.dynamics import Setting, dynamics_report

        fmt = formats.resolve(dtype)
        if fmt.name not in ("bfloat16", "float16", "float32", "float64"):
            raise InputError(f"--dtype {dtype}: dynamics runs in bf16, fp16, fp32 or fp64")
        setting = Setting(
            cap=positive("--cap", cap),
            lr=positive("--lr", lr),
            threshold=within("--threshold", threshold, 0.0, 1.0),
            classes=at_least("--classes", classes, 2),
            correct=finite("--correct", correct),
            max_steps=at_least("--max-steps", max_steps, 1),
        )
        starts = [finite("--sweep-a0", x) for x in sweep_a0] if sweep_a0 else None
        if (sweep or plot is not None) and not starts:
            starts = [float(x) for x in range(10, 131, 10)]
        mode = choice("--backward", backward, ("eager", "remedy"))
        if mode == "remedy" and fmt.name == "float64":
            raise InputError("--backward remedy needs --dtype bf16, fp16 or fp32 (the float64 run is numpy, without autograd)")
        return dynamics_report(finite("--a0", a0), setting, fmt if fmt.name != "float64" else None, starts, mode)

    emit(build, json_out, plot)


@app.command("gate-demo")
def gate_demo(
    section: sections_option("competition | backward | laguna | cost | stability") = None,
    seed: Annotated[int, typer.Option(help="Seed of the random inputs.")] = 0,
    tokens: Annotated[Optional[list[int]], typer.Option("--tokens", help="Prefill lengths T for the cost table (repeatable).")] = None,
    heads: Annotated[
        Optional[list[int]], typer.Option("--heads", help="Query heads of each layer (repeatable, one per layer; default 48).")
    ] = None,
    model_dim: Annotated[int, typer.Option("--model-dim", help="Model width D.")] = 3072,
    kv_heads: Annotated[int, typer.Option("--kv-heads", help="Key/value heads H_kv.")] = 8,
    head_dim: Annotated[int, typer.Option("--head-dim", help="Channels per head d_h.")] = 128,
    json_out: Json = False,
    plot: Plot = None,
) -> None:
    """Softmax vs softplus, their backward passes, and the Laguna per-head softplus gate."""

    def build() -> Report:
        from softcapgrad.gates import SECTIONS, Config, Shape, gate_demo_report

        sections = pick("--section", section, SECTIONS)
        if plot is not None and "competition" not in sections:
            raise InputError("--plot draws the competition section; add --section competition")
        layer_heads = [at_least("--heads", h, 1) for h in heads or [48]]
        lengths = [at_least("--tokens", t, 1) for t in tokens or [1024, 8192, 131072]]
        cfg = Config(D=at_least("--model-dim", model_dim, 1), H_kv=at_least("--kv-heads", kv_heads, 1),
                     d_h=at_least("--head-dim", head_dim, 1))
        return gate_demo_report(sections, seed, Shape(), cfg, layer_heads, lengths)

    emit(build, json_out, plot)


@app.command("tether-demo")
def tether_demo(
    section: sections_option("collapse | wd | clamp | floor | anchors") = None,
    seed: Annotated[int, typer.Option(help="Seed of the toy signal.")] = 0,
    json_out: Json = False,
    plot: Plot = None,
) -> None:
    """TetherGate against its document: collapse, choice of wd, clamp, floor, anchors."""

    def build() -> Report:
        from softcapgrad.tether_demo import SECTIONS, tether_demo_report

        sections = pick("--section", section, SECTIONS)
        if plot is not None and not {"collapse", "wd"} <= set(sections):
            raise InputError("--plot draws the collapse and wd sections; include both")
        return tether_demo_report(sections, seed, curve=plot is not None)

    emit(build, json_out, plot)


@app.command()
def scan(
    file: Annotated[Path, typer.Argument(help="A .pt, .npy or .safetensors file of pre-cap values.")],
    cap: Annotated[float, typer.Option(help="Cap c.")] = 30.0,
    dtype: Annotated[str, typer.Option(help="Training format; picks the eager path (bf16 or fp16) when --path is absent.")] = "bf16",
    path: Annotated[Optional[list[str]], typer.Option("--path", help="Implementation path (repeatable; 'all').")] = None,
    key: Annotated[Optional[list[str]], typer.Option("--key", help="Only these tensors (repeatable).")] = None,
    json_out: Json = False,
) -> None:
    """Do real pre-cap values reach the dead zone? Counts per tensor and path, attenuation quantiles, histogram."""

    def build() -> Report:
        from softcapgrad import formats
        from softcapgrad.paths import RECIPES
        from softcapgrad.scan import scan_report

        c = positive("--cap", cap)
        if path:
            names = pick("--path", path, RECIPES)
        else:
            fmt = formats.resolve(dtype).name
            eager = {"bfloat16": "eager-bf16", "float16": "eager-fp16"}.get(fmt)
            if eager is None:
                raise InputError(f"--dtype {dtype}: give --path for formats other than bf16 and fp16")
            names = [eager]
        return scan_report(file, c, names, key)

    emit(build, json_out)


@app.command()
def reproduce(
    out: Annotated[Path, typer.Option(help="Folder for claims.json and claims.md.")] = Path("results"),
    only: Annotated[Optional[str], typer.Option(help="Regular expression on claim ids.")] = None,
    figures: Annotated[bool, typer.Option("--figures/--no-figures", help="Also write results/figures/ (needs the 'plot' extra).")] = True,
    json_out: Json = False,
) -> None:
    """Recompute every document number; write the ledger and figures; exit 1 if a verdict changed."""

    def build() -> Report:
        from softcapgrad.claims import evaluate, markdown, reproduce_report

        outcomes = evaluate(only=only)
        report = reproduce_report(outcomes)
        out.mkdir(parents=True, exist_ok=True)
        (out / "claims.json").write_text(as_json(report) + "\n")
        (out / "claims.md").write_text(markdown(outcomes))
        if figures and not only:
            from softcapgrad import figures as figs

            written = figs.reproduce_figures(out / "figures")
            report = replace(report, notes=(*report.notes, f"figures: {', '.join(str(p) for p in written)}"))
        return report

    emit(build, json_out)


def main() -> None:
    app(prog_name="softcapgrad")
