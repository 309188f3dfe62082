"""census, parity and experiment replace their result sets (tables and figure) whole or not at all, and the one line
an interrupt prints says exactly what was written; parity --update checks the earlier results before it measures.

The computations are stubs (a census of no model type, a parity run of one row, an experiment of canned results):
what is under test is the writing, so each run takes a fraction of a second. Interrupts are real SIGINTs sent from
inside a write step (the step is known, so the test is deterministic), and one comes from outside a child process.
"""

import errno
import importlib.util
import json
import os
import pathlib
import signal
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from softcapgrad.core import files

pytest.importorskip("transformers")
needs_plot = pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None,
                                reason="the figure of a set needs the 'plot' extra")

CENSUS = ("census.json", "census.md", "figures/census.png")
PARITY = ("parity.json", "parity.md", "figures/parity.png")
OLD = b"old"
PNG = b"\x89PNG\r\n\x1a\n"


def _plant(out: Path, names) -> None:
    for name in names:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(OLD)


def _state(out: Path, names) -> list[str]:
    """'old' or 'new' per file of the set."""
    return ["old" if (out / n).read_bytes() == OLD else "new" for n in names]


def _listing(out: Path) -> list[str]:
    """Every file and folder under ``out``: a stage or temporary file left behind shows here."""
    return sorted(str(p.relative_to(out)) for p in out.rglob("*"))


def _replaced(out: Path, names) -> str:
    return ", ".join(str(out / n) for n in names)


def _sigint_at(monkeypatch, out: Path, k: int) -> None:
    """A real SIGINT to this process at the k-th rename under ``out`` (staged files, then the moves into place)."""
    real, seen = os.replace, []

    def replace(src, dst):
        if Path(dst).is_relative_to(out):
            seen.append(dst)
            if len(seen) == k:
                os.kill(os.getpid(), signal.SIGINT)
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)


@pytest.fixture(autouse=True)
def _python_sigint():
    """Ctrl-C as Python handles it in a terminal. A shell that starts a command in the background without job
    control (``cmd &`` in a script) makes it ignore SIGINT, and every process it starts inherits that: there the
    interrupts these tests send would do nothing."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _sigint(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGINT)


def _full_disk_on_png(monkeypatch) -> None:
    """The disk is full when the PNG's bytes are written (its staged or temporary file); text still goes."""
    real = pathlib.Path.write_bytes

    def write_bytes(self, data):
        if ".png" in self.name:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, data)

    monkeypatch.setattr(pathlib.Path, "write_bytes", write_bytes)


# --- census ------------------------------------------------------------------------------------------------------


@pytest.fixture()
def census_stub(monkeypatch):
    """census over no model type: the files are still the census's own (JSON, Markdown, figure)."""
    from softcapgrad.models import census

    empty = census.Census("5.24.0", "2.13.0", ("eager",), [])
    monkeypatch.setattr(census, "census", lambda *a, **k: empty)


def _census(cli, out: Path):
    return cli("census", "--model-type", "laguna", "--workers", "1", "--out", str(out))


BEFORE = "softcapgrad: interrupted before any file was replaced; 3 file(s) left as they were"


@needs_plot
@pytest.mark.parametrize("stage, k", [("staging", 1), ("staging", 2), ("staging", 3), ("checking", 0),
                                      ("moving", 4), ("moving", 5), ("moving", 6), ("after", 0)])
def test_an_interrupt_at_any_stage_of_census_leaves_one_whole_set_and_says_which(cli, tmp_path, monkeypatch,
                                                                                   census_stub, stage, k):
    _plant(tmp_path, CENSUS)
    if stage == "checking":  # between the last staged file and the first move
        monkeypatch.setattr(files, "_renamable", _sigint)
    elif stage == "after":  # the set is in place, the report not yet printed
        import softcapgrad.cli.census as command

        monkeypatch.setattr(command, "census_report", _sigint)
    else:
        _sigint_at(monkeypatch, tmp_path, k)
    code, _, out, err = _census(cli, tmp_path)
    assert code == 130 and out == "", err
    new = stage in ("moving", "after")
    assert _state(tmp_path, CENSUS) == ["new"] * 3 if new else ["old"] * 3
    said = {"moving": "softcapgrad: interrupted after all 3 file(s) were replaced (the set is whole): "
                      + _replaced(tmp_path, CENSUS),
            "after": f"softcapgrad: interrupted; {_replaced(tmp_path, CENSUS)} were written; nothing else"}
    assert err.strip() == said.get(stage, BEFORE)
    assert _listing(tmp_path) == ["census.json", "census.md", "figures", "figures/census.png"], "no stage left"
    if new:
        assert (tmp_path / "figures" / "census.png").read_bytes().startswith(PNG)
        assert json.loads((tmp_path / "census.json").read_text())["rows"] == []


@needs_plot
def test_census_on_a_disk_full_for_the_figure_replaces_nothing_and_says_so(cli, tmp_path, monkeypatch, census_stub):
    _plant(tmp_path, CENSUS)
    _full_disk_on_png(monkeypatch)
    code, _, out, err = _census(cli, tmp_path)
    assert code == 2 and out == "" and err.strip() == (
        f"softcapgrad: error: {tmp_path / 'figures' / 'census.png'}: cannot write (No space left on device); "
        "no file was replaced")
    assert _state(tmp_path, CENSUS) == ["old"] * 3
    assert _listing(tmp_path) == ["census.json", "census.md", "figures", "figures/census.png"]


@needs_plot
def test_census_names_only_the_files_it_wrote(cli, tmp_path, census_stub):
    code, _, out, err = cli("census", "--model-type", "laguna", "--workers", "1", "--out", str(tmp_path / "new"),
                            "--json")
    assert code == 0, err
    notes = json.loads(out)["notes"]
    assert notes[0] == "written: " + _replaced(tmp_path / "new", CENSUS)
    assert _listing(tmp_path / "new") == ["census.json", "census.md", "figures", "figures/census.png"]


CHILD = """
import os, signal, sys, time
from pathlib import Path
signal.signal(signal.SIGINT, signal.default_int_handler)  # as started from a terminal, whoever started the tests
from softcapgrad.models import census

out, k = Path(sys.argv[1]), int(sys.argv[2])
census.census = lambda *a, **kw: census.Census("5.24.0", "2.13.0", ("eager",), [])
real, seen = os.replace, []

def replace(src, dst):  # at the k-th rename under out: say so, then wait until the parent has sent its SIGINT
    if Path(dst).is_relative_to(out):
        seen.append(dst)
        if len(seen) == k:
            print("ready", flush=True)
            while not (out.parent / "sent").exists():
                time.sleep(0.01)
    real(src, dst)

os.replace = replace
from softcapgrad.cli.app import main
sys.argv = ["softcapgrad", "census", "--model-type", "laguna", "--workers", "1", "--out", str(out)]
main()
"""


@needs_plot
@pytest.mark.parametrize("k, signum, new", [(2, signal.SIGINT, False), (5, signal.SIGTERM, True)])
def test_a_signal_from_outside_during_census_writing(tmp_path, k, signum, new):
    """The reviewer's case: a signal from outside while the set is written (k = 2: the second staged file) or moved
    into place (k = 5: the second move; held until the set is whole)."""
    out = tmp_path / "results"
    out.mkdir()
    _plant(out, CENSUS)
    with subprocess.Popen([sys.executable, "-c", CHILD, str(out), str(k)], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout.readline().strip() == "ready"
            proc.send_signal(signum)
            (tmp_path / "sent").touch()
            _, err = proc.communicate(timeout=120)
        finally:
            proc.kill()
    assert proc.returncode == 128 + signum, err
    verb = "terminated" if signum == signal.SIGTERM else "interrupted"
    assert err.strip() == (f"softcapgrad: {verb} after all 3 file(s) were replaced (the set is whole): "
                           + _replaced(out, CENSUS) if new else BEFORE.replace("interrupted", verb))
    assert _state(out, CENSUS) == (["new"] * 3 if new else ["old"] * 3)
    assert _listing(out) == ["census.json", "census.md", "figures", "figures/census.png"]


# --- the writer: a move that fails puts the old set back ------------------------------------------------------


@pytest.mark.parametrize("existed", [True, False])
def test_a_move_that_fails_puts_back_the_files_moved_before_it(tmp_path, monkeypatch, existed):
    names = ("a.json", "a.md", "figures/a.png")
    if existed:
        _plant(tmp_path, names)
    real, moves = os.replace, []

    def replace(src, dst):
        if Path(dst).parent in (tmp_path, tmp_path / "figures") and not Path(dst).name.endswith(".tmp"):
            moves.append(dst)
            if len(moves) == 2:  # the second move into place: the first is already done
                raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(files.CannotWrite) as caught:
        files.replace_all({tmp_path / n: "new" for n in names}, tmp_path)
    assert str(caught.value) == f"{tmp_path / 'a.md'}: cannot write (Input/output error); no file was replaced"
    if existed:
        assert _state(tmp_path, names) == ["old"] * 3
        assert _listing(tmp_path) == ["a.json", "a.md", "figures", "figures/a.png"]
    else:
        assert _listing(tmp_path) == [], "the new name moved first is removed, and the folder made for the set"


# --- parity ------------------------------------------------------------------------------------------------------


@pytest.fixture()
def parity_env(tmp_path, monkeypatch):
    """No engine environment on disk but softcapgrad's own; parity's measurement replaced by one row of gemma2."""
    from softcapgrad.engines.forward import parity, parity_run

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    reference = types.SimpleNamespace(caps={"final": 30.0, "attention": 50.0}, reach={"final": 1.5}, scales={},
                                      ids=np.zeros(16, dtype=np.int64), logits={"capped": np.zeros((16, 8))})
    row = {"engine": "transformers", "route": "default", "model": "gemma2", "cap": "final", "verdict": "applied",
           "error": 0.001, "error_off": 0.5, "tolerance": 0.01, "where": None, "reach": 1.5, "max_logit": 20.0}
    engine = {"engine": "transformers", "route": "default", "model": "gemma2", "cpu_s": 1.0, "wall_s": 1.0,
              "reason": None, "did": "ran", "how": "eager", "versions": {"transformers": "5.24.0"}}
    calls = []

    def measure_all(sources, *args, **kwargs):
        calls.append(sources)
        return [parity.Parity("gemma2", reference, [dict(row)], [dict(engine)]) for _ in sources]

    monkeypatch.setattr(parity_run, "measure_all", measure_all)
    return calls


def _parity(cli, out: Path, *extra):
    return cli("parity", "--engine", "transformers", "--out", str(out), *extra)


@needs_plot
def test_an_interrupt_while_parity_stages_its_set_replaces_nothing(cli, tmp_path, monkeypatch, parity_env):
    out = tmp_path / "out"
    out.mkdir()
    _plant(out, PARITY)
    _sigint_at(monkeypatch, out, 2)
    code, _, _, err = _parity(cli, out)
    assert code == 130 and err.strip() == BEFORE and parity_env
    assert _state(out, PARITY) == ["old"] * 3
    assert _listing(out) == ["figures", "figures/parity.png", "parity.json", "parity.md"]


@needs_plot
def test_parity_on_a_disk_full_for_the_figure_replaces_nothing(cli, tmp_path, monkeypatch, parity_env):
    out = tmp_path / "out"
    out.mkdir()
    _plant(out, PARITY)
    _full_disk_on_png(monkeypatch)
    code, _, _, err = _parity(cli, out)
    assert code == 2 and err.strip() == (f"softcapgrad: error: {out / 'figures' / 'parity.png'}: cannot write (No "
                                         "space left on device); no file was replaced")
    assert _state(out, PARITY) == ["old"] * 3


@needs_plot
def test_parity_writes_its_set_whole_and_names_it(cli, tmp_path, parity_env):
    code, _, out, err = _parity(cli, tmp_path / "out", "--json")
    assert code == 0, err
    assert json.loads(out)["notes"][0] == "written: " + _replaced(tmp_path / "out", PARITY)
    assert (tmp_path / "out" / "figures" / "parity.png").read_bytes().startswith(PNG)
    assert [r["verdict"] for r in json.loads((tmp_path / "out" / "parity.json").read_text())["rows"]] == ["applied"]


PARAMS = {"seed": 0, "seq_len": 16, "set": []}
GOOD_ROW = {"engine": "onnx", "route": "default", "model": "gemma2", "cap": "final", "verdict": "applied",
            "error": 0.0, "error_off": 0.5, "tolerance": 0.01, "where": None}


@pytest.mark.parametrize("change, said", [
    ({"rows": ["applied"]}, "rows[0] is not an object"),
    ({"rows": [{k: v for k, v in GOOD_ROW.items() if k != "verdict"}]}, "rows[0] has no 'verdict'"),
    ({"rows": [{**GOOD_ROW, "hint": None}]}, "rows[0] holds 'hint' as NoneType"),
    ({"rows": [{**GOOD_ROW, "outside": "far"}]}, "rows[0] holds 'outside' as str"),
    ({"models": [{"model": "gemma2", "reach": [1.5], "caps": {}, "tokens": 16, "vocabulary": 8}]},
     "models[0] holds 'reach' as list"),
    ({"engines": [{"engine": "onnx", "route": "default", "model": "gemma2", "did": "", "how": ""}]},
     "engines[0] has no 'versions'"),
    ({"params": {**PARAMS, "updated": "twice"}}, "params holds 'updated' but not as a list"),
])
def test_update_refuses_malformed_earlier_results_before_measuring(cli, tmp_path, parity_env, change, said):
    out = tmp_path / "out"
    out.mkdir()
    earlier = {"params": PARAMS, "models": [], "rows": [], "engines": [], **change}
    (out / "parity.json").write_text(json.dumps(earlier), encoding="utf-8")
    code, _, stdout, err = _parity(cli, out, "--update")
    assert code == 2 and stdout == "" and err.strip() == (
        f"softcapgrad: error: --update: {out / 'parity.json'} cannot be merged into: {said}")
    assert parity_env == [], "nothing was measured"
    assert json.loads((out / "parity.json").read_text()) == earlier and _listing(out) == ["parity.json"]


def test_update_merges_well_formed_earlier_results(cli, tmp_path, parity_env):
    out = tmp_path / "out"
    out.mkdir()
    earlier = {"params": PARAMS, "rows": [GOOD_ROW], "engines": [], "models": [
        {"model": "gemma2", "reach": {"final": 1.5}, "caps": {"final": 30.0}, "tokens": 16, "vocabulary": 8}]}
    (out / "parity.json").write_text(json.dumps(earlier), encoding="utf-8")
    code, _, _, err = _parity(cli, out, "--update")
    assert code == 0, err
    rows = json.loads((out / "parity.json").read_text())["rows"]
    assert [(r["engine"], r["verdict"]) for r in rows] == [("transformers", "applied"), ("onnx", "applied")]


# --- experiment --------------------------------------------------------------------------------------------------


@needs_plot
def test_an_interrupt_after_the_experiment_set_names_it(cli, tmp_path, monkeypatch):
    """experiment staged its set whole already; an interrupt after the set was in place said nothing was written."""
    from softcapgrad.core.plot import pyplot
    from softcapgrad.experiments import figure, report, runner

    monkeypatch.setattr(runner, "measure", lambda *a, **k: None)
    monkeypatch.setattr(report, "results", lambda measured: {"rows": []})
    monkeypatch.setattr(report, "markdown", lambda res, design: "# experiment\n")
    monkeypatch.setattr(figure, "experiment_figure", lambda res: pyplot().figure())
    monkeypatch.setattr(report, "experiment_report", _sigint)
    names = ("experiment.json", "experiment.md", "figures/experiment.png")
    _plant(tmp_path, names)
    code, _, _, err = cli("experiment", "--quick", "--out", str(tmp_path), "--force")
    assert code == 130 and err.strip() == f"softcapgrad: interrupted; {_replaced(tmp_path, names)} were written; nothing else"
    assert _state(tmp_path, names) == ["new"] * 3
