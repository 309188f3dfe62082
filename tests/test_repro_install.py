"""A reproduction bundle's REPORT.md followed to the letter on a machine without softcapgrad: its shell commands run
as written in a fresh virtual environment, with the package indexes this machine is configured with (PyPI, and
torch's own index that the install command names for torch's CPU build), and the bundle's script reproduces its row.

It downloads and installs torch, transformers and their dependencies: the engines tier (make test-engines) runs it,
make test leaves it out (the ``downloads`` mark, tests/conftest.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from softcapgrad.cli.app import app
from softcapgrad.engines.repro.report import commands

pytest.importorskip("transformers")


def fresh_venv(folder) -> dict:
    """A new virtual environment and the variables of a shell that activated it: its bin first on PATH, no PYTHON*
    variable of this process (nothing of softcapgrad importable), the machine's pip settings as they are."""
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(VIRTUAL_ENV=str(folder), PATH=f"{folder / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
               OMP_NUM_THREADS="1", HF_HOME=str(folder / "hf"))
    return env


@pytest.mark.slow
@pytest.mark.downloads
@pytest.mark.engine_environments("transformers-4")
def test_a_bundles_report_followed_as_written_in_a_fresh_venv_reproduces_its_row(engine_environment, tmp_path):
    engine_environment("transformers-4")
    result = CliRunner().invoke(app, ["parity", "--seq-len", "12", "--json", "--engine", "transformers-4",
                                      "--repro", str(tmp_path / "b")])
    assert result.exit_code == 0, result.output
    row = next(r for r in json.loads(result.stdout)["rows"] if (r["route"], r["cap"]) == ("default", "attention"))
    assert row["verdict"] == "ignored"
    bundle = shutil.copytree(tmp_path / "b" / "gemma2--transformers-4--default", tmp_path / "elsewhere")
    steps = commands((bundle / "REPORT.md").read_text(encoding="utf-8"))
    assert steps[0].startswith("pip install --extra-index-url https://download.pytorch.org/whl/cpu ")
    assert steps[-1].startswith("python reproduce.py")
    env = fresh_venv(tmp_path / "venv")
    said = []
    for command in steps:
        run = subprocess.run(["/bin/sh", "-c", command], cwd=bundle, env=env, capture_output=True, text=True,
                             timeout=1800)
        assert run.returncode == 0, (command, run.stdout[-2000:], run.stderr[-3000:])
        said.append(run.stdout)
    assert "attention cap (c = 50.0): ignored (parity recorded ignored: reproduced)" in said[-1]
    where = subprocess.run(["/bin/sh", "-c", "python -c 'import sys, torch, transformers; print(sys.prefix); "
                                             "print(torch.__version__, transformers.__version__)'"],
                           env=env, capture_output=True, text=True, check=True).stdout.split("\n")
    assert where[0] == str(tmp_path / "venv") and where[1] == "2.13.0+cpu 4.57.6"  # the pins, in the venv made here
    absent = subprocess.run(["/bin/sh", "-c", "python -c 'import softcapgrad'"], cwd=tmp_path, env=env,
                            capture_output=True, text=True)
    assert absent.returncode != 0 and "No module named 'softcapgrad'" in absent.stderr
    got = json.loads(subprocess.run(["/bin/sh", "-c", "python reproduce.py --json"], cwd=bundle, env=env,
                                    capture_output=True, text=True, check=True, timeout=600).stdout)["caps"]
    assert got[0]["error"] == pytest.approx(row["error"], rel=1e-3)  # the same fp32 step: the same worst error
