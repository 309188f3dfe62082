"""The command line's shared parts: the typer app, its one-line errors, the common options and ``emit``.

Every error a user can cause ends as one line on stderr and exit code 2: our own checks
(:class:`~softcapgrad.core.checks.InputError`) and the parser's (unknown option, a value that is not a
number, a missing argument) alike. An interrupt prints one line and exits 130; files are only
ever replaced whole, so an interrupt leaves none half-written.

Start-up is part of every command's time: annotations here are real objects, not strings
(``from __future__ import annotations`` makes typer evaluate each of them on every start), and
``--help`` is click's plain text (typer's rich help imports markdown and syntax highlighting,
which alone take longer than the rest of the start).
"""

import contextlib
import os
import sys
from pathlib import Path
from typing import Annotated, Callable, Iterator, Optional

import typer
from typer.core import TyperGroup

from softcapgrad import __version__
from softcapgrad.core.checks import InputError, choice
from softcapgrad.cli.limits import CAP, path_given
from softcapgrad.laws.formats import FORMAT_NAMES
from softcapgrad.core.report import Report, as_json, printable, render_table

PROG = "softcapgrad"


def _kind(err: BaseException) -> set[str]:
    """Class names along the error's MRO: the parser's errors are recognised by name, since typer may
    bring its own copy of click's exception classes or use click's."""
    return {c.__name__ for c in type(err).__mro__}


class _OneLineErrors(TyperGroup):
    """Runs the app non-standalone and turns the parser's framed errors into one line on stderr.

    Exit codes: 0 answered, 1 a ledger verdict changed, 2 bad input or a target (a file, stdout) that cannot be
    written (a full disk, /dev/full), 3 an internal error, 4 (NO_VERDICT) parity judged no cap, 130 interrupted,
    143 terminated (SIGTERM held until a result set's files were all in place).
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
        if "BrokenPipeError" in kind:  # the reader stopped (| head): as a filter killed by SIGPIPE
            return reader_gone()
        if "NoArgsIsHelpError" in kind:
            typer.echo(err.ctx.get_help())
            return 0
        if "ClickException" in kind:
            ctx = getattr(err, "ctx", None)
            where = f"{ctx.info_name}: " if ctx is not None and ctx.parent is not None else ""
            typer.echo(f"{PROG}: error: {where}{' '.join(err.format_message().split())}", err=True)
            return err.exit_code
        if "InputError" in kind:  # a target that cannot be written, found outside emit (a command's own files)
            typer.echo(f"{PROG}: error: {printable(str(err))}", err=True)  # a path or name from outside: escaped
            return 2
        if os.environ.get("SOFTCAPGRAD_DEBUG"):  # a bug of ours: one line, not a traceback, unless asked
            raise err
        first = str(err).splitlines()[0] if str(err) else ""
        typer.echo(f"{PROG}: internal error: {type(err).__name__}: {first} (please report it; "
                   "SOFTCAPGRAD_DEBUG=1 shows where)", err=True)
        return 3


NO_VERDICT = 4  # parity judged no cap (no engine ran; the server gave nothing to judge): not a pass, not bad input
SIGPIPE_EXIT = 141  # 128 + SIGPIPE: what a shell reports for a filter whose reader went away


def reader_gone() -> int:
    """stdout's reader has closed the pipe: point stdout at /dev/null, so that the flush at exit
    does not fail again, and exit quietly with SIGPIPE_EXIT (``| head -1`` is not an error of ours)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    return SIGPIPE_EXIT


def stdout_unwritable(err: OSError) -> int:
    """stdout took no bytes (a full disk, /dev/full): one line on stderr, stdout pointed at /dev/null so that
    the flush at exit does not fail again, and exit 2, as for any target that cannot be written."""
    typer.echo(f"{PROG}: error: cannot write the answer to standard output ({err.strerror or err})", err=True)
    reader_gone()
    return 2


def stdout_closed() -> bool:
    """Started with no standard output at all (``>&-``): nothing could carry the answer."""
    if sys.stdout is None:
        return True
    try:
        os.fstat(sys.stdout.fileno())
    except (OSError, ValueError):
        return True
    except Exception:  # a replaced stream without a descriptor (a test runner's buffer) is open
        return False
    return False


app = typer.Typer(
    cls=_OneLineErrors,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"max_content_width": 100},  # help as wide as the terminal, up to 100 columns
    help="Numerical investigations of tanh soft-capping, softplus gates and anchored residual gates.",
)


def one_of(values) -> str:
    return ", ".join(values)


Json = Annotated[bool, typer.Option("--json", help="Print one JSON object (every column) instead of tables.")]
Wide = Annotated[bool, typer.Option("--wide", help="Also print the secondary columns.")]
Caps = Annotated[Optional[list[float]], typer.Option("--cap", callback=CAP, help="Cap c > 0 (repeatable).")]
Dtypes = Annotated[
    Optional[list[str]],
    typer.Option("--dtype", help=f"Float format (repeatable, case-insensitive): {one_of(FORMAT_NAMES)}, or all; "
                                 "short forms such as bf16, fp16, e4m3fn are accepted."),
]
Plot = Annotated[Optional[Path], typer.Option("--plot", parser=path_given, metavar="<path>",
                                            help="Also draw the result as a PNG figure (needs the 'plot' extra).")]


def sections_option(names: tuple[str, ...]):
    return Annotated[Optional[list[str]], typer.Option("--section", help=f"{one_of(names)}, or all (repeatable; default all).")]


def not_with(given: dict[str, object], why: str) -> None:
    """Options the user gave that this run would not use are an error, not silently ignored."""
    used = [name for name, value in given.items() if value not in (None, [], ())]
    if used:
        raise InputError(f"{', '.join(used)} {'does' if len(used) == 1 else 'do'} not apply {why}")


def cap_in_format(name: str, value: float, fmt, why: str = "") -> float:
    """A cap the format holds as a normal number: below, a/c loses its digits or the cap rounds to 0;
    above, it rounds to inf. ``why``: what computes in ``fmt``."""
    from softcapgrad.core.checks import positive
    from softcapgrad.laws import formats

    positive(name, value)
    info = formats.finfo(fmt)
    lo, hi = float(info.smallest_normal), float(info.max)
    if not lo <= value <= hi:
        raise InputError(f"{name} {value:g}: {why or 'the cap is computed'} in {fmt.name}, "
                         f"whose normal numbers lie in [{lo:.4g}, {hi:.4g}]")
    return float(value)


def seed_in_range(seed: int | None) -> int:
    """torch and numpy generators take seeds in [0, 2^63)."""
    return bounded("--seed", 0 if seed is None else seed, 0, 2**63 - 1)


def bounded(option: str, value: int, low: int, high: int) -> int:
    if not low <= value <= high:
        raise InputError(f"{option} {value}: must lie in {low:,}..{high:,}")
    return value


def pick(option: str, given: list[str] | None, allowed, default: list[str] | None = None,
         former: dict | None = None) -> list[str]:
    """Repeatable choices, case-insensitive: 'all' means all of them; none given means ``default``; duplicates drop.
    ``former``: old spellings -> the names ``allowed`` holds now, accepted as those."""
    if not given:
        return list(allowed) if default is None else default
    if any(g.strip().lower() == "all" for g in given):
        return list(allowed)
    former = former or {}
    return list(dict.fromkeys(choice(option, former.get(value.strip().lower(), value), allowed) for value in given))


# --- running a computation -------------------------------------------------------------------


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """torch on one thread while the block runs (its engine children run one thread each), the former count
    restored after, however the block ends."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@contextlib.contextmanager
def _progress_on_stderr(show: bool, what: str) -> Iterator[None]:
    """A transient spinner (and the modules' progress bars) on stderr, for a terminal only."""
    if not show:
        yield
        return
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    from softcapgrad.core import progress

    bars = Progress(SpinnerColumn(), TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TimeRemainingColumn(),
                    console=Console(stderr=True), transient=True)

    @contextlib.contextmanager
    def reporter(description: str, total: float | None):
        task = bars.add_task(printable(description), total=total)  # a file's name, escaped as in the answer
        try:
            yield lambda n=1.0: bars.advance(task, n)
        finally:
            bars.remove_task(task)

    with bars, progress.reporting(reporter):
        bars.add_task(what, total=None)
        yield


DEFAULT_WIDTH, MIN_WIDTH = 100, 40


def output_width(isatty: bool, columns: str | None, terminal: int | None = None) -> int:
    """The width tables are laid out for: the terminal's (or COLUMNS') when it is a positive integer,
    else DEFAULT_WIDTH for a pipe or file; never below MIN_WIDTH, where a table folds into one
    record per row (a width of 0 or 5 would leave nothing readable)."""
    width = None
    if columns is not None and columns.strip().isdigit() and int(columns) > 0:
        width = int(columns)
    elif isatty and terminal:
        width = terminal
    return max(MIN_WIDTH, width or DEFAULT_WIDTH)


def _console():
    import shutil

    from rich.console import Console

    isatty = sys.stdout.isatty()
    terminal = shutil.get_terminal_size((0, 0)).columns if isatty else None
    width = output_width(isatty, os.environ.get("COLUMNS"), terminal)

    class _Console(Console):
        def on_broken_pipe(self) -> None:  # rich would exit 1 here; emit decides the exit code
            self.quiet = True
            raise BrokenPipeError

    return _Console(width=width, height=25, highlight=False, _environ={})


def emit(build: Callable[[], Report], json_out: bool, wide: bool = False, plot: Path | None = None,
         command: str = "") -> None:
    """Run a computation; print its report; bad input -> one line on stderr and exit 2.

    ``--plot`` is checked (extra installed, path writable) before the computation, so a bad
    path never costs the result.
    """
    from softcapgrad.core import replaced

    try:
        with replaced.record() as written:  # every result set put in place, for an interrupt's line
            if plot is not None:
                from softcapgrad.ledger import figures
                from softcapgrad.core.files import writable_target

                figures.check_plot_path(plot)
                writable_target(plot, "--plot")
            with _progress_on_stderr(sys.stderr.isatty() and not json_out, f"{PROG} {command}".strip()):
                report = build()
                if plot is not None:
                    written.append(figures.plot(report, plot))
    except InputError as err:
        typer.echo(f"{PROG}: error: {printable(str(err))}", err=True)  # a path or name from outside: escaped
        raise typer.Exit(2) from None
    except KeyboardInterrupt as err:
        from softcapgrad.core.files import Interrupted

        what = (err.message if isinstance(err, Interrupted) else
                f"{', '.join(map(str, written))} {'was' if len(written) == 1 else 'were'} written; nothing else"
                if written else "no file was written or changed")
        told = what.startswith(("interrupted", "terminated"))
        typer.echo(f"{PROG}: {what if told else 'interrupted; ' + what}", err=True)
        raise typer.Exit(128 + int(getattr(err, "signum", 2))) from None  # 130 for SIGINT, 143 for SIGTERM
    try:
        if json_out:
            typer.echo(as_json(report))
        else:
            render_table(report, _console(), wide=wide)
        sys.stdout.flush()
    except BrokenPipeError:
        raise typer.Exit(reader_gone()) from None
    except OSError as err:  # stdout on a full disk or /dev/full: the answer cannot be carried
        raise typer.Exit(stdout_unwritable(err)) from None
    if not report.ok:
        raise typer.Exit(report.exit_code)


def result_set(out: Path, texts: dict[str, str], figure: str, draw: Callable[[], object]) -> dict[Path, str | bytes]:
    """A command's result files in ``out``, for core/files.replace_all to put in place as one set: the texts, and
    ``figure``, drawn by ``draw``, as a PNG where matplotlib (an extra) is installed; without it, the texts alone."""
    from softcapgrad.core.plot import png_bytes, pyplot

    files: dict[Path, str | bytes] = {out / name: text for name, text in texts.items()}
    try:
        pyplot()
    except InputError:
        return files
    files[out / figure] = png_bytes(draw())
    return files


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


def earlier_results(path: Path) -> object:
    """The JSON of results that --update merges into, read before any work; one line and exit 2 when it cannot be."""
    import json

    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise InputError(f"--update: cannot read {path}: {err.strerror}") from None
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
        raise InputError(f"--update: {path} is not JSON") from None


def keep_fuller(path: Path, measured: dict[str, list[str]], advice: str) -> None:
    """Refuse, before any work, to write over results in ``path`` that hold more than this run measures: an
    engine or model type listed in its params under a key of ``measured`` that this run leaves out. Results
    that cannot be read hold nothing to keep."""
    import json

    try:
        params = json.loads(path.read_text(encoding="utf-8")).get("params")
    except (OSError, ValueError, RecursionError, AttributeError):
        return
    if not isinstance(params, dict):
        return
    left = [f"{key} {', '.join(map(str, sorted(set(params[key]) - set(now))))}" for key, now in measured.items()
            if isinstance(params.get(key), list) and set(map(str, params[key])) - set(now)]
    if left:
        raise InputError(f"--out {path} holds results for {'; '.join(left)} that this run does not measure: {advice}")
