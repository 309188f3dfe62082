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


def _one_line(result, *said):
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("softcapgrad: error:"), lines
    assert "Traceback" not in result.output and all(s in lines[0] for s in said), lines[0]
    return lines[0]


@pytest.mark.parametrize("release, said", [
    ("99.0.0", "outside the releases this command walks, 4.51.0 to 5.25.0"),
    ("4.0.0", "outside the releases this command walks, 4.51.0 to 5.25.0"),
    ("5.9.1", "not a release PyPI lists (yanked or never published); the nearest are 5.9.0 and 5.10.1"),
])
def test_parity_releases_refuses_a_release_it_cannot_walk_before_any_work(release, said, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from softcapgrad.cli.app import app
    from softcapgrad.engines.releases import releases

    assert (releases.RELEASES[0], releases.RELEASES[-1]) == ("4.51.0", "5.25.0")  # the range the docs give
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(releases, "walk", lambda *a, **k: pytest.fail("a release was walked"))
    result = CliRunner().invoke(app, ["parity-releases", "--release", "5.6.0", "--release", release,
                                      "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    _one_line(result, f"--release {release}:", said)
    assert list(tmp_path.iterdir()) == [], "nothing made in the cache or --out"


def test_parity_releases_takes_a_listed_release_as_pypi_spells_it():
    from softcapgrad.engines.releases import releases

    assert releases.listed("5.6") == "5.6.0" and releases.listed("4.51.0") == "4.51.0"


@pytest.mark.parametrize("what, said", [("missing", "no such file"), ("folder", "is a folder, not an interpreter"),
                                        ("plain", "not executable")])
def test_parity_python_is_checked_before_anything_else(what, said, tmp_path, monkeypatch):
    """A bad --python is one line before any model is built (it took ~18 s to be found)."""
    from typer.testing import CliRunner

    from softcapgrad.cli.app import app
    from softcapgrad.engines.forward import catalog
    from softcapgrad.models import audit

    (tmp_path / "folder").mkdir()
    (tmp_path / "plain").write_text("#!/bin/sh\n")
    def first(*args, **kwargs):
        pytest.fail("the run went past its paths")

    monkeypatch.setattr(audit, "source", first)
    monkeypatch.setattr(catalog, "engines", first)
    result = CliRunner().invoke(app, ["parity", "--engine", "onnx", "--python", str(tmp_path / what)])
    assert result.exit_code == 2, result.output
    _one_line(result, f"--python {tmp_path / what}: {said}")


def test_parity_with_no_engine_run_exits_no_verdict_not_0():
    """"No engine ran, so no cap was judged" is not a pass: exit 4 (NO_VERDICT), neither 1 nor 2."""
    import types

    import numpy as np
    import typer

    from softcapgrad.cli.common import emit, NO_VERDICT
    from softcapgrad.cli.parity_report import parity_report

    reference = types.SimpleNamespace(caps={"attention": 50.0, "final": 30.0}, reach={"attention": 4.0, "final": 4.0},
                                      scales={}, ids=np.arange(4), logits={"capped": np.zeros((4, 8))})
    rows = [{"engine": "onnx", "route": "fp32", "model": "gemma2", "cap": cap, "verdict": "could not run",
             "error": None, "error_off": None, "tolerance": None, "where": "", "reach": 4.0} for cap in reference.caps]
    engines = [{"engine": "onnx", "route": "fp32", "model": "gemma2", "cpu_s": 1.0, "wall_s": 1.0,
                "reason": "exit code -9", "did": "", "how": "fp32"}]
    ran_none = types.SimpleNamespace(model="gemma2", reference=reference, rows=rows, engines=engines,
                                     conditioning=None)
    report = parity_report([ran_none], {})
    assert report.answer[0].startswith("No engine ran, so no cap was judged")
    assert NO_VERDICT not in (0, 1, 2, 3) and not report.ok and report.exit_code == NO_VERDICT
    with pytest.raises(typer.Exit) as stopped:
        emit(lambda: report, json_out=True)
    assert stopped.value.exit_code == NO_VERDICT
    rows[0]["verdict"] = "applied"
    assert parity_report([ran_none], {}).ok


def test_scan_help_names_its_file_once():
    from typer.testing import CliRunner

    from softcapgrad.cli.app import app

    result = CliRunner().invoke(app, ["scan", "--help"])
    assert result.exit_code == 0 and "{{" not in result.output
    assert "scan [OPTIONS] {FILE}\n" in result.output and "\n  FILE  A .pt" in result.output, result.output


@pytest.mark.parametrize("values", [[1e308, -1e308, 1.0], [1.7976931348623157e308, -1e308, 1.0, float("inf")]])
def test_scan_of_float64_past_float32_warns_nothing_and_answers(values, tmp_path):
    """Values past float32's range (whose bins are float32) once printed numpy's RuntimeWarning with its source
    line, and float64's largest value made the bin edges NaN."""
    import json
    import warnings

    import numpy as np
    from typer.testing import CliRunner

    from softcapgrad.cli.app import app

    np.save(tmp_path / "big.npy", np.array(values))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning would be an internal error (exit 3)
        result = CliRunner().invoke(app, ["scan", str(tmp_path / "big.npy"), "--json"])
    assert result.exit_code == 0 and result.stderr == "", result.output
    data = json.loads(result.stdout)
    [row] = [r for r in data["dead"] if r["path"] == "torch-eager-cpu"]
    assert row["count"] == len(values) - 1, row  # every value but 1.0 lies in the dead zone
    assert data["answer"][0].startswith(f"{len(values) - 1} of {len(values)} values")


def test_a_killed_train_parity_runs_temporary_folder_is_cleared_by_the_next_run(tmp_path, monkeypatch):
    """train-parity's folder is named by its pid; one a SIGKILLed run left is removed at the next start once that
    pid is gone; a live run's and another prefix's are left alone."""
    import os
    import subprocess
    import tempfile

    from softcapgrad.engines.training import parity as train_parity

    gone = subprocess.Popen(["true"])
    gone.wait()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    left = tmp_path / f"softcapgrad-train-{gone.pid}-k1ll3d00"
    live = tmp_path / f"softcapgrad-train-{os.getppid()}-l1ve0000"
    other = tmp_path / f"softcapgrad-probe-{gone.pid}-0ther000"
    for folder in (left, live, other):
        (folder / "capped").mkdir(parents=True)
    seen = []

    def prepare(src, seq_len, seed, work):
        seen.append(work)
        raise KeyboardInterrupt  # stop where the run's work would begin

    monkeypatch.setattr(train_parity.tr, "prepare", prepare)
    with pytest.raises(KeyboardInterrupt):
        train_parity.measure(None, "gemma2", [], {}, 16, 0, 60.0)
    [work] = seen
    assert work.parent == tmp_path and work.name.startswith(f"softcapgrad-train-{os.getpid()}-")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, other.name])
