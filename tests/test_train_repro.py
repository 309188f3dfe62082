"""train-parity --repro DIR: a bundle per training route with a finding, whose script takes the library's step and
places it among the float64 references without softcapgrad.

The main environment's transformers keeps both caps on every route, so no route of it has a finding to bundle: the
measurement is planted. Its reference is real (parity's tiny Gemma 2 and its float64 steps) with two labels
exchanged: the model with both caps is filed as "attention off" and the other way round, so a library that keeps
the attention cap looks, to the references, like one that drops it. The rows say so ("ignored"), and the bundle's
script, taking transformers' real loop-default step in a child where softcapgrad cannot be imported, must say the
same from the data alone."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from softcapgrad.cli.app import app
from softcapgrad.engines.repro import report as report_md, repro

pytest.importorskip("transformers")

ROUTE = "loop-default"
SEQ = 16  # train-parity's default: past the tiny model's sliding window, so that dropping it shows


@pytest.fixture(scope="module")
def relabelled(tmp_path_factory):
    from softcapgrad.engines.forward import modeltypes, reference
    from softcapgrad.engines.training import reference as tr
    from softcapgrad.models import audit

    src = audit.source(None, modeltypes.model_type("gemma2"), reference.tiny_sets("gemma2"))
    real, _ = tr.prepare(src, SEQ, 0, tmp_path_factory.mktemp("train-ref"))
    steps = {**real.steps, "capped": real.steps["attention off"], "attention off": real.steps["capped"]}
    return dataclasses.replace(real, steps=steps)


@pytest.fixture()
def planted(relabelled, monkeypatch):
    from softcapgrad.engines.training import parity as run, verdict as tv

    def measure(src, label, names, states, n, s, timeout, advance=None, jobs=1, given=None):
        base = {"engine": names[0], "route": ROUTE, "model": label, "precision": "fp32", "versions": "transformers",
                "forward_cell": "attention off", "loss_cell": "attention off", "forward_error": 0.0,
                "forward_tolerance": 1e-4, "grad_error": 0.0, "grad_tolerance": 1e-5, "grad_where": ""}
        rows = [{**base, "cap": "attention", "c": 50.0, "verdict": tv.IGNORED,
                 "hint": "the returned logits match the reference attention off (within tolerance)"},
                {**base, "cap": "final", "c": 30.0, "verdict": tv.APPLIED, "hint": ""}]
        info = {"engine": names[0], "route": ROUTE, "how": "loss.backward() without Trainer (fp32)",
                "precision": "fp32", "environment": "main", "versions": {"torch": "2.13.0+cpu"}, "did": "",
                "cpu_s": 1.0, "wall_s": 1.0, "reason": None, "model": label}
        return run.TrainParity(label, relabelled, rows, [info])

    monkeypatch.setattr(run, "measure", measure)


def _train(*args):
    return CliRunner().invoke(app, ["train-parity", "--engine", "transformers", "--model-type", "gemma2",
                                    "--seq-len", str(SEQ), *args])


@pytest.mark.slow
def test_a_training_bundle_takes_the_step_without_softcapgrad_and_reports_the_finding(planted, tmp_path):
    result = _train("--repro", str(tmp_path / "b"), "--json")
    assert result.exit_code == 0, result.output
    bundle = tmp_path / "b" / f"gemma2--transformers--{ROUTE}"
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["INDEX.md", bundle.name]
    assert str(bundle) in result.stdout  # the report names the bundle written
    assert sorted(p.name for p in bundle.iterdir()) == ["REPORT.md", "adapter", "bundle.json", "capped", "ids.npy",
                                                        "reference", "reproduce.py", "requirements.txt"]
    assert {p.name for p in (bundle / "adapter").iterdir()} == {"adapter_train_transformers.py", "adapter_protocol.py",
                                                                "adapter_transformers_load.py"}
    data = json.loads((bundle / "bundle.json").read_text(encoding="utf-8"))
    assert [(c["cap"], c["recorded"], c["expect"]) for c in data["caps"]] == [("attention", "ignored", "ignored")]
    for path in (bundle / "reference").iterdir():  # data, readable without pickle
        with np.load(path, allow_pickle=False) as held:
            assert "loss" in held.files and "logits" in held.files
    code = (bundle / "reproduce.py").read_text(encoding="utf-8")
    imported = {a.name.split(".")[0] for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Import) for a in n.names}
    assert "softcapgrad" not in code and imported <= {"os", "json", "sys", "runpy", "shutil", "tempfile", "pathlib",
                                                      "numpy"}
    pins = (bundle / "requirements.txt").read_text(encoding="utf-8")
    from importlib import metadata

    assert {f"{n}=={metadata.version(n)}" for n in ("torch", "transformers", "accelerate", "numpy")} <= set(
        pins.splitlines())
    report = (bundle / "REPORT.md").read_text(encoding="utf-8")
    assert "## The attention cap (c = 50.0): ignored" in report
    assert report_md.commands(report)[0] == f"pip install --extra-index-url {repro.TORCH_CPU_INDEX} -r requirements.txt"

    moved = shutil.copytree(bundle, tmp_path / "elsewhere")  # stands alone: nothing points back at the run
    blocked = ("import runpy, sys; sys.modules['softcapgrad'] = None; sys.argv = ['reproduce.py', '--json']; "
               "runpy.run_path('reproduce.py', run_name='__main__')")  # softcapgrad cannot be imported there
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "HF_HOME": str(tmp_path / "hf")}
    run = subprocess.run([sys.executable, "-I", "-c", blocked], cwd=moved, capture_output=True, text=True,
                         timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout)["caps"]
    assert [(g["cap"], g["verdict"], g["recorded"], g["reproduced"]) for g in got] == [
        ("attention", "ignored", "ignored", True)]
    assert got[0]["forward_cell"] == got[0]["loss_cell"] == "attention off"  # the model with both caps, relabelled
    assert got[0]["forward_error"] <= data["tolerance"]["forward"]
    assert sorted(p.name for p in moved.iterdir()) == sorted(p.name for p in bundle.iterdir())  # its work removed


def test_repro_refuses_a_folder_that_holds_something_before_any_work(tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine", encoding="utf-8")
    result = _train("--repro", str(full))
    assert result.exit_code == 2 and "exists and is not empty" in result.output
    assert len(result.output.strip().splitlines()) == 1 and [p.name for p in full.iterdir()] == ["keep.txt"]


@pytest.mark.slow
@pytest.mark.engine_environments("transformers-4")
def test_a_transformers_4_bundle_run_in_its_environment_reproduces_the_dropped_attention_cap(engine_environment,
                                                                                             tmp_path):
    """transformers 4.57.6 picks sdpa for Gemma 2 and trains without the attention cap (loss.backward() without
    Trainer, the quickest route): the bundle, run by the environment's interpreter in a folder of its own, says so
    again with the numbers train-parity recorded."""
    env = engine_environment("transformers-4")
    result = CliRunner().invoke(app, ["train-parity", "--engine", "transformers-4", "--model-type", "gemma2", "--json",
                                      "--timeout", "900", "--repro", str(tmp_path / "b")])
    assert result.exit_code == 0, result.output
    row = next(r for r in json.loads(result.stdout)["rows"] if (r["route"], r["cap"]) == ("loop-default", "attention"))
    assert row["verdict"] == "ignored"
    moved = shutil.copytree(tmp_path / "b" / "gemma2--transformers-4--loop-default", tmp_path / "elsewhere")
    run = subprocess.run([str(env.python), "-I", "reproduce.py", "--json"], cwd=moved, capture_output=True, text=True,
                         timeout=600, env={"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path),
                                           "HF_HOME": str(tmp_path / "hf")})
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout)["caps"]
    assert [(g["cap"], g["verdict"], g["reproduced"]) for g in got] == [("attention", "ignored", True)]
    assert got[0]["forward_cell"] == row["forward_cell"] == "attention off"
    assert got[0]["forward_error"] == pytest.approx(row["forward_error"], rel=1e-3)  # the same fp32 step
    assert got[0]["grad_error"] == pytest.approx(row["grad_error"], rel=1e-3)


def test_a_bundle_expects_only_the_verdicts_its_script_decides_as_train_parity_does():
    from softcapgrad.engines.repro import training
    from softcapgrad.engines.training import verdict as tv

    def row(verdict, hint=""):
        return {"verdict": verdict, "hint": hint, "c": 30.0}

    said = [training.expect(row(tv.IGNORED)), training.expect(row(tv.ELSEWHERE)), training.expect(row(tv.NOT_FINITE)),
            training.expect(row(tv.DIFFERENT, "matches the two caps' values swapped")),
            training.expect(row(tv.DIFFERENT, "forward applied (capped); the gradients match no reference")),
            training.expect(row(tv.DIFFERENT, "the returned logits are c·tanh(a/c) of the route's own a, but ...")),
            training.expect(row(tv.OTHER))]
    assert said == [tv.IGNORED, tv.ELSEWHERE, tv.NOT_FINITE, tv.DIFFERENT, None, None, None]
    assert [training.is_finding(row(v)) for v in (tv.APPLIED, tv.NOT_BOUND, tv.NOT_RUN, *tv.BAD)] == [
        False, False, False] + [True] * len(tv.BAD)
    assert not training.is_finding({"verdict": tv.IGNORED, "c": None})


def test_the_bundles_gradient_comparison_is_train_paritys():
    """The bundle script carries its own grad_error (it runs without softcapgrad): the same worst error and parameter
    as engines/training/verdict.py's, a parameter missing on either side and a shape that differs included."""
    import numpy as np

    from softcapgrad.engines.repro import train_check
    from softcapgrad.engines.training import verdict

    rng = np.random.default_rng(0)
    other = {"a": rng.standard_normal((3, 4)), "b": rng.standard_normal(5), "c": np.zeros(0)}
    cases = [{k: v + rng.standard_normal(v.shape) * 1e-3 for k, v in other.items()},
             {"a": other["a"]}, {**other, "d": np.ones(2)}, {**other, "b": np.ones(6)}]
    for mine in cases:
        assert train_check.grad_error(mine, other) == verdict.grad_error(mine, other)
