"""Running one engine route: its adapter script in its environment's interpreter, isolated, with a time limit.

The child is ``<env>/bin/python -I -c BOOTSTRAP WORK ROUTE VARIANT...``: isolated mode, so neither
the working folder nor ``PYTHON*`` variables nor the user's site folder reach its import path; its
working folder is ``WORK``, a temporary folder of its own holding copies of the input folders; its
standard input is /dev/null; its environment carries only what the run needs. It is the leader of
its own process group, and that group is killed on every way out (done, failed, timed out, an
exception, Ctrl-C or SIGTERM in the parent), so nothing it started outlives the run.

A crash, a hang or an engine that writes nothing is an :class:`Outcome` with its reason (the
adapter's ``reason:`` line, else the last line it printed, else the signal), never an exception.
CPU time is the child's own (user + system, from the kernel's accounting of that one process), so
routes may run side by side.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterator

import numpy as np

from softcapgrad.core import child as child_processes
from softcapgrad.engines.forward.catalog import ADAPTER_PATH, script as adapter_script

TIMEOUT = 300.0  # seconds of wall clock per route (every variant, conversion included); a shared machine is slow
NO_ARCHITECTURE = 3
# The adapters' folders go last on the path (adapters/, where adapter_protocol and adapter_transformers_load are
# found, then forward/ and training/); every file there is named adapter_*.py (catalog.PREFIX), so none shadows a
# package the adapter imports.
BOOTSTRAP = ("import os, sys, runpy; sys.path += sys.argv[1].split(os.pathsep); adapter = sys.argv[2]; "
             "del sys.argv[1:3]; "
             "runpy.run_path(adapter, run_name='__main__')")
PASSED = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "XDG_CACHE_HOME", "PIP_FIND_LINKS", "SSL_CERT_FILE")


@dataclass(frozen=True)
class Outcome:
    logits: dict  # variant folder -> float64 [tokens, vocab]; empty on failure
    info: dict  # the adapter's info.json ({} on failure)
    reason: str | None  # why it did not give logits
    code: int  # the child's exit code (negative: killed by that signal)
    cpu_s: float
    wall_s: float
    stderr: list = field(default_factory=list)  # its last lines, for the record

    @property
    def no_architecture(self) -> bool:
        return self.code == NO_ARCHITECTURE


CHILDREN = child_processes.Stoppable()  # the engine children running now, from every thread


def stop_all() -> None:
    """Kill every engine child running now (and what each started), and start no other until ``clear_stop``: the
    caller is unwinding from Ctrl-C or SIGTERM while its worker threads still wait on children."""
    CHILDREN.stop_all()


def clear_stop() -> None:
    CHILDREN.clear()


SOCKET_ROOM = 40  # characters of the child's temporary folder that leave room for the Unix sockets engines name in it


@contextlib.contextmanager
def temporary_folder(work: Path) -> Iterator[Path]:
    """The child's temporary folder: WORK/tmp, or, where that path is long, a short one of its own at the system's top
    level (removed here whatever happens to the child). Engines name Unix sockets under it (vLLM's processes, the
    process pools of datasets, which axolotl starts), and a socket's path may hold at most 107 bytes: under a deep
    WORK they cannot start (OSError: AF_UNIX path too long, zmq's "ipc path ... too long")."""
    if len(str(work / "tmp")) <= SOCKET_ROOM or not os.access("/tmp", os.W_OK):
        yield work / "tmp"
        return
    short = Path(tempfile.mkdtemp(prefix="softcapgrad-", dir="/tmp"))
    try:
        yield short
    finally:
        shutil.rmtree(short, ignore_errors=True)


def environment(work: Path, tmp: Path | None = None) -> dict:
    """The child's variables: a few of the caller's (PATH, HOME, locale), one thread, offline, caches in WORK, and
    ``tmp`` (WORK/tmp unless given) as its temporary folder."""
    env = {k: os.environ[k] for k in PASSED if k in os.environ}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", HF_HOME=str(work / "hf"), TOKENIZERS_PARALLELISM="false",
               KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3",
               XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
               TORCHINDUCTOR_COMPILE_THREADS="1", TORCHINDUCTOR_CACHE_DIR=str(work / "inductor"),
               TMPDIR=str(tmp or work / "tmp"), MPLBACKEND="Agg", PYTHONHASHSEED="0")
    return env


def command(python: Path | str, adapter: str | Path, work: Path, route: str, variants: list[str]) -> list[str]:
    """``adapter``: an adapter's name (catalog.script), or the path of a script (tests plant failing
    ones)."""
    script = adapter if isinstance(adapter, Path) else adapter_script(adapter)
    path = os.pathsep.join(map(str, ADAPTER_PATH))
    return [str(python), "-I", "-c", BOOTSTRAP, path, str(script), str(work), route, *variants]


def prepare(work: Path, inputs: Path, variants: list[str]) -> Path:
    """WORK: ids.npy and a copy of each variant folder from ``inputs`` (the engine may write beside them)."""
    work.mkdir(parents=True)
    (work / "tmp").mkdir()
    shutil.copy2(inputs / "ids.npy", work / "ids.npy")
    for variant in variants:
        shutil.copytree(inputs / variant, work / variant)
    return work


def run_copied(python: Path | str, adapter: str | Path, route: str, work: Path, inputs: Path, variants: list[str],
               timeout: float) -> "Outcome":
    """``run`` on a fresh WORK prepared from ``inputs`` (prepare), removed afterwards whatever happened."""
    return run_copied_batch(python, adapter, [route], [(work, inputs, variants)], timeout)[0][route]


def run_copied_batch(python: Path | str, adapter: str | Path, routes: list[str], items: list, timeout: float) -> list:
    """``routes`` on each model of ``items`` ((WORK, inputs, variants) triples: a fresh WORK prepared from the inputs,
    removed afterwards whatever happened) in one child, ``timeout`` seconds for each model and route. A route the
    child did not finish on a model (it crashed or ran out of time there) runs again in a child of its own. One
    dict route -> Outcome per item, in the order given."""
    works = []
    try:
        for work, inputs, variants in items:
            works.append(work)
            prepare(work, inputs, variants)
        union = list(dict.fromkeys(v for _, _, held in items for v in held))
        done = run_batch(python, adapter, routes, works, union, timeout * len(routes) * len(items))
    finally:
        for work in works:
            shutil.rmtree(work, ignore_errors=True)
    out = []
    for work, inputs, variants in items:
        got = {}
        for route in routes:
            got[route] = done[(work, route)]
            if got[route] is None and CHILDREN.stopped:
                got[route] = Outcome({}, {}, "stopped: the run is ending", -9, 0.0, 0.0)
            elif got[route] is None:
                got[route] = run_copied_batch(python, adapter, [route], [(work.with_name(f"{work.name}-{route}"),
                                                                           inputs, variants)], timeout)[0][route]
        out.append(got)
    return out


def _kill(child: subprocess.Popen) -> None:
    child_processes.kill_group(child)  # the child's own group: it and whatever it started


def _wait(child: subprocess.Popen, timeout: float) -> tuple[bytes, float, bool]:
    """The child's stderr, its own CPU time (user + system, with the descendants it waited for, from the
    kernel's accounting of that one process: other children running at the same time do not count) and
    whether it ran past ``timeout`` (then it and its group are killed)."""
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: chunks.append(child.stderr.read()), daemon=True)
    reader.start()
    deadline, late = time.monotonic() + timeout, False
    while True:
        pid, status, usage = os.wait4(child.pid, os.WNOHANG)
        if pid:
            child.returncode = os.waitstatus_to_exitcode(status)
            break
        if time.monotonic() > deadline and not late:
            _kill(child)
            late = True
        time.sleep(0.02)
    _kill(child)  # what it started and left behind
    reader.join(10.0)
    return b"".join(chunks), usage.ru_utime + usage.ru_stime, late


def run(python: Path | str, adapter: str | Path, route: str, work: Path, variants: list[str],
        timeout: float = TIMEOUT) -> Outcome:
    """The adapter's ``route`` on each variant folder under ``work``; logits read back without pickle."""
    return run_batch(python, adapter, [route], [work], variants, timeout)[(work, route)]


def run_batch(python: Path | str, adapter: str | Path, routes: list[str], works: list[Path], variants: list[str],
              timeout: float = TIMEOUT) -> dict:
    """The adapter's ``routes`` on each of ``works`` in one child (the first is its working folder at the start):
    (work, route) -> Outcome, or None where the child ran several and ended before finishing that one. Each one's
    times are the child's own for it; what the child spent outside them (starting, importing) counts to the first."""
    wall0 = time.perf_counter()
    with temporary_folder(works[0]) as tmp:
        if CHILDREN.stopped:
            return {(w, r): Outcome({}, {}, "stopped: the run is ending", -9, 0.0, 0.0) for w in works for r in routes}
        try:
            child = subprocess.Popen(command(python, adapter, os.pathsep.join(map(str, works)), ",".join(routes),
                                             variants), cwd=works[0], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     env=environment(works[0], tmp), start_new_session=True)
        except OSError as err:
            why = f"could not start {python}: {err.strerror}"
            return {(w, r): Outcome({}, {}, why, 1, 0.0, 0.0) for w in works for r in routes}
        CHILDREN.started(child)
        try:
            err, cpu, late = _wait(child, timeout)
        finally:
            CHILDREN.ended(child)
            _kill(child)  # on every way out, an exception or a signal in the parent included
            if child.returncode is None:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(child.pid, 0)
                child.returncode = -9
            if child.stderr:
                child.stderr.close()
    wall = time.perf_counter() - wall0
    if len(routes) == 1 and len(works) == 1:
        return {(works[0], routes[0]): _ended(works[0] / "out" / routes[0], variants, cpu, wall, err,
                                              child.returncode, late, timeout)}
    done = {(w, r): _finished(w / "out" / r, [v for v in variants if (w / v).is_dir()], _tail(err))
            for w in works for r in routes}
    reached = [key for key, o in done.items() if o is not None]
    if reached:  # the child's time outside its routes' own counts to the first it finished
        first = done[reached[0]]
        done[reached[0]] = replace(first, cpu_s=first.cpu_s + max(0.0, cpu - sum(done[k].cpu_s for k in reached)),
                                   wall_s=first.wall_s + max(0.0, wall - sum(done[k].wall_s for k in reached)))
    return done


def _ended(out: Path, variants: list[str], cpu: float, wall: float, err: bytes, code: int, late: bool,
           timeout: float) -> Outcome:
    """The outcome of a child that ran one route."""
    if late:
        return Outcome({}, {}, f"no answer in {timeout:.0f} s (stopped)", -9, cpu, wall, _tail(err))
    if code != 0:
        return Outcome({}, {}, last_line(err, code), code, cpu, wall, _tail(err))
    return _read(out, variants, cpu, wall, _tail(err))


def _seconds(record: dict, key: str) -> float:
    value = record.get(key) if isinstance(record, dict) else None
    return float(value) if isinstance(value, (int, float)) and np.isfinite(value) and value >= 0 else 0.0


def _finished(out: Path, variants: list[str], tail: list) -> Outcome | None:
    """One route of a child that ran several: its logits, or the reason it gave none; None where it did not end."""
    if (out / "info.json").is_file():
        try:
            info = json.loads((out / "info.json").read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
            info = {}
        return _read(out, variants, _seconds(info, "cpu_s"), _seconds(info, "wall_s"), tail)
    try:
        said = json.loads((out / "reason.json").read_text(encoding="utf-8"))
        code, why = int(said["code"]), plain(str(said["reason"]))[:300]  # as last_line cuts a reason
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None
    return Outcome({}, {}, why, code, _seconds(said, "cpu_s"), _seconds(said, "wall_s"), tail)


def _tail(err: bytes) -> list[str]:
    return err.decode("utf-8", "replace").strip().splitlines()[-5:]


def _read(out: Path, variants: list[str], cpu: float, wall: float, tail: list) -> Outcome:
    try:
        info = json.loads((out / "info.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as error:
        return Outcome({}, {}, f"the engine exited 0 but wrote no readable info.json ({error})", 0, cpu, wall, tail)
    logits = {}
    failed = info.get("failed") if isinstance(info, dict) and isinstance(info.get("failed"), dict) else {}
    failed = {variant: plain(str(why)) for variant, why in failed.items()}
    if failed:
        info["failed"] = failed  # the variants' reasons as plain text, as parity reads them from info
    for variant in variants:
        if variant in failed:
            continue
        try:
            values = np.load(out / f"{variant}.npy", allow_pickle=False)
        except (OSError, ValueError) as error:
            return Outcome({}, info, f"no logits for {variant}: {error}", 0, cpu, wall, tail)
        if values.ndim != 2 or values.dtype.kind != "f":
            return Outcome({}, info, f"logits for {variant} of shape {values.shape} and type {values.dtype}",
                           0, cpu, wall, tail)
        logits[variant] = values.astype(np.float64)
    return Outcome(logits, info if isinstance(info, dict) else {}, None, 0, cpu, wall, tail)


ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # terminal colour codes some engines put in their messages


def plain(text: str) -> str:
    """A reason as plain text: without terminal escape sequences."""
    return ESCAPES.sub("", text)


def last_line(err: bytes, code: int) -> str:
    """The child's reason: its ``reason:`` line, or the last line it printed, or the signal that ended it."""
    text = plain(err.decode("utf-8", "replace")).strip().splitlines()
    marked = [line[len("reason: "):] for line in text if line.startswith("reason: ")]
    if marked:
        return marked[-1][:300]
    if code < 0:
        return f"crashed: signal {signal.Signals(-code).name}"
    return text[-1][:300] if text else f"exit code {code} and nothing on stderr"


def write_ids(work: Path, ids: np.ndarray) -> None:
    np.save(work / "ids.npy", np.asarray(ids, dtype=np.int64).reshape(-1), allow_pickle=False)


@contextlib.contextmanager
def terminations() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C while held (so the child's group is killed and the temporary folder
    removed), ending in one line and exit 143."""
    from softcapgrad.core import child

    with child.terminating("terminated; the engine's processes were stopped and the temporary folder removed"):
        yield
