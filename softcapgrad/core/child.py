"""An isolated child process of this package: nothing from the caller's working folder or user site is importable.

The child runs ``python -P -s -m softcapgrad.<module>`` (no working-folder entry, no user site packages) in a
temporary folder of its own, with only the environment variables it needs, in a session (and so a process
group) of its own, and the whole group is killed on every way out of the ``with`` block. ``PYTHONPATH`` is set,
to the package's own root alone, only where the interpreter would not find the package without it (a source
checkout run in place). Data crosses as JSON on its pipes, never as pickle.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the folder that holds the softcapgrad package
KEPT = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "XDG_CACHE_HOME", "HF_HOME", "HF_HUB_CACHE", "ATEN_CPU_CAPABILITY",
        "OMP_NUM_THREADS", "MKL_NUM_THREADS")  # what the libraries a child imports read, and nothing else


def command(module: str, *args: str) -> list[str]:
    return [sys.executable, "-P", "-s", "-m", module, *args]


def _found_without_path() -> bool:
    """The package is importable by this interpreter with neither PYTHONPATH nor the working folder."""
    import importlib.machinery

    cwd = os.getcwd()
    extra = {p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    path = [p for p in sys.path if p not in ("", cwd) and p not in extra]
    spec = importlib.machinery.PathFinder.find_spec("softcapgrad", path)
    return spec is not None and spec.origin is not None and Path(spec.origin).resolve().parent == ROOT / "softcapgrad"


def environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: os.environ[k] for k in KEPT if k in os.environ}
    env["HF_HUB_OFFLINE"] = env["TRANSFORMERS_OFFLINE"] = "1"
    if not _found_without_path():
        env["PYTHONPATH"] = str(ROOT)
    return {**env, **(extra or {})}


def alive(pid: int) -> bool:
    """Whether a process with this id exists (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    except (OverflowError, ValueError):  # no process can have this id
        return False
    return pid > 0


def _stale(prefix: str, where: Path) -> list[Path]:
    """This user's folders ``<prefix><pid>-...`` in ``where`` whose process is gone."""
    import re
    import stat

    named = re.compile(re.escape(prefix) + r"([0-9]+)-.+")
    try:
        paths = sorted(where.iterdir())
    except OSError:
        return []
    stale = []
    for path in paths:
        found = named.fullmatch(path.name)
        if not found or alive(int(found[1])):
            continue
        with contextlib.suppress(OSError):
            info = os.lstat(path)
            if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid():  # a link or another user's: not ours
                stale.append(path)
    return stale


@contextlib.contextmanager
def scratch(prefix: str):
    """A temporary folder ``<prefix><pid>-XXXXXXXX``, removed on every way out the process lives through. One
    that a run killed outright (SIGKILL) left behind is removed by the next run once its pid is gone, as an
    engine build's temporary folder is."""
    import shutil

    for path in _stale(prefix, Path(tempfile.gettempdir())):
        shutil.rmtree(path, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix=f"{prefix}{os.getpid()}-") as folder:
        yield Path(folder)


def kill(process: subprocess.Popen) -> None:
    """The child's whole process group, whatever state it is in."""
    kill_group(process)
    process.wait()


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL to the child's own process group (it, and whatever it started), without waiting."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


class Stoppable:
    """Children (each in a process group of its own) that worker threads start and wait on, and that the main thread,
    unwinding from Ctrl-C or SIGTERM (no signal handler can be set off it), stops at once: ``stop_all`` kills every one
    running, with its group, and every later ``started`` kills its child at once, until ``clear``. The waiting
    threads then see their children end and clean up as on any failure."""

    def __init__(self) -> None:
        self._live: set = set()
        self._lock = threading.Lock()
        self._stopped = threading.Event()

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    def started(self, process: subprocess.Popen) -> None:
        with self._lock:
            self._live.add(process)
        if self._stopped.is_set():  # a stop between the caller's check and this registration
            kill_group(process)

    def ended(self, process: subprocess.Popen) -> None:
        with self._lock:
            self._live.discard(process)

    def stop_all(self) -> None:
        self._stopped.set()
        with self._lock:
            live = list(self._live)
        for process in live:
            kill_group(process)

    def clear(self) -> None:
        self._stopped.clear()


@contextlib.contextmanager
def terminating(message: str):
    """Meanwhile SIGTERM raises :class:`~softcapgrad.core.files.Interrupted` with ``message`` on the main thread,
    once (a second one is ignored, so the clean-up it unwinds into is not cut short), as Ctrl-C would; the handler
    before is put back after. Off the main thread no handler can be set: nothing is held."""
    from softcapgrad.core.files import Interrupted

    came = []

    def stop(signum, frame) -> None:
        if not came:
            came.append(signum)
            raise Interrupted(message, signum)

    try:
        previous = signal.signal(signal.SIGTERM, stop)
    except ValueError:
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def started(module: str, *args: str, extra: dict[str, str] | None = None):
    """The child ``softcapgrad.<module>`` with stdin and stdout as text pipes (stderr kept in a file of its folder,
    read with :func:`stderr`); killed with its group, and its folder removed, however the block ends (a SIGTERM
    meanwhile unwinds it as an interrupt does, on the main thread)."""
    with terminating("terminated: the child process was stopped and its folder removed"):
        with _started(module, *args, extra=extra) as process:
            yield process


@contextlib.contextmanager
def _started(module: str, *args: str, extra: dict[str, str] | None = None):
    with tempfile.TemporaryDirectory(prefix="softcapgrad-child-") as folder:
        err = open(Path(folder) / "stderr", "w+", encoding="utf-8")
        process = subprocess.Popen(command(module, *args), cwd=folder, env=environment(extra), stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=err, text=True, encoding="utf-8",
                                   start_new_session=True)
        process.stderr_file = err
        try:
            yield process
        finally:
            kill(process)
            for pipe in (process.stdin, process.stdout):
                with contextlib.suppress(OSError):
                    pipe.close()
            err.close()


def stderr(process: subprocess.Popen, lines: int = 1) -> str:
    """The last ``lines`` lines the child wrote on stderr, one line."""
    process.stderr_file.flush()
    process.stderr_file.seek(0)
    text = [line.strip() for line in process.stderr_file.read().splitlines() if line.strip()]
    return " ".join(text[-lines:])
