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

# (name, module of softcapgrad.cli, attribute, the one line --help gives it), in the order --help lists them; a
# module's Typer is a group. Each line is whole at 100 columns (tests/test_cli_help.py): a command's docstring says
# more in its own --help.
COMMANDS = (
    ("identity", "laws", "identity", "Is dz/da = sech²(a/c) exact against autograd; the attenuation at a = kc."),
    ("ratchet", "laws", "ratchet", "How large a must be to express z = f·c, and how small the gradient is there."),
    ("knee", "laws", "knee", "Where tanh or a sigmoid is stored as exactly 1.0, format by format."),
    ("horizon", "laws", "horizon", "From which pre-cap input the gradient through the cap is exactly 0."),
    ("stacks", "stacks", "stacks", "The real stacks: what each computes, measured here or recorded."),
    ("dynamics", "laws", "dynamics", "How many more descent steps the cap costs to fix a confident wrong logit."),
    ("gate-demo", "demos", "gate_demo", "Softmax against softplus gates, their backward laws, Laguna's gate."),
    ("tether-demo", "demos", "tether_demo", "Does TetherGate hold open a gate that a plain learned gate lets close?"),
    ("scan", "models", "scan", "Do the pre-cap values in a file reach each path's dead zone?"),
    ("reproduce", "ledger", "reproduce", "Recompute every document number and figure; exit 1 if a verdict changed."),
    ("audit-model", "models", "audit_model", "Which soft-caps a transformers model applies, where, and what is dead."),
    ("census", "census", "census", "Every soft-cap and gate of the installed transformers, model by model."),
    ("experiment", "experiments", "experiment", "Does the bf16 dead zone cost training steps, and does the patch help?"),
    ("tether-experiment", "experiments", "tether_experiment",
     "Does the TetherGate patch keep gates open while their branch is useless?"),
    ("parity", "engines", "parity", "Do a model's soft-caps survive each engine: a verdict per cap and route."),
    ("train-parity", "train", "train_parity", "Does training keep the caps: one step per route against float64."),
    ("parity-releases", "releases", "parity_releases", "transformers' default attention on Gemma 2, release by release."),
    ("incidents", "incidents", "incidents", "The public soft-cap incidents, replayed before and after each fix."),
    ("page", "page", "page", "The results as one static page: a matrix per model type, opens from file://."),
    ("engines", "engines", "engines_app",
     "Every engine environment of parity and train-parity: state, versions, size."),
)


def _add(table, name: str, module: str, attribute: str, summary: str) -> None:
    import typer

    command = getattr(importlib.import_module(f"softcapgrad.cli.{module}"), attribute)
    if isinstance(command, typer.Typer):
        table.add_typer(command, name=name, short_help=summary)
    else:
        table.command(name, short_help=summary)(command)


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
