"""Where the output goes: odd COLUMNS, a closed stdout or a reader that leaves, the umask, narrow
terminals, and reproduce replacing its files as one set or not at all.

The command line runs in a child process where the shell's plumbing matters (pipes, closed
descriptors, umask), in-process elsewhere.
"""

import json
import os
import signal
import stat
import subprocess
import sys

import pytest

from softcapgrad.core import files

RUN = [sys.executable, "-m", "softcapgrad"]


@pytest.mark.parametrize("columns", ["0", "-3", "abc", "", "5", "100000"])
def test_odd_columns_still_print_the_answer(cli, columns):
    code, _, stdout, stderr = cli("ratchet", env={"COLUMNS": columns})
    assert code == 0 and stderr == ""
    assert stdout.startswith("To express z = 0.9c")
    assert "44.17" in stdout and "0.190000000" in stdout  # the answer and the table's numbers


def test_width_rules():
    from softcapgrad.cli.common import DEFAULT_WIDTH, MIN_WIDTH, output_width

    assert output_width(False, None) == output_width(False, "0") == output_width(False, "x") == DEFAULT_WIDTH
    assert output_width(False, "5") == MIN_WIDTH and output_width(False, "80") == 80
    assert output_width(True, None, 132) == 132 and output_width(True, "90", 132) == 90


def test_a_closed_stdout_is_one_line_and_exit_2():
    import shlex

    proc = subprocess.run(["/bin/sh", "-c", f"exec {shlex.join([*RUN, 'ratchet'])} >&-"], stderr=subprocess.PIPE,
                          text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "standard output is closed" in proc.stderr


@pytest.mark.parametrize("args", [["knee", "--dtype", "all"], ["ratchet"], ["stacks"]])
def test_a_reader_that_leaves_ends_the_run_quietly_with_sigpipe_status(args):
    """`| head -1`: the reader closes the pipe after one line; exit 141 as a filter killed by SIGPIPE, no traceback."""
    child = subprocess.Popen([*RUN, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "COLUMNS": "100"})
    first = child.stdout.readline()
    child.stdout.close()
    err = child.stderr.read().decode()
    child.stderr.close()
    code = child.wait(timeout=300)
    assert first and code in (0, 141), (code, err)  # 0 when the whole output fit the pipe before it closed
    assert err == ""


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_files_keep_the_umask(tmp_path, mask, mode):
    old = os.umask(mask)
    try:
        files.write_atomic(tmp_path / "a.txt", "x")
        assert stat.S_IMODE((tmp_path / "a.txt").stat().st_mode) == mode
        files.replace_all({tmp_path / "out" / "b.txt": "y", tmp_path / "out" / "sub" / "c.txt": b"z"}, tmp_path / "out")
        assert stat.S_IMODE((tmp_path / "out" / "b.txt").stat().st_mode) == mode
        assert stat.S_IMODE((tmp_path / "out" / "sub").stat().st_mode) == 0o777 & ~mask
    finally:
        os.umask(old)


def test_plot_keeps_the_umask(tmp_path):
    pytest.importorskip("matplotlib")
    proc = subprocess.run(f"umask 022 && exec {sys.executable} -m softcapgrad ratchet --plot {tmp_path / 'r.png'}",
                          shell=True, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE((tmp_path / "r.png").stat().st_mode) == 0o644


@pytest.mark.parametrize("argv", [["stacks"], ["horizon", "--path", "all"], ["knee", "--dtype", "all", "--backend", "all"]])
def test_tables_wrap_or_fold_at_80_columns_never_crop(cli, argv):
    code, _, stdout, stderr = cli(*argv, env={"COLUMNS": "80"})
    assert code == 0, stderr
    lines = stdout.splitlines()
    assert max(len(line) for line in lines) <= 80 and "…" not in stdout
    data = cli(*argv, "--json")[1]
    for row in data["rows"]:  # every path a table row names is printed whole
        name = row.get("path") or row.get("dtype")
        if name:
            assert name in stdout


def test_a_table_too_wide_to_wrap_folds_one_block_per_row():
    from rich.console import Console

    from softcapgrad.core.report import Report, Table, render_table

    rows = [{f"column_{i}": 1234567.25 + i for i in range(8)} for _ in range(2)]
    console = Console(width=40, record=True, height=25, _environ={})
    render_table(Report("x", {}, (Table("rows", "t", rows),)), console)
    text = console.export_text()
    assert "row 1 of 2" in text and "row 2 of 2" in text and text.count("│ 1,234,567 │") == 2
    assert max(len(line) for line in text.splitlines()) <= 40


# --- reproduce: the whole set or none ---------------------------------------------------------------


def test_reproduce_checks_every_target_before_computing(cli, tmp_path):
    (tmp_path / "figures").write_text("a file where the figures folder goes")
    (tmp_path / "claims.json").write_text("old")
    code, _, out, err = cli("reproduce", "--out", str(tmp_path))
    assert code == 2 and out == "" and "figures" in err and len(err.strip().splitlines()) == 1
    assert (tmp_path / "claims.json").read_text() == "old", "nothing was replaced"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in a read-only folder")
def test_reproduce_refuses_a_read_only_figures_folder_first(cli, tmp_path):
    (tmp_path / "figures").mkdir(mode=0o555)
    code, _, _, err = cli("reproduce", "--out", str(tmp_path))
    assert code == 2 and "cannot write" in err and not (tmp_path / "claims.json").exists()


def _partial(cli, out):
    return cli("reproduce", "--out", str(out), "--only", "^attenuation", "--force")


def test_an_interrupt_while_writing_replaces_nothing(cli, tmp_path, monkeypatch):
    for name in ("claims.json", "claims.md", "claims.raw.json"):
        (tmp_path / name).write_text("old")
    real, calls = files.write_atomic, []

    def second_fails(path, data):
        calls.append(path)
        if len(calls) == 2:
            raise KeyboardInterrupt
        real(path, data)

    monkeypatch.setattr(files, "write_atomic", second_fails)
    code, _, _, err = _partial(cli, tmp_path)
    assert code == 130
    assert err.strip() == "softcapgrad: interrupted before any file was replaced; 3 file(s) left as they were"
    assert all((tmp_path / n).read_text() == "old" for n in ("claims.json", "claims.md", "claims.raw.json"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["claims.json", "claims.md", "claims.raw.json"], "no stage left"


def test_an_interrupt_while_moving_is_held_until_the_set_is_whole(cli, tmp_path, monkeypatch):
    real = os.replace
    sent = []

    def interrupt_first(src, dst):
        if not sent and os.path.dirname(dst) == str(tmp_path):  # the first move into place, not a staged write
            sent.append(dst)
            os.kill(os.getpid(), signal.SIGINT)
        real(src, dst)

    monkeypatch.setattr(files.os, "replace", interrupt_first)
    code, _, _, err = _partial(cli, tmp_path)
    assert code == 130
    assert err.strip() == ("softcapgrad: interrupted after all 3 file(s) were replaced (the set is whole): "
                           + ", ".join(str(tmp_path / n) for n in ("claims.json", "claims.md", "claims.raw.json")))
    assert json.loads((tmp_path / "claims.json").read_text())["claims"] == 3
    assert not [p for p in tmp_path.parent.iterdir() if p.name.startswith(f".{tmp_path.name}.")], "the stage is gone"


def test_reproduce_stages_inside_its_target_folder(cli, tmp_path, monkeypatch):
    seen = []
    real = files.tempfile.mkdtemp
    monkeypatch.setattr(files.tempfile, "mkdtemp", lambda **kw: seen.append(kw["dir"]) or real(**kw))
    code, _, _, _ = _partial(cli, tmp_path / "out")
    assert code == 0 and seen == [tmp_path / "out"]  # the ledger's own folder: its own file system
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["claims.json", "claims.md", "claims.raw.json"]
