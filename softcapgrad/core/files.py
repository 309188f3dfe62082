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


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path``; on success it replaces ``path``, on any failure it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
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
