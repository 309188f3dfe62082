"""The engine environments: created on first use, reused, rebuilt when the requirements change, a broken one
repaired on install and refused otherwise, in one line; each under the cache folder, keyed by its file's hash."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from softcapgrad.core.checks import InputError
from softcapgrad.engines.environments import environments as envs


@pytest.fixture()
def empty(tmp_path):
    """An environment with nothing to install (a venv alone: seconds), in a cache of its own."""
    path = tmp_path / "req" / "tiny.txt"
    path.parent.mkdir()
    path.write_text("# nothing but the interpreter\n", encoding="utf-8")
    return tmp_path / "cache", path


def test_created_on_first_use_then_reused(empty):
    root, path = empty
    assert envs.state("tiny", root, path).state == "not installed"
    lines = []
    first = envs.install("tiny", root, lines.append, path)
    assert first.state == "installed" and first.python.is_file() and first.size > 0
    assert first.path.name == f"tiny-{envs.read('tiny', path).digest[:envs.DIGITS]}"
    assert lines and lines[-1].startswith("tiny: installed")
    inode = os.stat(first.path).st_ino
    lines.clear()
    again = envs.install("tiny", root, lines.append, path)
    assert os.stat(again.path).st_ino == inode and not lines  # nothing rebuilt, nothing said
    assert [p.name for p in root.iterdir() if not p.name.startswith(".")] == [first.path.name]  # no temporary left


def test_a_changed_requirement_is_stale_then_rebuilt(empty):
    root, path = empty
    old = envs.install("tiny", root, path=path)
    path.write_text("# changed\n", encoding="utf-8")
    now = envs.state("tiny", root, path)
    assert now.state == "stale" and now.path != old.path
    with pytest.raises(InputError, match="is stale .*softcapgrad engines install tiny"):
        envs.ready("tiny", False, root, path=path)
    new = envs.install("tiny", root, path=path)
    assert new.state == "installed" and not old.path.exists()  # the stale key is removed after the build


@pytest.mark.parametrize("damage", ["stamp", "corrupt", "interpreter"])
def test_a_broken_environment_is_refused_then_repaired(empty, damage):
    root, path = empty
    st = envs.install("tiny", root, path=path)
    if damage == "stamp":
        (st.path / envs.STAMP).unlink()
    elif damage == "corrupt":
        (st.path / envs.STAMP).write_text("{not json", encoding="utf-8")
    else:
        (st.path / "bin" / "python").unlink()
    broken = envs.state("tiny", root, path)
    assert broken.state == "broken" and broken.python is None and "\n" not in broken.reason
    with pytest.raises(InputError, match="is broken"):
        envs.ready("tiny", False, root, path=path)
    fixed = envs.ready("tiny", True, root, path=path)
    assert fixed.state == "installed" and fixed.python.is_file()


def test_removal_frees_every_key(empty):
    root, path = empty
    envs.install("tiny", root, path=path)
    assert envs.remove("tiny", root, path) > 0
    assert envs.state("tiny", root, path).state == "not installed"
    assert envs.remove("tiny", root, path) == 0


def _wheel(folder, name: str = "scratchpkg") -> str:
    """A minimal pure-Python wheel of one module (installing it needs no build backend and no index)."""
    import base64
    import hashlib
    import zipfile

    def row(path: str, data: bytes) -> str:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        return f"{path},sha256={digest},{len(data)}"

    info = f"{name}-0.dist-info"
    members = {f"{name}.py": b"VALUE = 7\n",
               f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 0\n".encode(),
               f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "\n".join([*(row(k, v) for k, v in members.items()), f"{info}/RECORD,,"]) + "\n"
    wheel = folder / f"{name}-0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for k, v in {**members, f"{info}/RECORD": record.encode()}.items():
            z.writestr(k, v)
    return str(wheel)


def test_a_build_runs_pip_with_its_own_temporary_folder_and_leaves_none(tmp_path, monkeypatch):
    """A build that installs a package through pip, with pip's TMPDIR inside the build: the package imports, the
    finished environment holds no scratch folder, and the caller's TMPDIR is left empty. (pip removes its own
    temporary folders when it finishes either way; test_engine_trust's SIGTERM test is the one where they would
    stay behind without the scratch folder.)"""
    system_tmp = tmp_path / "system-tmp"
    system_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(system_tmp))
    path = tmp_path / "one.txt"
    path.write_text(f"--no-index\n{_wheel(tmp_path)}\n", encoding="utf-8")
    state = envs.install("one", tmp_path / "cache", path=path)
    assert state.state == "installed" and not (state.path / ".scratch").exists()
    ran = subprocess.run([str(state.python), "-I", "-c", "import scratchpkg; print(scratchpkg.VALUE)"],
                         capture_output=True, text=True)
    assert ran.stdout.strip() == "7", ran.stderr[-300:]
    assert sorted(p.name for p in system_tmp.iterdir()) == []


def test_a_failing_install_is_one_line(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_text("no-such-package-softcapgrad-test==0.0.0\n", encoding="utf-8")
    with pytest.raises(InputError) as err:
        envs.install("bad", tmp_path / "cache", path=path)
    assert "could not be installed" in str(err.value) and "\n" not in str(err.value)
    assert not [p for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".bad.lock")]  # nothing half-built


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


def test_a_build_folder_whose_process_is_gone_is_removed_by_the_listing_and_by_install(empty, tmp_path,
                                                                                       monkeypatch):
    pytest.importorskip("transformers")
    from typer.testing import CliRunner

    from softcapgrad.cli.app import app

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    root = envs.cache_root()
    pid = _dead_pid()
    left = root / f".transformers-4-0123456789abcdef.building-{pid}"
    (left / "lib").mkdir(parents=True)
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as alive:
        try:
            building = root / f".transformers-4-0123456789abcdef.building-{alive.pid}"  # a build still running: kept
            building.mkdir()
            result = CliRunner().invoke(app, ["engines"])
            assert result.exit_code == 0
            assert result.stderr.splitlines() == [
                f"softcapgrad engines: removed {left.name}, left by a build that was stopped (process {pid} is gone)"]
            assert not left.exists() and building.is_dir()
        finally:
            alive.kill()
    own, path = empty
    left = own / f".tiny-0123456789abcdef.building-{pid}"
    left.mkdir(parents=True)
    lines = []
    envs.install("tiny", own, lines.append, path)
    assert lines[0] == f"removed {left.name}, left by a build that was stopped (process {pid} is gone)"
    assert not left.exists()
