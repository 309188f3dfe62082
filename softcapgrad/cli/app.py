"""The ``softcapgrad`` command line: every subcommand, in the order ``--help`` lists them.

Each subcommand parses its options, calls one lower layer and renders the Report it returns
(softcapgrad.cli.common.emit). The commands live beside this file by layer: laws, stacks, demos,
models, engines, ledger.

``app`` (read as ``from softcapgrad.cli.app import app``) is the whole command table. A run that names its
command first (``softcapgrad knee ...``) builds a table of that one command instead: it imports only that
command's module, and the parser builds the options of one command rather than of every one, which is part of
every command's start (``--help``, an option first or an unknown name get the whole table).
"""

import contextlib
import copy
import importlib
import io
import os
import sys

from softcapgrad.cli.common import PROG, reader_gone, stdout_closed

# (name, module of softcapgrad.cli, attribute), in the order --help lists them; a module's Typer is a group
COMMANDS = (
    ("identity", "laws", "identity"), ("ratchet", "laws", "ratchet"), ("knee", "laws", "knee"),
    ("horizon", "laws", "horizon"), ("stacks", "stacks", "stacks"), ("dynamics", "laws", "dynamics"),
    ("gate-demo", "demos", "gate_demo"), ("tether-demo", "demos", "tether_demo"), ("scan", "models", "scan"),
    ("reproduce", "ledger", "reproduce"), ("audit-model", "models", "audit_model"), ("census", "census", "census"),
    ("experiment", "experiments", "experiment"), ("tether-experiment", "experiments", "tether_experiment"),
    ("parity", "engines", "parity"), ("train-parity", "train", "train_parity"),
    ("parity-releases", "releases", "parity_releases"), ("page", "page", "page"),
    ("engines", "engines", "engines_app"),
)


def _add(table, name: str, module: str, attribute: str) -> None:
    import typer

    command = getattr(importlib.import_module(f"softcapgrad.cli.{module}"), attribute)
    if isinstance(command, typer.Typer):
        table.add_typer(command, name=name)
    else:
        table.command(name)(command)


def _whole():
    """The app with every command, registered once."""
    from softcapgrad.cli.common import app

    if not app.registered_commands and not app.registered_groups:
        for entry in COMMANDS:
            _add(app, *entry)
    return app


def _for(args: list[str]):
    """The table a run with these arguments needs: its one command when it names a known one first."""
    from softcapgrad.cli.common import app

    entry = next((e for e in COMMANDS if args[:1] == [e[0]]), None)
    if entry is None:
        return _whole()
    one = copy.copy(app)  # the same settings and --version callback, a table of its own
    one.registered_commands, one.registered_groups = [], []
    _add(one, *entry)
    return one


def __getattr__(name: str):
    if name == "app":
        return _whole()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    if sys.stderr is None:  # started with stderr closed (2>&-): its lines go nowhere, the exit code still tells
        sys.stderr = io.StringIO()
    if stdout_closed():
        print(f"{PROG}: error: standard output is closed; nothing can carry the answer (run it without >&-)",
              file=sys.stderr)
        os._exit(2)
    try:
        _for(sys.argv[1:])(prog_name=PROG)
        code = 0
    except SystemExit as done:
        code = done.code
    except BrokenPipeError:
        code = reader_gone()
    try:
        sys.stdout.flush()  # here, not at the interpreter's exit, so a reader that left is seen
    except BrokenPipeError:
        code = reader_gone()
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
