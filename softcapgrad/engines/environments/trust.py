"""Whether what the engine cache holds may be run: no one but this user can have put it there or changed it.

The cache folder, every file and folder of an environment (links included) and its stamp must be this
user's and writable by neither group nor others, and the interpreter its link leads to this user's,
root's or the one running softcapgrad. So must every folder above the cache folder and above each link on the
way to the interpreter (``$XDG_CACHE_HOME``, its ``softcapgrad/``, ..., ``/``), as written and as its links
resolve, this user's or root's: one that others may write lets them rename what is below it and put their own in
its place, unless its sticky bit (``/tmp``) keeps them to their own names. Anything else is *untrusted*
(engines/environments/environments.py lists it with the reason, never runs it, and refuses it in one line naming what to
remove). The stamp itself proves only
that a build finished (it is written last, by our build, with the requirements' sha256): it can be copied,
so ownership and permissions are the check, and a build makes every file writable by its owner alone
(``core.owner_only.owner_writes_only``) so that its own environments pass it.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

from softcapgrad.core import files


def walk(path: Path) -> tuple[int, str]:
    """Bytes on disk of the files under ``path`` (links not followed), and why one of its nodes may have been put
    or changed by someone else ("" when none may)."""
    total, why = 0, ""
    for dirpath, folders, names in os.walk(path):
        for name in folders + names:
            node = os.path.join(dirpath, name)
            try:
                info = os.lstat(node)
            except OSError:
                continue
            if not stat.S_ISDIR(info.st_mode):
                total += info.st_size
            why = why or files.distrust(node, os.path.relpath(node, path), info=info)
    return total, why


def size(path: Path) -> int:
    return walk(path)[0]


def above_distrust(path: Path, what: str) -> str:
    """Why a folder above ``path`` may let someone else replace ``path`` ("" when none may): each one from ``/``
    down, as written and as its links resolve, must be this user's or root's and, unless its sticky bit keeps
    others to their own names, writable by neither group nor others. ``what`` names ``path`` in the reason."""
    written, real = Path(os.path.abspath(path)), Path(os.path.realpath(path))
    for folder in dict.fromkeys([*reversed(written.parents), *reversed(real.parents)]):
        try:
            info = os.lstat(folder)
        except OSError as err:
            return f"{folder}, a folder above {what}, cannot be read ({err.strerror})"
        sticky = stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_ISVTX
        if sticky:  # others may add names there, but neither rename nor remove this user's or root's
            info = os.stat_result((info.st_mode & ~0o022, *list(info)[1:10]))
        why = files.distrust(folder, f"{folder}, a folder above {what},", owners=(0,), info=info)
        if why:
            return why
    return ""


def _hops(python: Path) -> list[Path]:
    """Each link on the way from ``python`` to the file it leads to, and that file (at most 40 links)."""
    hops = [Path(os.path.abspath(python))]
    while os.path.islink(hops[-1]) and len(hops) <= 40:
        hops.append(Path(os.path.abspath(hops[-1].parent / os.readlink(hops[-1]))))
    return hops


def root_distrust(root: Path) -> str:
    """Why the cache folder itself, or a folder above it, is not to be trusted ("" when it is)."""
    return files.distrust_folder(root, f"the cache folder {root}") or above_distrust(root, "the cache folder")


def environment_distrust(path: Path, within: str, python: Path) -> str:
    """Why the environment at ``path`` may hold what someone other than this user put there ("" when it cannot);
    ``within``: why one of its nodes is not trusted, from the walk that sized it; ``python``: its interpreter."""
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        return "its folder is a symbolic link"
    why = files.distrust(path, "its folder", info=info) or (f"its file or folder {within}" if within else "")
    if why:
        return why
    for hop in _hops(python)[1:]:  # the environment's own bin/python was walked above
        why = files.distrust(hop, f"its interpreter's link {hop}", owners=(0,)) if os.path.islink(hop) else ""
        why = why or above_distrust(hop, f"its interpreter {hop}")
        if why:
            return why
    real = Path(os.path.realpath(python))
    ours = {os.path.realpath(p) for p in (sys.executable, getattr(sys, "_base_executable", sys.executable))}
    if real.exists() and str(real) not in ours:
        return files.distrust(real, f"its interpreter {real}", owners=(0,)) or \
            files.distrust(real.parent, f"its interpreter's folder {real.parent}", owners=(0,))
    return ""
