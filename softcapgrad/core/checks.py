"""Input validation shared by every command: one clear sentence per bad value."""

from __future__ import annotations

import math
from typing import Iterable


class InputError(ValueError):
    """A bad input the user can fix; the CLI prints it as one line and exits 2."""


def positive(name: str, value: float) -> float:
    if not math.isfinite(value) or value <= 0:
        raise InputError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


FP32_NORMAL_RANGE = (2.0**-126, 3.4028234663852886e38)  # smallest normal and largest finite fp32


def in_range(name: str, value: float, lo: float, hi: float, why: str) -> float:
    """lo <= value <= hi, else one line that names the range and why it is the range."""
    if not (math.isfinite(value) and lo <= value <= hi):
        raise InputError(f"{name} {value:g}: {why}, so it must lie in [{lo:.4g}, {hi:.4g}]")
    return float(value)


def fp32_cap(name: str, value: float) -> float:
    """A cap the stacks can divide by: the eager and compiled caps compute a/c in fp32."""
    positive(name, value)
    return in_range(name, value, *FP32_NORMAL_RANGE, "the stacks compute a/c in fp32 (normal range)")


def positives(name: str, values: Iterable[float]) -> list[float]:
    return [positive(name, v) for v in values]


def finite(name: str, value: float) -> float:
    if not math.isfinite(value):
        raise InputError(f"{name} must be finite, got {value!r}")
    return float(value)


def at_least(name: str, value: int, low: int) -> int:
    if value < low:
        raise InputError(f"{name} must be at least {low}, got {value!r}")
    return value


def within(name: str, value: float, lo: float, hi: float, *, closed_lo: bool = False) -> float:
    """lo < value < hi (or lo <= value with closed_lo)."""
    ok = math.isfinite(value) and (lo <= value if closed_lo else lo < value) and value < hi
    if not ok:
        bracket = "[" if closed_lo else "("
        raise InputError(f"{name} must lie in {bracket}{lo:g}, {hi:g}), got {value!r}")
    return float(value)


def increasing_range(name: str, lo: float, hi: float) -> tuple[float, float]:
    finite(name, lo)
    finite(name, hi)
    if not lo < hi:
        raise InputError(f"{name} must be a non-empty range LO < HI, got {lo!r} {hi!r}")
    return float(lo), float(hi)


def suggestion(value: str, allowed: Iterable[str]) -> str:
    """'; did you mean X?' for the closest accepted value, or nothing when none is close."""
    import difflib

    key, original = value.strip().lower(), {a.lower(): a for a in allowed}
    starts = sorted((a for a in original if key and a.startswith(key)), key=len)
    close = starts[:1] or difflib.get_close_matches(key, list(original), n=1, cutoff=0.6)
    if not close:
        return ""
    original = original[close[0]]
    return f"; did you mean {original!r}?"


def choice(name: str, value: str, allowed: Iterable[str]) -> str:
    """The accepted value matching ``value`` without regard to case; else one line with the accepted values."""
    allowed = tuple(allowed)
    folded = {a.lower(): a for a in allowed}
    key = value.strip().lower()
    if key not in folded:
        raise InputError(f"{name} {value!r} is not accepted: use one of {', '.join(allowed)}{suggestion(value, allowed)}")
    return folded[key]


NAME_MAX, PATH_MAX = 255, 4096  # bytes in one name and in a whole path where the file system does not say (Linux)


def printable(text: str) -> str:
    """``text`` with every character that does not print written as its escape (ESC as ``\\x1b``, a newline as
    ``\\n``, a right-to-left override as ``\\u202e``, a lone surrogate as ``\\udcff``), much as ``--json`` escapes
    them: a string read from a file, a folder or a server can then neither move the cursor, clear the screen nor
    forge a line of the answer."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def _shown(text: str) -> str:
    """A name as one printable line (:func:`printable`), a long one cut in the middle."""
    text = printable(text)
    return text if len(text) <= 80 else f"{text[:40]}…{text[-30:]}"


def _limits(path: str) -> tuple[int, int]:
    """(NAME_MAX, PATH_MAX) of the file system that holds ``path``'s nearest existing folder."""
    import os

    folder = os.path.dirname(os.path.abspath(path)) if len(path) < PATH_MAX else "/" if path.startswith("/") else "."
    while not os.path.isdir(folder) and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
    limits = []
    for name, fallback in (("PC_NAME_MAX", NAME_MAX), ("PC_PATH_MAX", PATH_MAX)):
        try:
            limits.append(int(os.pathconf(folder, name)) or fallback)
        except (OSError, ValueError):
            limits.append(fallback)
    return limits[0], limits[1]


def usable_path(option: str, value) -> "Path":
    """A path the operating system can take, checked before any work: no NUL, valid in the file system's
    encoding, each name and the whole within the file system's limits, and not through a regular file
    (``file.txt/x``). A path that does not exist yet is fine (an output); what else it must be (a file to
    read, a folder that takes files) is checked where it is used. An empty path is refused: as a Path it would
    be the working folder. Returns it as a Path."""
    import errno
    import os
    import sys
    from pathlib import Path

    text = os.fspath(value)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    where = f"{option} {_shown(text)}".strip()
    if not text:  # Path("") is ".": an empty name would stand for the working folder
        raise InputError(f"{option + ': ' if option else ''}an empty path names no file or folder")
    if "\0" in text:
        raise InputError(f"{where}: holds a NUL byte, which no file name can")
    encoding = sys.getfilesystemencoding()
    try:
        raw = text.encode(encoding)
    except UnicodeEncodeError:
        raise InputError(f"{where}: not a valid {encoding} name (undecodable bytes or surrogates); "
                         "rename it or give it another way") from None
    name_max, path_max = _limits(text)
    if len(raw) >= path_max:
        raise InputError(f"{where}: the path is {len(raw):,} bytes long; at most {path_max - 1:,}")
    for part in Path(text).parts:
        size = len(part.encode(encoding))
        if size > name_max:
            raise InputError(f"{where}: a name in it is {size} bytes long; at most {name_max}")
    try:
        os.stat(text)
    except FileNotFoundError:
        pass
    except OSError as err:
        if err.errno == errno.ENOTDIR:
            through = next((p for p in Path(text).parents if os.path.lexists(p) and not os.path.isdir(p)), None)
            if through is not None:
                raise InputError(f"{where}: {_shown(str(through))} is a file, not a folder") from None
        raise InputError(f"{where}: {err.strerror}") from None
    return Path(text)
