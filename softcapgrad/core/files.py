"""Files written whole or not at all.

Every result, ledger and figure goes to a temporary file in the destination's own folder, is
flushed to disk, and then replaces the destination with one ``os.replace``: an interrupt or a full
disk leaves the old file (or none), never a truncated one.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator

from softcapgrad.core.checks import InputError


def readable_file(path: Path, kinds: tuple[str, ...], option: str = "") -> str:
    """Check that ``path`` is an existing file whose suffix is one of ``kinds``; return that suffix."""
    path = Path(path)
    where = f"{option} {path}".strip()
    if not path.exists():
        raise InputError(f"{where}: no such file")
    if not path.is_file():
        raise InputError(f"{where}: not a file")
    kind = path.suffix.lower()
    if kind not in kinds:
        raise InputError(f"{where}: unsupported file kind {kind or '(none)'}; expected one of {', '.join(kinds)}")
    return kind


def writable_target(path: Path, option: str) -> Path:
    """Check, before any computation, that ``path`` can be written: its folder exists or can be made."""
    path = Path(path)
    if path.exists() and path.is_dir():
        raise InputError(f"{option} {path}: is a folder, expected a file path")
    folder = path.parent if str(path.parent) else Path(".")
    writable_folder(folder, option)
    return path


def writable_folder(folder: Path, option: str) -> Path:
    folder = Path(folder)
    probe = folder
    while not probe.exists():  # the first existing ancestor decides whether the folder can be made
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise InputError(f"{option} {folder}: {probe} is a file, not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise InputError(f"{option} {folder}: cannot write in {probe}")
    return folder


def umask_mode(full: int = 0o666) -> int:
    """``full`` less the process's umask: the mode ``open`` would have given a new file (0o777 for a folder).
    mkstemp and mkdtemp create 0600 and 0700 whatever the umask; their results are set to this."""
    mask = os.umask(0)
    os.umask(mask)
    return full & ~mask


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path``; on success it replaces ``path``, on any failure it is removed.
    The file gets the mode a plain ``open`` would give it under the user's umask."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, umask_mode())
    finally:
        os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_atomic(path: Path, data: str | bytes) -> None:
    with atomic_path(path) as tmp:
        if isinstance(data, str):
            tmp.write_text(data, encoding="utf-8")
        else:
            tmp.write_bytes(data)


class Interrupted(KeyboardInterrupt):
    """An interrupt during :func:`replace_all`; ``message`` says exactly which files were replaced."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def check_targets(paths: list[Path], option: str) -> None:
    """Before any computation: each target can be replaced (its folder exists or can be made and
    is writable; the target is not a folder), and so can the folder beside which the set is staged."""
    for path in paths:
        writable_target(path, option)
        folder = Path(path).parent
        if folder.exists() and not os.access(folder, os.W_OK | os.X_OK):
            raise InputError(f"{option} {folder}: cannot write in {folder}")


def replace_all(files: dict[Path, str | bytes], out: Path) -> list[Path]:
    """Write every file into a temporary folder beside ``out``, then move them into place, last.

    An interrupt while the files are written leaves every target as it was; during the moves (a
    few renames) it is held back until they are done, so the set is replaced whole or not at all.
    Either way an :class:`Interrupted` says which. Returns the targets, in order."""
    import signal

    out = Path(out)
    targets = list(files)
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        staged = {}
        for i, (path, data) in enumerate(files.items()):
            staged[path] = stage / f"{i}{Path(path).suffix}"
            write_atomic(staged[path], data)
    except KeyboardInterrupt:
        _remove(stage)
        raise Interrupted(f"interrupted before any file was replaced; {len(targets)} file(s) left as they were") from None
    except BaseException:
        _remove(stage)
        raise
    held: list[object] = []
    try:
        previous = signal.signal(signal.SIGINT, lambda *_: held.append(True))
    except ValueError:  # not the main thread: nothing to hold back
        previous = None
    try:
        for path in targets:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            os.replace(staged[path], path)
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
        _remove(stage)
    if held:
        raise Interrupted(f"interrupted after all {len(targets)} file(s) were replaced (the set is whole)")
    return targets


def _remove(folder: Path) -> None:
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
