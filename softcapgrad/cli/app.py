"""The ``softcapgrad`` command line: every subcommand, in the order ``--help`` lists them.

Each subcommand parses its options, calls one lower layer and renders the Report it returns
(softcapgrad.cli.common.emit). The commands live beside this file by layer: laws, stacks, demos,
models, engines, ledger.
"""

import contextlib
import os
import sys

from softcapgrad.cli import census, demos, engines, experiments, ledger, laws, models, stacks
from softcapgrad.cli.common import PROG, app, reader_gone, stdout_closed

app.command()(laws.identity)
app.command()(laws.ratchet)
app.command()(laws.knee)
app.command()(laws.horizon)
app.command()(stacks.stacks)
app.command()(laws.dynamics)
app.command("gate-demo")(demos.gate_demo)
app.command("tether-demo")(demos.tether_demo)
app.command()(models.scan)
app.command()(ledger.reproduce)
app.command("audit-model")(models.audit_model)
app.command()(census.census)
app.command()(experiments.experiment)
app.command()(engines.parity)
app.add_typer(engines.engines_app, name="engines")


def main() -> None:
    if stdout_closed():
        print(f"{PROG}: error: standard output is closed; nothing can carry the answer (run it without >&-)",
              file=sys.stderr)
        os._exit(2)
    try:
        app(prog_name=PROG)
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
