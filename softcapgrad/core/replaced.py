"""What a command has put in place so far: the files each result set replaced, for an interrupt's one line.

``core/files.replace_all`` adds a set's targets here once every one of them is in place; the command line opens a
record around each command, so that an interrupt after a set was written names it instead of claiming that
nothing was. Only this module's import is paid at start (no tempfile, no signal).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

_OPEN: list[list[Path]] = []  # the records open now, innermost last


@contextlib.contextmanager
def record() -> Iterator[list[Path]]:
    """A list that receives, in order, every file a result set puts in place while the block runs."""
    paths: list[Path] = []
    _OPEN.append(paths)
    try:
        yield paths
    finally:
        _OPEN.pop()


def note(paths: list[Path]) -> None:
    """``paths`` are in place: every open record holds them."""
    for paths_so_far in _OPEN:
        paths_so_far.extend(Path(p) for p in paths)
