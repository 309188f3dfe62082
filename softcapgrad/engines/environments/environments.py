"""One cached virtual environment per engine, keyed by the hash of its pinned requirements file.

An engine's requirements (``requirements/<name>.txt``) name every package it needs at an exact
version; the environment is ``<cache>/softcapgrad/engines/<name>-<hash>`` with ``<cache>`` the
user's ``XDG_CACHE_HOME`` (``~/.cache`` when unset) and ``<hash>`` the first 16 hex digits of the
sha256 of the file, as pre-commit and nox key theirs: a changed file is a new key, so the next use
builds afresh and the old folder is stale. An environment is built in a temporary folder beside its
final one (``python -m venv``, ``pip install --no-deps -r FILE``, then the ``# remove:`` packages,
then each ``# then: SCRIPT`` of adapters/ (adapter_file) run by the new interpreter), stamped, and renamed into
place, under a lock so that two runs never build the same one. Nothing half-built is ever used: a
folder whose stamp is missing or unreadable, or whose interpreter is gone, is *broken* and is
rebuilt on install, refused otherwise.

Nothing in the cache is run unless no one but this user can have put it there or changed it
(engines/environments/trust.py): anything else is *untrusted*: listed with the reason, never run, refused by ``parity``
and by install (which would otherwise build over it) in one line naming what to remove.

A build runs each step as a child in a process group of its own and kills the group on every way out
(a failure, Ctrl-C, SIGTERM), then removes its temporary ``.<folder>.building-<pid>`` folder; one left
by a build killed outright (SIGKILL) is removed by the next install or listing once its pid is gone.

The pseudo-environment ``main`` is the interpreter running softcapgrad itself (for engines that need
only torch and transformers); it is never built or removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from softcapgrad.core import child, files, owner_only
from softcapgrad.core.checks import InputError
from softcapgrad.engines.environments import build_steps, trust
from softcapgrad.engines.environments.build_steps import BuildError
from softcapgrad.engines.environments.build_steps import run as _step
from softcapgrad.engines.environments.requirements import (  # noqa: F401  (read here by callers and tests)
    ADAPTER_PATH, ADAPTERS, ENGINES, REQUIREMENTS, Requirements, adapter_file, names, read, requirements_file,
)

MAIN = "main"
# the names four engines and their environments had before parity, train-parity and engines spoke one vocabulary:
# read on input, never printed
FORMER = {"lit_gpt": "litgpt", "torch_tune": "torchtune", "mlxlm": "mlx-lm", "gemma_jax": "gemma-jax"}
STAMP = "softcapgrad-environment.json"
DIGITS = 16  # hex digits of the sha256 in a folder's name
STATES = ("installed", "not installed", "stale", "broken", "untrusted")
BUILDING = re.compile(r"\..+\.building-([0-9]+)")  # a build's temporary folder, named by its process id
Say = Callable[[str], None]
BUILDS_AT_ONCE = 2  # the most builds at once, for engines install, parity --install and the test suite alike
TERMINATED = "terminated; the build's processes were stopped and its temporary folder removed"


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "softcapgrad" / "engines"


def folder(req: Requirements, root: Path | None = None) -> Path:
    return (root or cache_root()) / f"{req.name}-{req.digest[:DIGITS]}"


def interpreter(path: Path) -> Path:
    return path / "bin" / "python"


@dataclass(frozen=True)
class State:
    name: str
    state: str  # one of STATES
    path: Path | None  # the current key's folder (None for main)
    python: Path | None  # the interpreter to run the engine with, when installed
    versions: dict  # package -> version (from the stamp, or the main environment's metadata)
    size: int  # bytes on disk of this name's folders (current and stale)
    reason: str  # why broken, stale or untrusted, in words; "" otherwise
    suspect: Path | None = None  # untrusted: the folder to remove (the environment's, or the whole cache's)


def _others(name: str, keep: Path | None, root: Path) -> list[Path]:
    """This name's folders of other keys (stale ones), never another name's (``a-b`` is not ``a``'s)."""
    pattern = re.compile(re.escape(name) + r"-[0-9a-f]{%d}" % DIGITS)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if pattern.fullmatch(p.name) and p != keep)


def _stamp(path: Path) -> dict | None:
    try:
        stamp = json.loads((path / STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
        return None
    return stamp if isinstance(stamp, dict) and isinstance(stamp.get("versions"), dict) else None


def _broken(path: Path, req: Requirements) -> str:
    """Why the folder at the current key is not a usable environment ("" when it is)."""
    stamp = _stamp(path)
    if stamp is None:
        return f"its stamp {STAMP} is missing or unreadable (an interrupted or damaged build)"
    if stamp.get("sha256") != req.digest:
        return "its stamp names other requirements than its folder's key"
    python = interpreter(path)
    if not os.access(python, os.X_OK):
        return f"its interpreter {python.relative_to(path)} is missing"
    return ""


def main_state(needs: tuple[str, ...] = ("torch", "transformers")) -> State:
    from importlib import metadata

    versions, absent = {}, []
    for name in needs:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            absent.append(name)
    state = "not installed" if absent else "installed"
    return State(MAIN, state, None, Path(sys.executable), versions, 0,
                 f"needs {', '.join(absent)} in softcapgrad's own environment" if absent else "")


def state(name: str, root: Path | None = None, path: Path | None = None) -> State:
    if name == MAIN:
        return main_state()
    root = root or cache_root()
    req = read(name, path)
    here = folder(req, root)
    if root.is_dir() and (why := trust.root_distrust(root)):
        return State(name, "untrusted", here, None, {}, 0, why, root)
    stale = _others(name, here, root)
    size = sum(trust.size(p) for p in stale)
    if os.path.lexists(here):
        bytes_, within = trust.walk(here)
        size += bytes_
        why = trust.environment_distrust(here, within, interpreter(here))
        if why:
            return State(name, "untrusted", here, None, {}, size, why, here)
        why = _broken(here, req)
        if why:
            return State(name, "broken", here, None, {}, size, why)
        return State(name, "installed", here, interpreter(here), _stamp(here)["versions"], size, "")
    if stale:
        return State(name, "stale", here, None, {}, size, "its requirements changed since it was built")
    return State(name, "not installed", here, None, {}, 0, "")


@contextlib.contextmanager
def _locked(root: Path, name: str) -> Iterator[None]:
    """An exclusive lock on ``<root>/<name>.lock`` (the kernel's: released when the process ends, however)."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{name}.lock", "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _base_python(req: Requirements) -> str:
    if req.python is None or req.python == f"{sys.version_info[0]}.{sys.version_info[1]}":
        return sys.executable
    found = shutil.which(f"python{req.python}")
    if found is None:
        raise InputError(f"engine environment {req.name} needs Python {req.python}: no python{req.python} on PATH")
    return found


def sweep(root: Path | None = None, say: Say = lambda line: None) -> list[Path]:
    """Remove the temporary folders of builds whose process is gone (killed outright, so that nothing of theirs
    could remove them), one line each; those removed. An untrusted cache is left alone."""
    root = root or cache_root()
    if not root.is_dir() or trust.root_distrust(root):
        return []
    removed = []
    for path in sorted(root.iterdir()):
        found = BUILDING.fullmatch(path.name)
        if found and not child.alive(int(found[1])):
            shutil.rmtree(path, ignore_errors=True)
            if not os.path.lexists(path):
                say(f"removed {path.name}, left by a build that was stopped (process {found[1]} is gone)")
                removed.append(path)
    return removed


def refusal(st: State, engine: str | None = None) -> str:
    """The one line that refuses an untrusted environment, naming what to remove."""
    return (f"engine {engine or st.name}: its environment {st.name} is untrusted ({st.reason}), so nothing in it "
            f"is run: remove {st.suspect} (rm -rf {st.suspect}), then softcapgrad engines install {engine or st.name}")


def build(req: Requirements, root: Path | None = None, say: Say = lambda line: None) -> Path:
    """The environment of ``req``, built if absent (or broken), reused otherwise; its folder. SIGTERM meanwhile
    ends the step running (its whole process group) and removes the temporary folder, as Ctrl-C does."""
    root = root or cache_root()
    here = folder(req, root)
    with child.terminating(TERMINATED), owner_only.owner_writes_only():
        root.mkdir(parents=True, exist_ok=True)
        if why := trust.root_distrust(root):
            raise InputError(refusal(State(req.name, "untrusted", here, None, {}, 0, why, root)))
        with _locked(root, req.name):
            if _build(req, root, here, say):
                say(f"{req.name}: installed ({trust.size(here) / 2**20:.0f} MiB)")
    return here


def _build(req: Requirements, root: Path, here: Path, say: Say) -> bool:
    """Build into ``here`` unless a usable environment is there; whether it built."""
    sweep(root, say)
    if os.path.lexists(here):
        if why := trust.environment_distrust(here, trust.walk(here)[1], interpreter(here)):
            raise InputError(refusal(State(req.name, "untrusted", here, None, {}, 0, why, here)))
        if not _broken(here, req):
            return False
    tmp = root / f".{here.name}.building-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        say(f"{req.name}: creating a virtual environment")
        bare = [] if req.packages or req.removals else ["--without-pip"]  # nothing to install: no pip either
        _step([_base_python(req), "-I", "-m", "venv", *bare, str(tmp)], root, say, req.name, 0)
        python = str(interpreter(tmp))
        os.mkdir(scratch := tmp / ".scratch")  # pip's TMPDIR: goes with the build however it ends
        if req.packages:
            _step([python, "-I", "-m", "pip", "install", "--no-deps", "--disable-pip-version-check",
                   "--no-input", "-r", str(req.path)], tmp, say, req.name, len(req.packages), scratch)
        if req.removals:
            _step([python, "-I", "-m", "pip", "uninstall", "-y", *req.removals], tmp, say, req.name, 0, scratch)
        for script in req.then:  # e.g. llama.cpp's converter, taken from the source distribution pip built
            say(f"{req.name}: running {script}")
            _step([python, "-I", str(adapter_file(script))], tmp, say, req.name, 0, scratch)
        shutil.rmtree(scratch)  # empty unless a step left something there: not part of the environment
        stamp = {"sha256": req.digest, "requirements": req.path.name, "versions": _installed(python, tmp),
                 "python": subprocess.run([python, "-I", "-c", "import sys; print(sys.version.split()[0])"],
                                          cwd=tmp, capture_output=True, text=True, check=True).stdout.strip()}
        files.write_atomic(tmp / STAMP, json.dumps(stamp, indent=1, sort_keys=True) + "\n")  # last: the build is whole
        if here.exists():  # broken: replaced whole
            say(f"{req.name}: replacing the broken environment")
            shutil.rmtree(here)
        os.replace(tmp, here)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for old in _others(req.name, here, root):
        say(f"{req.name}: removing the stale environment {old.name}")
        shutil.rmtree(old, ignore_errors=True)
    return True


def _installed(python: str, cwd: Path) -> dict:
    code = ("import json, importlib.metadata as m; print(json.dumps({d.metadata['Name']: d.version for d in "
            "m.distributions() if d.metadata['Name'] not in ('pip', 'setuptools', 'wheel')}, sort_keys=True))")
    out = subprocess.run([python, "-I", "-c", code], cwd=cwd, capture_output=True, text=True, check=True).stdout
    return dict(sorted(json.loads(out).items(), key=lambda kv: kv[0].lower()))


def install(name: str, root: Path | None = None, say: Say = lambda line: None, path: Path | None = None) -> State:
    if name == MAIN:
        return main_state()
    req = read(name, path)
    try:
        build(req, root, say)
    except BuildError as err:
        raise InputError(f"engine environment {name} could not be installed: {err}") from None
    return state(name, root, path)


def remove(name: str, root: Path | None = None, path: Path | None = None) -> int:
    """Every folder of ``name`` (current and stale); the bytes freed."""
    if name == MAIN:
        raise InputError("the environment main is softcapgrad's own: nothing to remove")
    root = root or cache_root()
    req = read(name, path)
    freed = 0
    with _locked(root, name):
        for p in [folder(req, root), *_others(name, None, root)]:
            if p.is_symlink():  # a planted link: the link goes, never what it points at
                p.unlink()
            elif p.exists():
                freed += trust.size(p)
                shutil.rmtree(p)
    return freed


def start(names, root: Path | None = None, say: Say = lambda line: None) -> dict:
    """Start building, in the background, each of ``names`` that is not installed, ``BUILDS_AT_ONCE`` at a time:
    name -> a Future of its State (as ``ready(name, True)`` returns it, or its InputError). Each build holds its own
    lock and is renamed into place whole, so one left to finish at the interpreter's exit is never half-made, and
    two processes starting the same list build each environment once, still at most ``BUILDS_AT_ONCE`` at a time:
    the second waits on the first's locks in the same order."""
    from concurrent.futures import ThreadPoolExecutor

    missing = _missing(names, root)
    if not missing:
        return {}
    pool = ThreadPoolExecutor(max_workers=min(BUILDS_AT_ONCE, len(missing)), thread_name_prefix="softcapgrad-build")
    try:
        return {n: pool.submit(ready, n, True, root, say) for n in missing}
    finally:
        pool.shutdown(wait=False)  # the submitted builds run on; the exit waits for them


def _missing(names, root: Path | None) -> list[str]:
    """``names`` without repeats, less ``main`` and those installed: the builds to run."""
    return [n for n in dict.fromkeys(names) if n != MAIN and state(n, root).state != "installed"]


def build_all(names, jobs: int, root: Path | None = None, say: Say = lambda line: None) -> dict:
    """Each of ``names`` that is not installed, built ``jobs`` at a time, never more than ``BUILDS_AT_ONCE``: name ->
    its State, or the InputError that refused it or says why it failed. Ctrl-C or SIGTERM meanwhile kills every
    build's running step (its whole process group), waits for each build to remove its temporary folder, and then
    goes on up as an interrupt."""
    from concurrent.futures import ThreadPoolExecutor

    missing = _missing(names, root)
    done: dict = {}
    if not missing:
        return done
    at_once = min(max(1, jobs), BUILDS_AT_ONCE, len(missing))
    with child.terminating(TERMINATED), owner_only.owner_writes_only(), \
            ThreadPoolExecutor(max_workers=at_once, thread_name_prefix="softcapgrad-build") as pool:
        build_steps.clear_stop()
        futures = {n: pool.submit(_outcome, n, root, say) for n in missing}
        try:
            for name, future in futures.items():
                done[name] = future.result()
        except BaseException:  # on the main thread: the worker threads cannot be signalled, their steps are killed
            build_steps.stop_all()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    return done


def _outcome(name: str, root: Path | None, say: Say):
    try:
        return ready(name, True, root, say)
    except InputError as err:
        return err


def ready(name: str, install_it: bool, root: Path | None = None, say: Say = lambda line: None,
          engine: str | None = None, path: Path | None = None) -> State:
    """The environment, installed now if ``install_it``; otherwise one line naming the command."""
    current = state(name, root, path)
    if current.state == "installed":
        return current
    engine = engine or name
    if current.state == "untrusted":
        raise InputError(refusal(current, engine))
    if name == MAIN:
        raise InputError(f"engine {engine} runs in softcapgrad's own environment, which {current.reason}: "
                         "pip install 'softcapgrad[hf]'")
    if install_it:
        return install(name, root, say, path)
    why = {"not installed": "is not installed", "stale": "is stale (its requirements changed)",
           "broken": f"is broken ({current.reason})"}[current.state]
    raise InputError(f"engine {engine}: its environment {name} {why}: softcapgrad engines install {engine} "
                     "(or parity --install)")
