"""Files written whole across file systems, a disk that fills, and standard streams that cannot be written.

A second file system is a real one: /dev/shm where it is a tmpfs of its own, else a tmpfs mounted for the
test where this user may mount; a machine with neither skips and says so.
"""

import contextlib
import errno
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from softcapgrad.core import files, owner_only


def _device(path: Path) -> int:
    return os.stat(path).st_dev


@contextlib.contextmanager
def _mounted(where: Path, size: str = "16m"):
    """A tmpfs mounted on ``where`` for the test; None where this user may not mount one."""
    where.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                              capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        done = None
    if done is None or done.returncode != 0 or _device(where) == _device(where.parent):
        yield None
        return
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=20)


@pytest.fixture
def other_fs(tmp_path):
    """A folder on another file system than ``tmp_path``."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK) and _device(shm) != _device(tmp_path):
        folder = Path(tempfile.mkdtemp(prefix="softcapgrad-test.", dir=shm))
        try:
            yield folder
        finally:
            subprocess.run(["rm", "-rf", str(folder)], timeout=20)
        return
    with _mounted(tmp_path / "mnt") as mount:
        if mount is None:
            pytest.skip("no second file system: /dev/shm is absent or on tmp_path's device, and mount -t tmpfs "
                        "is not permitted here")
        yield mount


def test_a_set_whose_targets_span_file_systems_is_written_whole(tmp_path, other_fs):
    out = tmp_path / "out"
    out.mkdir()
    (out / "figures").symlink_to(other_fs)  # the figures live on another disk
    (out / "claims.json").write_text("old")
    (other_fs / "a.png").write_bytes(b"old")
    written = files.replace_all({out / "figures" / "a.png": b"new", out / "claims.json": "new"}, out)
    assert written == [out / "figures" / "a.png", out / "claims.json"]
    assert (other_fs / "a.png").read_bytes() == b"new" and (out / "claims.json").read_text() == "new"
    assert sorted(p.name for p in other_fs.iterdir()) == ["a.png"]  # no stage left on either side
    assert sorted(p.name for p in out.iterdir()) == ["claims.json", "figures"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]


def test_a_refused_rename_on_one_file_system_replaces_nothing_on_the_other(tmp_path, other_fs, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "figures").symlink_to(other_fs)
    (other_fs / "a.png").write_bytes(b"old")
    real = files.write_atomic

    def then_a_link(path, data):  # once everything is staged, a link takes the ledger's place
        real(path, data)
        if Path(path).suffix == ".json":
            (out / "claims.json").symlink_to(tmp_path / "elsewhere")

    monkeypatch.setattr(files, "write_atomic", then_a_link)
    with pytest.raises(files.InputError, match="symbolic link"):
        files.replace_all({out / "figures" / "a.png": b"new", out / "claims.json": "new"}, out)
    assert (other_fs / "a.png").read_bytes() == b"old"  # checked before the first rename
    assert sorted(p.name for p in other_fs.iterdir()) == ["a.png"]


def test_reproduce_into_a_mount_point(cli, tmp_path):
    with _mounted(tmp_path / "mnt") as mount:
        if mount is None:
            pytest.skip("mount -t tmpfs is not permitted here: --out cannot be made a mount point")
        code, _, out, err = cli("reproduce", "--out", str(mount), "--only", "^attenuation", "--force")
        assert code == 0, err
        assert sorted(p.name for p in mount.iterdir()) == ["claims.json", "claims.md", "claims.raw.json"]


def test_new_folders_made_for_a_failed_set_are_removed(tmp_path, monkeypatch):
    def full(path, data):
        raise files.CannotWrite(f"{path}: cannot write", os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files, "write_atomic", full)
    with pytest.raises(files.CannotWrite, match=r"out/a/b/x.txt: cannot write \(No space left on device\); no file"):
        files.replace_all({tmp_path / "out" / "a" / "b" / "x.txt": "new"}, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_under_plot_is_one_line_exit_2(cli, tmp_path):
    with _mounted(tmp_path / "full", size="4k") as mount:
        if mount is None:
            pytest.skip("mount -t tmpfs is not permitted here: no small disk to fill")
        (mount / "filler").write_bytes(b"\0" * 4096)  # every block of the file system taken
        code, _, out, err = cli("knee", "--cap", "30", "--plot", str(mount / "knee.png"))
        assert code == 2 and out == "", err
        assert err.strip().splitlines() == [f"softcapgrad: error: {mount}/knee.png: cannot write (No space left on "
                                             "device); it was left as it was"]
        assert sorted(p.name for p in mount.iterdir()) == ["filler"]


def test_a_full_disk_is_exit_2_without_a_second_file_system(cli, tmp_path, monkeypatch):
    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files.os, "fsync", full)
    code, _, out, err = cli("knee", "--cap", "30", "--plot", str(tmp_path / "knee.png"))
    assert code == 2 and "internal error" not in err and "No space left on device" in err
    assert len(err.strip().splitlines()) == 1 and list(tmp_path.iterdir()) == []


def _run(shell: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PY": sys.executable})


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full on this system")
@pytest.mark.parametrize("json_out", [False, True])
def test_stdout_on_dev_full_is_one_line_exit_2(json_out):
    done = _run(f'"$PY" -m softcapgrad knee --cap 30 {"--json" if json_out else ""} > /dev/full')
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == ["softcapgrad: error: cannot write the answer to standard output "
                                        "(No space left on device)"]


def test_bad_input_with_stderr_closed_still_exits_2():
    done = _run('"$PY" -m softcapgrad knee --cap -1 2>&-; echo "rc=$?"')
    assert done.stdout.strip() == "rc=2" and "Traceback" not in done.stdout + done.stderr


def test_owner_only_umask_blocks_overlapping_on_two_threads_hold_until_the_last_ends():
    """Two builds side by side each hold the block: the first to end must not give the other a group-writable umask
    (its environment would then be untrusted), and the last to end puts the caller's umask back."""
    import threading

    def current() -> int:
        mask = os.umask(0)
        os.umask(mask)
        return mask

    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def first():
        with owner_only.owner_writes_only():
            first_in.set()
            second_in.wait(10)
        first_out.set()

    def second():
        first_in.wait(10)
        with owner_only.owner_writes_only():
            second_in.set()
            first_out.wait(10)
            seen["after the first ended"] = current()

    before = os.umask(0o002)
    try:
        threads = [threading.Thread(target=first), threading.Thread(target=second)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        assert seen["after the first ended"] & 0o022 == 0o022
        assert current() == 0o002
    finally:
        os.umask(before)
