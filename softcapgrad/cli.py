"""The ``softcapgrad`` command line: parse, call one module, render its Report.

Every error a user can cause ends as one line on stderr and exit code 2: our own checks
(:class:`~softcapgrad.checks.InputError`) and the parser's (unknown option, a value that is not a
number, a missing argument) alike. An interrupt prints one line and exits 130; files are only
ever replaced whole, so an interrupt leaves none half-written.

Start-up is part of every command's time: annotations here are real objects, not strings
(``from __future__ import annotations`` makes typer evaluate each of them on every start), and
``--help`` is click's plain text (typer's rich help imports markdown and syntax highlighting,
which alone take longer than the rest of the start).
"""

import contextlib
import math
import os
import sys
from pathlib import Path
from typing import Annotated, Callable, Iterator, Optional

import typer
from typer.core import TyperGroup

from softcapgrad import __version__
from softcapgrad.checks import InputError, at_least, choice, finite, fp32_cap, increasing_range, positive, positives, within
from softcapgrad.formats import FORMAT_NAMES
from softcapgrad.names import DYNAMICS_BACKWARDS, GATE_SECTIONS, KNEE_FUNCTIONS, KNEE_STACKS, STACK_PATHS, TETHER_SECTIONS
from softcapgrad.report import Report, as_json, render_table

PROG = "softcapgrad"


def _kind(err: BaseException) -> set[str]:
    """Class names along the error's MRO: the parser's errors are recognised by name, since typer may
    bring its own copy of click's exception classes or use click's."""
    return {c.__name__ for c in type(err).__mro__}


class _OneLineErrors(TyperGroup):
    """Runs the app non-standalone and turns the parser's framed errors into one line on stderr.

    Exit codes: 0 answered, 1 a ledger verdict changed, 2 bad input, 3 an internal error, 130 interrupted.
    """

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        try:
            code = super().main(args=args, prog_name=prog_name, complete_var=complete_var,
                                standalone_mode=False, **extra)
        except (KeyboardInterrupt, typer.Abort):
            typer.echo(f"{PROG}: interrupted", err=True)
            code = 130
        except Exception as err:
            code = self._report(err)
        if standalone_mode:
            sys.exit(code or 0)
        return code

    @staticmethod
    def _report(err: Exception) -> int:
        kind = _kind(err)
        if "NoArgsIsHelpError" in kind:
            typer.echo(err.ctx.get_help())
            return 0
        if "ClickException" in kind:
            ctx = getattr(err, "ctx", None)
            where = f"{ctx.info_name}: " if ctx is not None and ctx.parent is not None else ""
            typer.echo(f"{PROG}: error: {where}{' '.join(err.format_message().split())}", err=True)
            return err.exit_code
        if os.environ.get("SOFTCAPGRAD_DEBUG"):  # a bug of ours: one line, not a traceback, unless asked
            raise err
        first = str(err).splitlines()[0] if str(err) else ""
        typer.echo(f"{PROG}: internal error: {type(err).__name__}: {first} (please report it; "
                   "SOFTCAPGRAD_DEBUG=1 shows where)", err=True)
        return 3


app = typer.Typer(
    cls=_OneLineErrors,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="Numerical investigations of tanh soft-capping, softplus gates and anchored residual gates.",
)


def one_of(values) -> str:
    return ", ".join(values)


Json = Annotated[bool, typer.Option("--json", help="Print one JSON object (every column) instead of tables.")]
Wide = Annotated[bool, typer.Option("--wide", help="Also print the secondary columns.")]
Caps = Annotated[Optional[list[float]], typer.Option("--cap", help="Cap c > 0 (repeatable).")]
Dtypes = Annotated[
    Optional[list[str]],
    typer.Option("--dtype", help=f"Float format (repeatable, case-insensitive): {one_of(FORMAT_NAMES)}, or all; "
                                 "short forms such as bf16, fp16, e4m3fn are accepted."),
]
Plot = Annotated[Optional[Path], typer.Option("--plot", help="Also draw the result as a PNG figure (needs the 'plot' extra).")]


def sections_option(names: tuple[str, ...]):
    return Annotated[Optional[list[str]], typer.Option("--section", help=f"{one_of(names)}, or all (repeatable; default all).")]


def not_with(given: dict[str, object], why: str) -> None:
    """Options the user gave that this run would not use are an error, not silently ignored."""
    used = [name for name, value in given.items() if value not in (None, [], ())]
    if used:
        raise InputError(f"{', '.join(used)} {'does' if len(used) == 1 else 'do'} not apply {why}")


def seed_in_range(seed: int | None) -> int:
    """torch and numpy generators take seeds in [0, 2^63)."""
    return bounded("--seed", 0 if seed is None else seed, 0, 2**63 - 1)


def bounded(option: str, value: int, low: int, high: int) -> int:
    if not low <= value <= high:
        raise InputError(f"{option} {value}: must lie in {low:,}..{high:,}")
    return value


def pick(option: str, given: list[str] | None, allowed, default: list[str] | None = None) -> list[str]:
    """Repeatable choices, case-insensitive: 'all' means all of them; none given means ``default``; duplicates drop."""
    if not given:
        return list(allowed) if default is None else default
    if any(g.strip().lower() == "all" for g in given):
        return list(allowed)
    return list(dict.fromkeys(choice(option, value, allowed) for value in given))


# --- running a computation -------------------------------------------------------------------


@contextlib.contextmanager
def _progress_on_stderr(show: bool, what: str) -> Iterator[None]:
    """A transient spinner (and the modules' progress bars) on stderr, for a terminal only."""
    if not show:
        yield
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from softcapgrad import progress

    bars = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                    console=Console(stderr=True), transient=True)

    @contextlib.contextmanager
    def reporter(description: str, total: float | None):
        task = bars.add_task(description, total=total)
        try:
            yield lambda n=1.0: bars.advance(task, n)
        finally:
            bars.remove_task(task)

    with bars, progress.reporting(reporter):
        bars.add_task(what, total=None)
        yield


def _console():
    from rich.console import Console

    width = None if sys.stdout.isatty() else int(os.environ.get("COLUMNS", 100) or 100)
    return Console(width=width, highlight=False)


def emit(build: Callable[[], Report], json_out: bool, wide: bool = False, plot: Path | None = None,
         command: str = "") -> None:
    """Run a computation; print its report; bad input -> one line on stderr and exit 2.

    ``--plot`` is checked (extra installed, path writable) before the computation, so a bad
    path never costs the result.
    """
    try:
        if plot is not None:
            from softcapgrad import figures
            from softcapgrad.files import writable_target

            figures.check_plot_path(plot)
            writable_target(plot, "--plot")
        with _progress_on_stderr(sys.stderr.isatty() and not json_out, f"{PROG} {command}".strip()):
            report = build()
            if plot is not None:
                figures.plot(report, plot)
    except InputError as err:
        typer.echo(f"{PROG}: error: {err}", err=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        typer.echo(f"{PROG}: interrupted; no file was written or changed", err=True)
        raise typer.Exit(130) from None
    if json_out:
        typer.echo(as_json(report))
    else:
        render_table(report, _console(), wide=wide)
    if not report.ok:
        raise typer.Exit(1)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"{PROG} {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version and exit.")
    ] = False,
) -> None:
    pass


# --- commands --------------------------------------------------------------------------------

MAX_POINTS = 50_000_000  # the autograd check holds about 10 float64 arrays of this length: 4 GB


@app.command()
def identity(
    cap: Annotated[float, typer.Option(help="Cap c > 0.")] = 30.0,
    points: Annotated[int, typer.Option(help=f"Grid points for the autograd check (2 to {MAX_POINTS:,}).")] = 2_000_000,
    range_: Annotated[
        tuple[float, float], typer.Option("--range", help="Range of a for the autograd check, in units of c.")
    ] = (-8.0, 8.0),
    at: Annotated[Optional[list[float]], typer.Option("--at", help="Extra a/c multiples for the table.")] = None,
    json_out: Json = False,
    wide: Wide = False,
    plot: Plot = None,
) -> None:
    """Is dz/da = 1 − (z/c)² = sech²(a/c) exact against autograd; how strong is the attenuation at a = c, 2c, 4c."""

    def build() -> Report:
        from softcapgrad.attenuation import MAX_A_OVER_C, identity_report

        c = positive("--cap", cap)
        at_least("--points", points, 2)
        if points > MAX_POINTS:
            raise InputError(f"--points {points}: at most {MAX_POINTS:,} (memory grows with the grid)")
        lo, hi = increasing_range("--range", *range_)
        if not (math.isfinite(lo * c) and math.isfinite(hi * c)):
            raise InputError(f"--range {lo:g} {hi:g}: times the cap {c:g} it overflows float64")
        extra = [within("--at", m, -MAX_A_OVER_C, MAX_A_OVER_C, closed_lo=True) for m in at or []]
        multiples = list(dict.fromkeys([1.0, 2.0, 4.0] + extra))
        return identity_report(c, points, lo, hi, multiples, curve=plot is not None)

    emit(build, json_out, wide, plot, "identity")


@app.command()
def ratchet(
    cap: Caps = None,
    level: Annotated[Optional[list[float]], typer.Option("--level", help="Confidence f in [0, 1) (repeatable).")] = None,
    json_out: Json = False,
    wide: Wide = False,
    plot: Plot = None,
) -> None:
    """How large must a be to express z = f·c, and how small is the gradient there."""

    def build() -> Report:
        from softcapgrad.attenuation import ratchet_report

        caps = positives("--cap", cap or [30.0])
        levels = [within("--level", f, 0.0, 1.0, closed_lo=True) for f in (level or [0.9, 0.99, 0.999])]
        return ratchet_report(caps, levels, curve=plot is not None)

    emit(build, json_out, wide, plot, "ratchet")


KNEE_BACKENDS = ("exact", "numpy", "torch", *KNEE_STACKS)


@app.command()
def knee(
    dtype: Dtypes = None,
    cap: Caps = None,
    backend: Annotated[
        Optional[list[str]],
        typer.Option("--backend", help=f"{one_of(KNEE_BACKENDS)}, or all (repeatable; torch is imported only when "
                                       "asked). The stacks are measured live where they run, else recorded."),
    ] = None,
    fn: Annotated[Optional[list[str]], typer.Option("--fn", help=f"{one_of(KNEE_FUNCTIONS)} (repeatable; default tanh).")] = None,
    json_out: Json = False,
    wide: Wide = False,
    plot: Plot = None,
) -> None:
    """Where tanh(x) (or a sigmoid) is stored as exactly 1.0 in each float format."""

    def build() -> Report:
        from softcapgrad import formats
        from softcapgrad.deadzone import knee_report

        dtypes = formats.resolve_many(dtype or ["bf16"])
        caps = positives("--cap", cap or [])
        backends = pick("--backend", backend, KNEE_BACKENDS, ["exact"])
        fns = pick("--fn", fn, KNEE_FUNCTIONS, ["tanh"])
        if "tanh" not in fns:
            not_with({"--cap": caps}, "to the sigmoid alone: its pre-cap horizon depends on its scale (see horizon --path)")
        return knee_report(dtypes, caps, backends, fns)

    emit(build, json_out, wide, plot, "knee")


@app.command()
def horizon(
    cap: Caps = None,
    dtype: Annotated[Optional[str], typer.Option(help="Float format of the scores and the cap: bf16 (default), fp16, fp32 or fp64.")] = None,
    at: Annotated[Optional[list[float]], typer.Option("--at", help="Probe inputs a (default 4c per cap).")] = None,
    sweep: Annotated[Optional[int], typer.Option(help="How many inputs before the first zero gradient to show (0 to 1000; default 6).")] = None,
    path: Annotated[
        Optional[list[str]],
        typer.Option("--path", help=f"A real stack (repeatable, or all; replaces --dtype): {one_of(STACK_PATHS)}. "
                                    "The old recipe names eager-bf16, eager-fp16, fp32-upcast, sigmoid-bf16 and "
                                    "remedy name the stack and scores format they ran."),
    ] = None,
    scores: Annotated[
        Optional[list[str]],
        typer.Option("--scores", help="With --path: the scores formats (repeatable; default bf16 and fp32; each "
                                      "stack shows those it applies to)."),
    ] = None,
    sigmoid_max: Annotated[Optional[float], typer.Option(help="Sigmoid cap m in m·σ((l + b)/s) (default 2c).")] = None,
    sigmoid_scale: Annotated[Optional[float], typer.Option(help="Sigmoid cap s (default c/2).")] = None,
    sigmoid_shift: Annotated[Optional[float], typer.Option(help="Sigmoid cap b (default 0).")] = None,
    json_out: Json = False,
    wide: Wide = False,
    plot: Plot = None,
) -> None:
    """From which pre-cap input is the autograd gradient through the cap exactly 0."""

    def build() -> Report:
        from softcapgrad import formats
        from softcapgrad.deadzone import horizon_report

        caps = positives("--cap", cap or [30.0, 50.0])
        probes = [float(positive("--at", a)) for a in at] if at else None
        if path:
            from softcapgrad.stack_reports import horizon_paths_report
            from softcapgrad.stacks import STACKS, Sigmoid, resolve_path

            not_with({"--dtype": dtype, "--sweep": sweep, "--plot": plot, "--at": at},
                     "with --path: each row is a stack's first zero-gradient input in its scores formats (--scores)")
            every = any(p.strip().lower() == "all" for p in path)
            names = list(STACKS) if every else list(dict.fromkeys(path))
            for name in names:
                resolve_path(name)  # a bad or dropped name fails before any computation
            wanted = [formats.canonical_name(s) for s in scores or []]
            sig = Sigmoid(
                m=None if sigmoid_max is None else positive("--sigmoid-max", sigmoid_max),
                s=None if sigmoid_scale is None else positive("--sigmoid-scale", sigmoid_scale),
                b=finite("--sigmoid-shift", sigmoid_shift or 0.0),
            )
            return horizon_paths_report(names, wanted or None, caps, sig, every)
        not_with({"--sigmoid-max": sigmoid_max, "--sigmoid-scale": sigmoid_scale, "--sigmoid-shift": sigmoid_shift,
                  "--scores": scores}, "without --path (--dtype gives the single format)")
        fmt = formats.resolve(dtype or "bf16")
        if formats.torch_dtype(fmt) is None or fmt.itemsize < 2:
            raise InputError(f"--dtype {dtype}: autograd needs a format torch computes in (bf16, fp16, fp32, fp64)")
        largest = float(formats.finfo(fmt).max)
        for a in probes or []:
            if a > largest:
                raise InputError(f"--at {a:g}: larger than the largest {fmt.name} value {largest:g}")
        shown = 6 if sweep is None else sweep
        if not 0 <= shown <= 1000:
            raise InputError(f"--sweep {sweep}: must lie in 0..1000")
        return horizon_report(caps, fmt, probes, shown, curve=plot is not None)

    emit(build, json_out, wide, plot, "horizon")


@app.command()
def stacks(
    record: Annotated[
        Optional[Path],
        typer.Option("--record", help="Measure every CUDA stack on this machine's GPU and write the recording to "
                                      "this JSON file (needs CUDA)."),
    ] = None,
    json_out: Json = False,
    wide: Wide = False,
) -> None:
    """The real stacks: what each computes, and whether its figures are measured here or recorded."""

    def build() -> Report:
        if record is not None:
            from softcapgrad.files import writable_target
            from softcapgrad.recorded import record_report

            return record_report(writable_target(record, "--record"))
        from softcapgrad.stack_reports import stacks_report

        return stacks_report()

    emit(build, json_out, wide, command="stacks")


@app.command()
def dynamics(
    a0: Annotated[float, typer.Option("--a0", help="Starting pre-cap logit of the wrong class.")] = 40.0,
    cap: Annotated[float, typer.Option(help="Cap c > 0.")] = 30.0,
    lr: Annotated[float, typer.Option(help="Gradient-descent learning rate > 0.")] = 1.0,
    threshold: Annotated[float, typer.Option(help="Stop when the wrong class's probability falls below this, in (0, 1).")] = 1e-3,
    classes: Annotated[int, typer.Option(help="Number of classes K ≥ 2 (the others sit at logit 0).")] = 2,
    correct: Annotated[float, typer.Option(help="The correct class's fixed logit.")] = 0.0,
    max_steps: Annotated[int, typer.Option(help="Give up after this many steps.")] = 100_000,
    dtype: Annotated[str, typer.Option(help="fp64 (numpy), or bf16, fp16, fp32: the cap in that format by torch autograd.")] = "fp64",
    sweep: Annotated[bool, typer.Option("--sweep", help="Also sweep the starting point.")] = False,
    sweep_a0: Annotated[
        Optional[list[float]], typer.Option("--sweep-a0", help="Starting points of the sweep (repeatable; implies --sweep).")
    ] = None,
    backward: Annotated[
        str, typer.Option(help=f"{one_of(DYNAMICS_BACKWARDS)} (remedy: softcapgrad.softcap; bf16, fp16, fp32 only).")
    ] = "eager",
    json_out: Json = False,
    wide: Wide = False,
    plot: Plot = None,
) -> None:
    """How many more gradient-descent steps does the cap cost to correct a confidently wrong logit."""

    def build() -> Report:
        from softcapgrad import formats
        from softcapgrad.attenuation import MAX_A_OVER_C
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
        mode = choice("--backward", backward, DYNAMICS_BACKWARDS)
        if mode == "remedy" and fmt.name == "float64":
            raise InputError("--backward remedy needs --dtype bf16, fp16 or fp32 (the float64 run is numpy, without autograd)")
        for option, start in [("--a0", a0), *(("--sweep-a0", x) for x in starts or [])]:
            if not abs(start) <= MAX_A_OVER_C * setting.cap:
                raise InputError(f"{option} {start:g}: |a0| must be at most {MAX_A_OVER_C:g}·c = "
                                 f"{MAX_A_OVER_C * setting.cap:g}; past it sech²(a0/c) underflows float64")
        return dynamics_report(a0, setting, fmt if fmt.name != "float64" else None, starts, mode)

    emit(build, json_out, wide, plot, "dynamics")


@app.command("gate-demo")
def gate_demo(
    section: sections_option(GATE_SECTIONS) = None,
    seed: Annotated[Optional[int], typer.Option(help="Seed of the random inputs of backward and laguna (0 to 2^63 − 1; default 0).")] = None,
    tokens: Annotated[Optional[list[int]], typer.Option("--tokens", help="Prefill lengths T for the cost table (repeatable).")] = None,
    heads: Annotated[
        Optional[list[int]], typer.Option("--heads", help="Query heads of each layer (repeatable, one per layer; default 48).")
    ] = None,
    model_dim: Annotated[Optional[int], typer.Option("--model-dim", help="Model width D (default 3072).")] = None,
    kv_heads: Annotated[Optional[int], typer.Option("--kv-heads", help="Key/value heads H_kv (default 8).")] = None,
    head_dim: Annotated[Optional[int], typer.Option("--head-dim", help="Channels per head d_h (default 128).")] = None,
    json_out: Json = False,
    wide: Wide = False,
    plot: Plot = None,
) -> None:
    """Softmax (competition) vs softplus (independence), their backward laws, and the Laguna per-head gate."""

    def build() -> Report:
        from softcapgrad.gates import Config, Shape, gate_demo_report

        sections = pick("--section", section, GATE_SECTIONS)
        if plot is not None and "competition" not in sections:
            raise InputError("--plot draws the competition section; add --section competition")
        if "cost" not in sections:
            not_with({"--tokens": tokens, "--heads": heads, "--model-dim": model_dim, "--kv-heads": kv_heads,
                      "--head-dim": head_dim}, "without --section cost")
        if not {"backward", "laguna"} & set(sections):
            not_with({"--seed": seed}, "without --section backward or laguna")
        seed_ok = seed_in_range(seed)
        layer_heads = [bounded("--heads", h, 1, 2**20) for h in heads or [48]]
        lengths = [bounded("--tokens", t, 1, 2**40) for t in tokens or [1024, 8192, 131072]]
        cfg = Config(D=bounded("--model-dim", 3072 if model_dim is None else model_dim, 1, 2**24),
                     H_kv=bounded("--kv-heads", 8 if kv_heads is None else kv_heads, 1, 2**20),
                     d_h=bounded("--head-dim", 128 if head_dim is None else head_dim, 1, 2**20))
        return gate_demo_report(sections, seed_ok, Shape(), cfg, layer_heads, lengths)

    emit(build, json_out, wide, plot, "gate-demo")


@app.command("tether-demo")
def tether_demo(
    section: sections_option(TETHER_SECTIONS) = None,
    seed: Annotated[Optional[int], typer.Option(help="Seed of the collapse section's toy signal (0 to 2^63 − 1; default 0).")] = None,
    json_out: Json = False,
    wide: Wide = False,
    plot: Plot = None,
) -> None:
    """Does TetherGate hold a gate open that a plain learned gate lets collapse; where does θ settle."""

    def build() -> Report:
        from softcapgrad.tether_demo import tether_demo_report

        sections = pick("--section", section, TETHER_SECTIONS)
        if plot is not None and not {"collapse", "wd"} <= set(sections):
            raise InputError("--plot draws the collapse and wd sections; include both")
        if "collapse" not in sections:
            not_with({"--seed": seed}, "without --section collapse")
        return tether_demo_report(sections, seed_in_range(seed), curve=plot is not None)

    emit(build, json_out, wide, plot, "tether-demo")


@app.command()
def scan(
    file: Annotated[Path, typer.Argument(help="A .pt, .npy or .safetensors file of pre-cap values.")],
    cap: Annotated[float, typer.Option(help="Cap c > 0.")] = 30.0,
    dtype: Annotated[Optional[str], typer.Option(help="Scores format the model rounds the values to: bf16 (default), fp16 "
                                                      "or fp32; for every --path that is a stack name.")] = None,
    path: Annotated[Optional[list[str]], typer.Option(
        "--path", help=f"A real stack (repeatable, or all; default torch-eager-cpu): {one_of(STACK_PATHS)}; the old "
                       "names eager-bf16, eager-fp16, fp32-upcast, sigmoid-bf16, remedy fix their format.")] = None,
    key: Annotated[Optional[list[str]], typer.Option("--key", help="Only these tensors (repeatable).")] = None,
    stored_as: Annotated[
        Optional[str], typer.Option("--stored-as", help="Format of a .npy whose format np.save lost (an ml_dtypes array).")
    ] = None,
    json_out: Json = False,
    wide: Wide = False,
) -> None:
    """Do the pre-cap values in a file reach each path's dead zone."""

    def build() -> Report:
        from softcapgrad import formats
        from softcapgrad.scan import scan_report
        from softcapgrad.stacks import STACKS, resolve_path

        c = fp32_cap("--cap", cap)
        every = any(p.strip().lower() == "all" for p in path or [])
        names = list(STACKS) if every else list(dict.fromkeys(path or ["torch-eager-cpu"]))
        scores = formats.canonical_name(dtype or "bf16")
        for name in names:
            stack, fixed = resolve_path(name)  # a bad or dropped name fails before any file is read
            if fixed is None and scores not in stack.formats:
                if every:
                    continue
                raise InputError(f"--path {name} takes {', '.join(stack.formats)} scores, not --dtype {dtype}")
        if every:
            names = [n for n in names if scores in STACKS[n].formats]
        return scan_report(file, c, names, key, stored_as, scores)

    emit(build, json_out, wide, command="scan")


@app.command()
def reproduce(
    out: Annotated[Path, typer.Option(help="Folder for claims.json, claims.md and figures/.")] = Path("results"),
    only: Annotated[Optional[str], typer.Option(help="Regular expression on claim ids: recompute only those.")] = None,
    figures: Annotated[Optional[bool], typer.Option("--figures/--no-figures", help="Also write figures/ (default yes; needs the 'plot' extra).")] = None,
    force: Annotated[bool, typer.Option("--force", help="With --only: write the partial ledger over the full one.")] = False,
    json_out: Json = False,
    wide: Wide = False,
) -> None:
    """Recompute every document number; write the ledger and figures; exit 1 if a verdict changed."""

    def build() -> Report:
        from softcapgrad.claims import reproduce_run

        if only is None:
            not_with({"--force": force or None}, "without --only: a full run always writes the ledger")
        else:
            not_with({"--figures": figures or None}, "with --only: figures are drawn from the full ledger's runs")
        return reproduce_run(out, only, figures is not False, force)

    emit(build, json_out, wide, command="reproduce")


@app.command("audit-model")
def audit_model(
    directory: Annotated[
        Optional[Path], typer.Argument(help="A local model directory with config.json (weights used when present; never downloaded).")
    ] = None,
    model_type: Annotated[Optional[str], typer.Option("--model-type", help="A transformers model type, built tiny from its config (see --set).")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Config field KEY=VALUE (repeatable; SUB.KEY inside a sub-config).")] = None,
    attn: Annotated[
        Optional[list[str]], typer.Option("--attn", help="Attention implementation (repeatable): eager, sdpa, flex_attention, "
                                                        "flash_attention_2, or all (the default).")
    ] = None,
    dtype: Annotated[str, typer.Option(help="Format of the parameters: bf16, fp16 or fp32.")] = "bf16",
    autocast: Annotated[Optional[str], typer.Option(help="Run under torch.autocast in bf16 or fp16 (with --dtype fp32).")] = None,
    inputs: Annotated[
        Optional[Path], typer.Option("--inputs", help="Token ids: .npy or .pt integer array (1-D or 2-D), or .txt (one sequence a line).")
    ] = None,
    batch: Annotated[Optional[int], typer.Option(help="Sequences of random token ids (default 2; not with --inputs).")] = None,
    seq_len: Annotated[Optional[int], typer.Option("--seq-len", help="Length of the random sequences (default 16; not with --inputs).")] = None,
    seed: Annotated[Optional[int], typer.Option(help="Seed of the random weights, token ids and dropout (default 0).")] = None,
    scale_logits: Annotated[float, typer.Option("--scale-logits", help="Multiply the output embedding's logits by K > 0: a confident model.")] = 1.0,
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    json_out: Json = False,
    wide: Wide = False,
    plot: Plot = None,
) -> None:
    """Which soft-caps a transformers model applies, in which format and path, and how much of a batch is dead."""

    def build() -> Report:
        import importlib.util

        if importlib.util.find_spec("transformers") is None:
            raise InputError("audit-model needs transformers: pip install 'softcapgrad[hf]'")
        import torch

        from softcapgrad import audit, formats

        implementations = pick("--attn", attn, audit.IMPLEMENTATIONS)
        params_format = formats.resolve(dtype).name
        if params_format not in audit.FORMATS:
            raise InputError(f"--dtype {dtype}: the model is built in bf16, fp16 or fp32")
        low = None
        if autocast is not None:
            low = formats.resolve(autocast).name
            if low not in ("bfloat16", "float16"):
                raise InputError(f"--autocast {autocast}: autocast runs in bf16 or fp16")
            if params_format != "float32":
                not_with({"--autocast": autocast}, f"with --dtype {dtype}: autocast lowers fp32 parameters")
        device_name = choice("--device", device, ("cpu", "cuda"))
        if device_name == "cuda" and not torch.cuda.is_available():
            raise InputError("--device cuda: no CUDA device here")
        k = positive("--scale-logits", scale_logits)
        s = seed_in_range(seed)
        if inputs is not None:
            not_with({"--batch": batch, "--seq-len": seq_len}, "with --inputs: the file gives the batch")
            ids = audit.read_token_ids(inputs)
        src = audit.source(directory, model_type, set_ or [])
        if inputs is None:
            ids = audit.random_ids(src.config, bounded("--batch", 2 if batch is None else batch, 1, 4096),
                                   bounded("--seq-len", 16 if seq_len is None else seq_len, 1, 1 << 20), s)
        else:
            audit.check_ids(ids, src.config, f"--inputs {inputs}")
        return audit.audit_model(src, implementations, ids, params_format, low, s, k, device_name,
                                 {"model": str(directory) if directory else model_type, "set": set_ or [],
                                  "inputs": str(inputs) if inputs else None})

    emit(build, json_out, wide, plot, "audit-model")


def main() -> None:
    try:
        app(prog_name=PROG)
        code = 0
    except SystemExit as done:
        code = done.code
    _leave(code)


def _leave(code) -> None:
    """Exit with ``code``. A run that never imported torch skips the interpreter's teardown (freeing
    every module and object, a fifth of a numpy-only command's time): its output is flushed here and
    its files were written whole before (files.py). A run with torch exits normally, so torch's own
    exit handlers (compile workers among them) run."""
    if "torch" in sys.modules:
        sys.exit(code)
    if isinstance(code, str):
        print(code, file=sys.stderr)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed pipe (| head) is not an error here
            stream.flush()
    os._exit(code or 0)
