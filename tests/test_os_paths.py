"""Names the operating system refuses are one line and exit 2, for every path the command line takes.

The path parameters are read from the app itself (every one is parsed by softcapgrad.cli.limits.path_given),
so a new path option is covered the day it is added.
"""

import os
import subprocess
import sys

import pytest

from cliparams import label, params
from softcapgrad.cli.app import app
from softcapgrad.cli.limits import path_given
from softcapgrad.core.checks import InputError, usable_path

PATHS = params("path")


def test_the_path_parameters_are_found():
    found = {(" ".join(w), label(p)) for w, p in PATHS}
    assert {("scan", "FILE"), ("audit-model", "[directory]"), ("audit-model", "--inputs"), ("experiment", "--model"),
            ("experiment", "--out"), ("census", "--out"), ("parity", "--out"), ("reproduce", "--out"),
            ("stacks", "--record"), ("identity", "--plot")} <= found, found
    assert all(getattr(p.type, "func", None) is path_given for _, p in PATHS), "every path is read by path_given"


def _bad_names(folder):
    (folder / "a-file").write_text("a regular file")
    return {
        "a name over the file system's limit": ("x" * 300 + ".npy", "a name in it is 304 bytes long; at most 255"),
        "a path over PATH_MAX": ("d/" * 2100 + "x.npy", "the path is 4,205 bytes long; at most 4,095"),
        "an undecodable byte": ("bad-\udcff.npy", "not a valid utf-8 name"),
        "a lone surrogate": ("bad-\ud800.npy", "not a valid utf-8 name"),
        "a NUL byte": ("bad\0.npy", "holds a NUL byte"),
        "an empty path (as a Path, the working folder)": ("", "an empty path names no file or folder"),
        "a path through a regular file": ("a-file/x.npy", "a-file is a file, not a folder"),
    }


@pytest.mark.parametrize("words, param", PATHS,
                         ids=lambda x: " ".join(x) if isinstance(x, tuple) else (x.opts or [x.name])[0])
def test_every_path_refuses_what_the_os_refuses(words, param, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    for what, (name, said) in _bad_names(tmp_path).items():
        given = [name] if param.param_type_name == "argument" else [param.opts[0], name]
        result = runner.invoke(app, [*words, *given])
        lines = result.stderr.strip().splitlines()
        assert result.exit_code == 2, (words, what, result.exit_code, result.stderr)
        assert len(lines) == 1 and lines[0].startswith("softcapgrad: error:"), (words, what, lines)
        assert label(param) in lines[0] and said in lines[0], (words, what, lines[0])
        assert result.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"], "nothing was written"


def test_the_command_line_refuses_them_too(tmp_path):
    """Through a real argv: a 300-byte file name to scan (once an internal error) and a name with a byte that is
    not UTF-8 (it arrives as a surrogate escape), each one line and exit 2."""
    for name in (b"x" * 300 + b".npy", b"bad-\xff.npy"):
        done = subprocess.run([os.fsencode(sys.executable), b"-m", b"softcapgrad", b"scan", name], cwd=tmp_path,
                              capture_output=True, timeout=120)
        err = done.stderr.decode(errors="replace").strip().splitlines()
        assert done.returncode == 2 and len(err) == 1 and err[0].startswith("softcapgrad: error: scan:"), (name, err)
        assert done.stdout == b""


def test_usable_path_takes_what_the_os_takes(tmp_path):
    (tmp_path / "a-file").write_text("x")
    assert usable_path("--out", str(tmp_path / "new" / "folder")) == tmp_path / "new" / "folder"
    assert usable_path("--out", tmp_path / "a-file") == tmp_path / "a-file"
    assert usable_path("--out", "x" * 255) == usable_path("", "x" * 255)  # a name at the limit is a name
    with pytest.raises(InputError, match=r"^--out .*a-file is a file, not a folder$"):
        usable_path("--out", tmp_path / "a-file" / "deeper" / "x.json")


def test_the_library_reader_refuses_them_in_one_line(tmp_path):
    from softcapgrad.core.files import readable_file

    with pytest.raises(InputError, match="a name in it is 304 bytes long"):
        readable_file(tmp_path / ("x" * 300 + ".npy"), (".npy",), "FILE")
