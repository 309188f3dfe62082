"""Nothing from the caller's working folder runs: not through ``python -m softcapgrad``, not in the census's workers
(isolated children of softcapgrad.core.child, rows back as JSON); a partial census never replaces a fuller one
without --force; the census figure is drawn in the models layer."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(sys.executable).parent / "softcapgrad"


def _planted(folder: Path) -> Path:
    """A numpy.py, a multiprocessing/ package and an mlx/ folder that write ``marker`` when imported."""
    marker = folder / "marker"
    code = f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\n"
    (folder / "numpy.py").write_text(code)
    for name in ("multiprocessing", "mlx"):
        (folder / name).mkdir()
        (folder / name / "__init__.py").write_text(code)
    return marker


def test_python_m_softcapgrad_never_imports_the_working_folder(tmp_path):
    marker = _planted(tmp_path)
    done = subprocess.run([sys.executable, "-m", "softcapgrad", "knee", "--json"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["command"] == "knee"
    assert not marker.exists(), marker.read_text()


def test_census_workers_are_isolated_children_that_import_nothing_from_the_working_folder(tmp_path):
    pytest.importorskip("transformers")
    marker = _planted(tmp_path)
    done = subprocess.run([str(SCRIPT), "census", "--model-type", "laguna", "--model-type", "gemma2", "--workers", "2",
                           "--out", "none", "--json"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert not marker.exists(), marker.read_text()
    counts = {r["quantity"]: r["count"] for r in json.loads(done.stdout)["counts"]}
    assert counts["candidates"] == 2 and counts["audited"] == 2


def test_a_child_runs_in_a_folder_of_its_own_and_its_group_is_killed(tmp_path):
    from softcapgrad.core import child

    marker = _planted(tmp_path)
    with child.started("softcapgrad.core.child") as process:  # a module with no main: it imports, then exits
        pid = process.pid
        assert child.command("m")[1:4] == ["-P", "-s", "-m"]
    assert process.returncode is not None
    with pytest.raises(ProcessLookupError):
        import os

        os.killpg(pid, 0)
    assert not marker.exists()


def test_a_partial_census_leaves_a_fuller_one_in_place_without_force(cli, tmp_path):
    pytest.importorskip("transformers")
    full = (ROOT / "results" / "census.json").read_bytes()
    (tmp_path / "census.json").write_bytes(full)
    code, _, out, err = cli("census", "--model-type", "laguna", "--out", str(tmp_path), "--json")
    assert code == 0, err
    answer = json.loads(out)["answer"]
    assert any("left the fuller one" in a and "--force" in a for a in answer)
    assert (tmp_path / "census.json").read_bytes() == full and not (tmp_path / "census.md").exists()
    code, _, out, err = cli("census", "--model-type", "laguna", "--out", str(tmp_path), "--force", "--json")
    assert code == 0 and [r["model_type"] for r in json.loads((tmp_path / "census.json").read_text())["rows"]] == ["laguna"]
    code, _, out, err = cli("census", "--force", "--out", "none", "--json")
    assert code == 2 and "--force does not apply without --model-type" in err


def test_the_census_figure_lives_beside_the_census_and_draws_the_committed_one():
    pytest.importorskip("matplotlib")
    from softcapgrad.core.plot import png_bytes
    from softcapgrad.models import census
    from softcapgrad.models.census_figure import census_figure

    d = json.loads((ROOT / "results" / "census.json").read_text())
    rows = [census.from_json(json.dumps(r)) for r in d["rows"]]
    result = census.Census(d["transformers"], d["torch"], tuple(d["implementations"]), rows)
    assert png_bytes(census_figure(result)) == (ROOT / "results" / "figures" / "census.png").read_bytes()
    assert "def census_figure" not in (ROOT / "softcapgrad" / "cli" / "census.py").read_text()


def test_sigterm_kills_the_child_and_removes_its_folder(tmp_path):
    """A census worker waits for its model types on stdin: SIGTERM to its parent stops both, and the folder goes."""
    import os
    import signal
    import time

    script = ("import sys, time\nfrom softcapgrad.core import child\n"
              "with child.started('softcapgrad.models.census_worker') as p:\n"
              "    print(p.pid, flush=True)\n"
              "    time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path, stdout=subprocess.PIPE, text=True,
                              stderr=subprocess.PIPE)
    pid = int(parent.stdout.readline().split()[0])
    folder = Path(f"/proc/{pid}/cwd").resolve()
    assert folder.name.startswith("softcapgrad-child-") and folder != tmp_path
    parent.send_signal(signal.SIGTERM)
    _, err = parent.communicate(timeout=60)
    assert parent.returncode != 0 and "terminated: the child process was stopped" in err
    time.sleep(0.1)
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)
    assert not folder.exists()


def test_an_empty_mlx_folder_in_the_working_folder_leaves_a_census_row_as_committed(tmp_path):
    """rt_detr builds its backbone through transformers' is_tensor, which asks for mlx when transformers takes
    mlx for installed: an empty `mlx/` in the folder used to be found as a namespace package and turn the row
    into "needs the package mlx". The row is the committed one (run without any such folder)."""
    pytest.importorskip("transformers")
    (tmp_path / "mlx").mkdir()
    done = subprocess.run([sys.executable, "-m", "softcapgrad", "census", "--model-type", "rt_detr", "--out", "out"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    (row,) = json.loads((tmp_path / "out" / "census.json").read_text())["rows"]
    committed = json.loads((ROOT / "results" / "census.json").read_text())["rows"]
    assert row == next(r for r in committed if r["model_type"] == "rt_detr")
    assert row["status"] == "audited" and "mlx" not in row["reason"]
