"""The app's own parameters, by kind, for the tests that check every option: read from typer's click command."""

import typer.main

from softcapgrad.cli.app import app
from softcapgrad.cli.limits import path_given


def leaves(command=None, prefix=()):
    """(words, command) for each command that runs, ``engines install`` as ("engines", "install")."""
    command = typer.main.get_command(app) if command is None else command
    subcommands = getattr(command, "commands", None)
    if subcommands is None:
        yield prefix, command
        return
    for name, sub in sorted(subcommands.items()):
        yield from leaves(sub, (*prefix, name))


def kind(param) -> str:
    """int, float (each of a pair too), path (as typer types it, or read by path_given), or ''."""
    names = {type(t).__name__ for t in getattr(param.type, "types", [param.type])}
    if names <= {"IntParamType"}:
        return "int"
    if names <= {"FloatParamType"}:
        return "float"
    if getattr(param.type, "func", None) is path_given or names & {"TyperPath", "Path"}:
        return "path"
    return ""


def params(wanted: str) -> list:
    return [(words, p) for words, command in leaves() for p in command.params if kind(p) == wanted]


def label(param) -> str:
    """What a one-line error calls the parameter: its option, or an argument's metavar."""
    return param.opts[0] if param.param_type_name == "option" else param.human_readable_name
