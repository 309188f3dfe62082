"""Strings read from outside (a file's tensor names, a server's model id) print with control characters escaped.

A tensor name holding ESC could clear the screen, a CR or LF could forge a line of the answer, and rich would read
``[red]`` as markup and ``:smile:`` as an emoji code. The renderer escapes every cell, title, note and answer
sentence once (``core/report.py``), so every command is covered, whatever it interpolates; ``--json`` escapes them
as JSON does and keeps the names as they are.
"""

import io
import json
import re

import numpy as np
import pytest
from typer.testing import CliRunner

from softcapgrad.cli.app import app
from softcapgrad.core.report import Report, Table, render_table

# every C0 control byte but the newline that ends a printed line, and DEL
RAW_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f]")

ESC_NAME = "a\x1b[2Jb"
NAMES = {
    ESC_NAME: "a\\x1b[2Jb",
    "line\nforged: 0 of 9 values": "line\\nforged: 0 of 9 values",
    "cr\rret": "cr\\rret",
    "bell\x07x": "bell\\x07x",
    "[red]markup[/]": "[red]markup[/]",
}


@pytest.fixture
def hostile_file(tmp_path):
    from safetensors.numpy import save_file

    path = tmp_path / "names.safetensors"
    # the ESC-named tensor has the most values past the horizon, so the answer sentence names it too
    tensors = {name: np.full((4, 4), 50.0, dtype=np.float32) for name in NAMES}
    tensors[ESC_NAME] = np.full((4, 4), 150.0, dtype=np.float32)
    save_file(tensors, str(path))
    return path


def test_scan_prints_hostile_tensor_names_escaped(hostile_file):
    result = CliRunner().invoke(app, ["scan", str(hostile_file), "--cap", "30", "--path", "eager-bf16"],
                                env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert not RAW_CONTROL.search(out), repr(out)
    for shown in NAMES.values():
        assert shown in out  # visible, escaped, and markup left as the characters it is
    assert f"the most dead values are in '{NAMES[ESC_NAME]}'" in out  # the answer sentence, not only the table
    assert not any(line.lstrip("│ ").startswith("forged") for line in out.splitlines())  # no line forged


def test_scan_json_keeps_the_names_and_escapes_them_as_json(hostile_file):
    result = CliRunner().invoke(app, ["scan", str(hostile_file), "--cap", "30", "--path", "eager-bf16", "--json"])
    assert result.exit_code == 0, result.stderr
    assert not RAW_CONTROL.search(result.stdout)
    assert set(NAMES) <= {r.get("name") for r in json.loads(result.stdout)["rows"]}


SERVER_ID = "tiny\x1b]0;owned\x07\r\nforged:[bold]x[/]:smile:"  # no space: a cell never wraps it at 100 columns
ESCAPED_ID = "tiny\\x1b]0;owned\\x07\\r\\nforged:[bold]x[/]:smile:"


def rendered(report: Report, width: int) -> str:
    from rich.console import Console

    buffer = io.StringIO()
    render_table(report, Console(file=buffer, width=width, highlight=False, _environ={}))
    return buffer.getvalue()


def hostile_report() -> Report:
    """A report as a server's model id would reach it: in the answer, a cell, a nested cell, a title and a note."""
    rows = [{"model": SERVER_ID, "tokens": 3, "seen": [SERVER_ID, {"id\n": 1}]},
            {"model": "plain", "tokens": 4, "seen": []}]
    return Report("parity", {}, (Table("rows", f"routes of {SERVER_ID}", rows),),
                  notes=(f"the server names its model {SERVER_ID}",), answer=(f"The server's model {SERVER_ID} answered.",))


@pytest.mark.parametrize("width", [100, 40])  # 40: the table folds into one block per row, cells cut to fit
def test_the_renderer_escapes_every_outside_string(width):
    out = rendered(hostile_report(), width)
    assert not RAW_CONTROL.search(out), repr(out)
    assert "😄" not in out  # an emoji code stays the characters it is
    assert not any(line.lstrip("│ ").startswith("forged") for line in out.splitlines())  # no line forged
    if width == 100:
        # the answer, the title, the cell, the nested list and the note, each escaped and whole
        assert out.count(ESCAPED_ID) == 5, out
        assert f"The server's model {ESCAPED_ID} answered." in out and "id\\n=1" in out


def test_printable_leaves_the_tools_own_text_alone():
    from softcapgrad.core.report import printable

    own = "a ≥ 104 · sech²(a/c) −∞ █ ±1 ×300 — ‘quoted’ 0.5–2"
    assert printable(own) is own
    assert printable("a\tb\u202ec\x00") == "a\\tb\\u202ec\\x00"


def test_a_bad_path_is_one_error_line_with_its_control_characters_escaped(tmp_path):
    name = tmp_path / "no\x1b[2Jsuch\nforged.npy"
    result = CliRunner().invoke(app, ["scan", str(name), "--cap", "30"])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and not RAW_CONTROL.search(result.stderr), repr(result.stderr)
    assert "no\\x1b[2Jsuch\\nforged.npy" in result.stderr


class _Terminal(io.StringIO):
    def isatty(self):  # rich draws its progress bars only on a terminal
        return True


def test_a_progress_line_naming_a_file_escapes_it(monkeypatch):
    from softcapgrad.cli.common import _progress_on_stderr
    from softcapgrad.core import progress

    terminal = _Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    with _progress_on_stderr(True, "softcapgrad scan"), progress.task("scanning a\x1b[2Jb[red]x[/]\nforged", 10) as advance:
        advance(5)
    out = terminal.getvalue()  # rich's own colour codes are in it; the name's are not
    assert "a\\x1b[2Jb[red]x[/]\\nforged" in out and "\x1b[2J" not in out and "\nforged" not in out
