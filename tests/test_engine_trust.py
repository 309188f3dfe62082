"""The engines' cache runs nothing someone else may have put there, and leaves no build behind: a planted
environment with a copied stamp is listed as untrusted and refused in one line; a build's temporary folder whose
process is gone is removed; SIGTERM to an install ends pip's whole process group and removes its folder, pip's
temporary folders with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from softcapgrad.core.checks import InputError
from softcapgrad.engines.environments import environments as envs

NAME = "transformers-4"  # a real environment of the catalog, planted by hand (nothing is built)


def _plant(root: Path, name: str = NAME, path: Path | None = None) -> Path:
    """An environment that passes the stamp check: the stamp of a finished build copied in, and an interpreter
    that, if ever run, leaves a file behind."""
    req = envs.read(name, path)
    here = envs.folder(req, root)
    (here / "bin").mkdir(parents=True)
    python = here / "bin" / "python"
    python.write_text(f"#!/bin/sh\ntouch {here / 'ran'}\n", encoding="utf-8")
    python.chmod(0o755)
    (here / envs.STAMP).write_text(json.dumps({"sha256": req.digest, "versions": {"torch": "2.0"}}), encoding="utf-8")
    for p in (root, here, here / "bin", here / envs.STAMP):
        p.chmod(p.stat().st_mode & ~0o022)
    assert envs.state(name, root, path).state == "installed"  # what today's check takes it for
    return here


def _foreign(monkeypatch, under: Path) -> None:
    """Every node at or under ``under`` reads as another user's (the tests run as root, who owns everything)."""
    real = os.lstat

    def lstat(path, *args, **kwargs):
        info = real(path, *args, **kwargs)
        if Path(os.fsdecode(path)).is_relative_to(under):
            fields = list(info)[:10]
            fields[4] = 4242
            return os.stat_result(fields)
        return info

    monkeypatch.setattr(os, "lstat", lstat)


@pytest.mark.parametrize("how, said", [
    ("group-writable folder", "its folder is writable by its group"),
    ("world-writable file", "its file or folder bin/python is writable by others"),
    ("foreign folder", "its folder is owned by another user (uid 4242)"),
    ("foreign cache", "the cache folder {root} is owned by another user (uid 4242)"),
])
def test_a_planted_environment_with_a_copied_stamp_is_untrusted_and_refused(tmp_path, monkeypatch, how, said):
    root = tmp_path / "engines"
    here = _plant(root)
    if how == "group-writable folder":
        here.chmod(0o775)
    elif how == "world-writable file":
        (here / "bin" / "python").chmod(0o777)
    else:
        _foreign(monkeypatch, here if how == "foreign folder" else root)
    st = envs.state(NAME, root)
    assert (st.state, st.reason, st.python) == ("untrusted", said.format(root=root), None)
    assert st.suspect == (root if how == "foreign cache" else here)
    for install_it in (False, True):  # install does not build over it either
        with pytest.raises(InputError) as err:
            envs.ready(NAME, install_it, root, engine=NAME)
        assert str(err.value) == (f"engine {NAME}: its environment {NAME} is untrusted ({said.format(root=root)}), "
                                  f"so nothing in it is run: remove {st.suspect} (rm -rf {st.suspect}), then "
                                  f"softcapgrad engines install {NAME}")
    assert not (here / "ran").exists() and envs.sweep(root) == []


def test_a_planted_link_is_untrusted_and_removal_takes_the_link_alone(tmp_path):
    elsewhere = _plant(tmp_path / "elsewhere")
    root = tmp_path / "engines"
    root.mkdir(mode=0o755)
    link = envs.folder(envs.read(NAME), root)
    link.symlink_to(elsewhere)
    st = envs.state(NAME, root)
    assert (st.state, st.reason, st.suspect) == ("untrusted", "its folder is a symbolic link", link)
    envs.remove(NAME, root)
    assert not os.path.lexists(link) and (elsewhere / envs.STAMP).is_file()


def test_the_owners_own_stamped_folder_is_trusted(tmp_path):
    """The documented limit: ownership and permissions are the check, so a folder this user made is theirs."""
    assert envs.state(NAME, tmp_path / "engines").state == "not installed"
    _plant(tmp_path / "engines")


def test_a_build_under_a_group_writable_umask_is_trusted(tmp_path):
    """The build writes for its owner alone, so its own environment passes the check whatever the umask."""
    path = tmp_path / "tiny.txt"
    path.write_text("# nothing but the interpreter\n", encoding="utf-8")
    mask = os.umask(0o002)
    try:
        st = envs.install("tiny", tmp_path / "engines", path=path)
    finally:
        os.umask(mask)
    assert st.state == "installed" and (st.path / "bin").stat().st_mode & 0o777 == 0o755
    assert (st.path / envs.STAMP).stat().st_mode & 0o777 == 0o644


def test_parity_and_the_listing_refuse_a_planted_environment(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    from typer.testing import CliRunner

    from softcapgrad.cli.app import app

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    here = _plant(envs.cache_root())
    here.chmod(0o777)
    listed = CliRunner().invoke(app, ["engines", "--json"])
    assert listed.exit_code == 0, listed.output
    data = json.loads(listed.stdout)
    [row] = [r for r in data["rows"] if r["engine"] == NAME]
    assert row["state"] == "untrusted: its folder is writable by others"
    assert data["answer"][-1] == (f"Untrusted, never run (someone else may have put or changed them): remove {here} "
                                  "(rm -rf), then install again.")
    for engines in (["--engine", NAME], []):  # named, or among all
        result = CliRunner().invoke(app, ["parity", *engines])
        assert result.exit_code == 2
        [line] = result.output.strip().splitlines()
        assert line.startswith(f"softcapgrad: error: engine {NAME}: its environment {NAME} is untrusted (its folder "
                               f"is writable by others), so nothing in it is run: remove {here}")
    assert not (here / "ran").exists()


@pytest.mark.parametrize("above", ["XDG_CACHE_HOME", "its softcapgrad folder"])
def test_a_folder_above_the_cache_that_others_may_write_makes_it_untrusted(tmp_path, monkeypatch, above):
    """Others who may write a folder above the cache may rename the cache away and plant their own: untrusted,
    never run; with the sticky bit (as /tmp) they may not, and it is trusted."""
    from typer.testing import CliRunner

    from softcapgrad.cli.app import app

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache-home"))
    here = _plant(envs.cache_root())
    folder = tmp_path / "cache-home" if above == "XDG_CACHE_HOME" else envs.cache_root().parent
    folder.chmod(0o777)
    st = envs.state(NAME)
    assert (st.state, st.python) == ("untrusted", None)
    assert st.reason == f"{folder}, a folder above the cache folder, is writable by others"
    listed = CliRunner().invoke(app, ["engines", "--json"])
    [row] = [r for r in json.loads(listed.stdout)["rows"] if r["engine"] == NAME]
    assert listed.exit_code == 0 and row["state"].startswith("untrusted: "), row
    with pytest.raises(InputError, match="is untrusted"):
        envs.ready(NAME, False, engine=NAME)
    assert not (here / "ran").exists()
    folder.chmod(0o1777)
    assert envs.state(NAME).state == "installed"


def test_an_interpreter_link_through_a_folder_others_may_write_is_untrusted(tmp_path):
    """bin/python -> shared/python -> real/python: whoever may write shared/ may point the interpreter anywhere."""
    root = tmp_path / "engines"
    here = _plant(root)
    (tmp_path / "real").mkdir(mode=0o755)
    (here / "bin" / "python").rename(tmp_path / "real" / "python")
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "python").symlink_to(tmp_path / "real" / "python")
    (here / "bin" / "python").symlink_to(tmp_path / "shared" / "python")
    assert envs.state(NAME, root).state == "installed"
    (tmp_path / "shared").chmod(0o777)
    st = envs.state(NAME, root)
    assert (st.state, st.reason) == ("untrusted", f"{tmp_path / 'shared'}, a folder above its interpreter "
                                                  f"{tmp_path / 'shared' / 'python'}, is writable by others")


def test_a_stamp_nested_past_the_parser_is_a_broken_stamp(tmp_path, monkeypatch):
    """A stamp nested 100,000 deep (RecursionError in the parser) crashed the listing and parity with exit 3."""
    pytest.importorskip("transformers")
    from typer.testing import CliRunner

    from softcapgrad.cli.app import app

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    here = _plant(envs.cache_root())
    deep = "[" * 100_000 + "]" * 100_000
    (here / envs.STAMP).write_text('{"sha256": "0", "versions": {"torch": ' + deep + "}}", encoding="utf-8")
    st = envs.state(NAME)
    assert (st.state, st.python) == ("broken", None) and "stamp" in st.reason
    listed = CliRunner().invoke(app, ["engines", "--json"])
    assert listed.exit_code == 0, listed.output
    [row] = [r for r in json.loads(listed.stdout)["rows"] if r["engine"] == NAME]
    assert row["state"].startswith("broken"), row
    result = CliRunner().invoke(app, ["parity", "--engine", NAME])
    [line] = result.output.strip().splitlines()
    assert result.exit_code == 2 and line.startswith(f"softcapgrad: error: engine {NAME}: ") and "broken" in line, \
        result.output
    assert not (here / "ran").exists()


# A build backend of pip's that hangs in its first hook, after saying which processes run it (itself and pip): a
# file per build in the folder SLOW_PIDS, named by the backend's process id.
BACKEND = """
import os, time

def get_requires_for_build_wheel(config_settings=None):
    path = os.path.join(os.environ["SLOW_PIDS"], str(os.getpid()))
    with open(path + ".tmp", "w") as f:
        f.write(f"{os.getpid()} {os.getppid()}")
    os.replace(path + ".tmp", path)
    time.sleep(300)
    return []
"""

# softcapgrad engines install, every requirements file replaced by the slow one.
INSTALL = """
import sys
from pathlib import Path
from softcapgrad.engines.environments import requirements
requirements.requirements_file = lambda name: Path(sys.argv[1])
from softcapgrad.cli.app import app
app(["engines", "install", *sys.argv[2:]])
"""


def _running(pid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z"  # a zombie has ended; only its parent's wait is missing


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")
@pytest.mark.parametrize("names", [(NAME,), (NAME, "onnx")], ids=["one", "two side by side"])
def test_sigterm_during_install_ends_pip_and_its_backend_and_removes_the_build(tmp_path, names):
    """Two builds run on worker threads, where no signal handler can be set: the main thread's must stop both pips
    (and their backends), and wait for both folders to go."""
    package = tmp_path / "slowpkg"
    package.mkdir()
    (package / "pyproject.toml").write_text('[build-system]\nrequires = []\nbuild-backend = "backend"\n'
                                            'backend-path = ["."]\n\n[project]\nname = "slowpkg"\nversion = "0"\n')
    (package / "backend.py").write_text(BACKEND)
    slow = tmp_path / "slow.txt"
    slow.write_text(f"--no-index\n{package}\n", encoding="utf-8")  # nothing is fetched: a local folder alone
    (pids_dir := tmp_path / "pids").mkdir()
    system_tmp = tmp_path / "system-tmp"  # the caller's TMPDIR: pip's temporary folders must not land there
    system_tmp.mkdir()
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "SLOW_PIDS": str(pids_dir),
           "TMPDIR": str(system_tmp)}
    proc = subprocess.Popen([sys.executable, "-c", INSTALL, str(slow), *names], env=env,
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pids = []
    try:
        deadline = time.monotonic() + 120
        while len(written := [p for p in pids_dir.iterdir() if p.suffix != ".tmp"]) < len(names) \
                and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(written) == len(names), proc.communicate(timeout=30)  # every backend is running, all at once
        pids = [int(p) for f in written for p in f.read_text().split()]
        root = tmp_path / "cache" / "softcapgrad" / "engines"
        assert sorted(p.name for p in root.glob(".*.building-*")) == sorted(
            f".{n}-{envs.read(n, slow).digest[:16]}.building-{proc.pid}" for n in names)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 143, err[-600:]
        assert err.strip().splitlines()[-1] == ("softcapgrad: terminated; the build's processes were stopped and its "
                                                "temporary folder removed")
        assert not [pid for pid in pids if _running(pid)]  # every backend, and every pip above one
        assert sorted(p.name for p in root.iterdir()) == sorted(f".{n}.lock" for n in names)
        assert sorted(p.name for p in system_tmp.iterdir()) == []  # pip's went with the builds' folders
    finally:
        for pid in pids:
            if _running(pid):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
