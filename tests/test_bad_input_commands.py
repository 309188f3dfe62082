"""Bad input to the newer commands: one line and exit 2 (or the documented code), before any work."""

from pathlib import Path

import pytest

from cliparams import leaves


def _outs():
    return [(words, command, p) for words, command in leaves() for p in command.params if "--out" in p.opts]


def test_out_none_writes_nothing_for_every_command():
    """``--out none`` (any case) is no --out for every command that has one; any other name is a folder."""
    found = {" ".join(words) for words, _, _ in _outs()}
    assert {"parity", "train-parity", "parity-releases", "tether-experiment", "experiment", "census",
            "reproduce"} <= found, found
    for words, command, param in _outs():
        for given, expected in (("none", None), ("NONE", None), ("results-x", Path("results-x"))):
            ctx = command.make_context(" ".join(words), ["--out", given])
            assert ctx.params[param.name] == expected, (words, given, ctx.params[param.name])
