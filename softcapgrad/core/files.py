"""Files written whole or not at all.

Every result, ledger and figure goes to a temporary file in the destination's own folder, is
flushed to disk, and then replaces the destination with one ``os.replace``: an interrupt or a full
disk leaves the old file (or none), never a truncated one. Only a regular file or a new name is ever
replaced: a symbolic link, FIFO, device node or folder in a target's place is refused, never followed
or turned into a regular file, and every target is checked before the computation that fills it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import stat
import tempfile
from pathlib import Path
from typing import Iterator

from softcapgrad.core.checks import NAME_MAX, InputError, usable_path


def readable_file(path: Path, kinds: tuple[str, ...], option: str = "") -> str:
    """Check that ``path`` is an existing file whose suffix is one of ``kinds``; return that suffix."""
    path = usable_path(option, path)
    where = f"{option} {path}".strip()
    if not path.exists():
        raise InputError(f"{where}: no such file")
    if not path.is_file():
        raise InputError(f"{where}: not a file")
    kind = path.suffix.lower()
    if kind not in kinds:
        raise InputError(f"{where}: unsupported file kind {kind or '(none)'}; expected one of {', '.join(kinds)}")
    return kind


def node_kind(mode: int) -> str:
    """What a file system node other than a regular file is, in words."""
    for test, kind in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a regular file"


def replaceable(path: Path, option: str = "") -> None:
    """``path`` is absent or a regular file (not followed if a symbolic link): what a rename may replace.
    A link, FIFO, device node or folder is refused, never replaced by a regular file."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as err:
        raise InputError(f"{option} {path}: {err.strerror}".strip()) from None
    if not stat.S_ISREG(mode):
        kind = node_kind(mode)
        raise InputError(f"{option} {path}: is {kind}; only a regular file or a new name is replaced".strip()
                         if kind != "a folder" else f"{option} {path}: is a folder, expected a file path".strip())


def _names_fit(path: Path, option: str) -> None:
    usable_path(option, path)


def _probe(folder: Path, option: str, shown: Path) -> None:
    """Create and remove a file in ``folder``: the one test that no permission bit, read-only mount,
    /proc or /sys file system, or root's bypass of the bits can fool."""
    try:
        fd, name = tempfile.mkstemp(prefix=".softcapgrad-probe.", suffix=".tmp", dir=folder)
        os.close(fd)
        os.unlink(name)
    except OSError as err:
        raise InputError(f"{option} {shown}: cannot write in {folder} ({err.strerror or err})") from None


def writable_target(path: Path, option: str, new_folder: bool = False) -> Path:
    """Check, before any computation, that the file ``path`` can be written whole: its name fits, it is a
    regular file or a new name, and its folder exists (or, with ``new_folder``, can be made) and takes
    new files."""
    path = Path(path)
    _names_fit(path, option)
    replaceable(path, option)
    folder = path.parent if str(path.parent) else Path(".")
    if new_folder:
        writable_folder(folder, option)
    elif not folder.is_dir():
        what = "is not a folder" if folder.exists() or folder.is_symlink() else "does not exist"
        raise InputError(f"{option} {path}: {folder} {what}")
    else:
        _probe(folder, option, path)
    return path


def writable_folder(folder: Path, option: str) -> Path:
    """Check that ``folder`` is a folder that takes new files, or that its first existing ancestor is
    one (the rest of the folder is made when the files are written)."""
    folder = Path(folder)
    _names_fit(folder, option)
    probe = folder
    while not probe.exists():  # the first existing ancestor decides whether the folder can be made
        if probe.parent == probe or probe.is_symlink():
            break
        probe = probe.parent
    if not probe.is_dir():
        what = ("a dangling symbolic link" if probe.is_symlink() and not probe.exists() else
                "a file" if probe.is_file() else node_kind(os.stat(probe).st_mode))
        raise InputError(f"{option} {folder}: {probe} is {what}, not a folder")
    _probe(probe, option, folder)
    return folder


def umask_mode(full: int = 0o666) -> int:
    """``full`` less the process's umask: the mode ``open`` would have given a new file (0o777 for a folder).
    mkstemp and mkdtemp create 0600 and 0700 whatever the umask; their results are set to this."""
    mask = os.umask(0)
    os.umask(mask)
    return full & ~mask


def distrust(path: Path, what: str, owners: tuple[int, ...] = (), info: os.stat_result | None = None) -> str:
    """Why ``path`` (a link is not followed) may hold what someone other than this user put or changed there, in
    words after ``what``; "" when it cannot: it is this user's (or one of ``owners``') and, unless it is a link,
    neither its group nor others may write it."""
    try:
        info = info or os.lstat(path)
    except OSError as err:
        return f"{what} cannot be read ({err.strerror})"
    if info.st_uid != os.geteuid() and info.st_uid not in owners:
        return f"{what} is owned by another user (uid {info.st_uid})"
    if not stat.S_ISLNK(info.st_mode) and info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{what} is writable by {'others' if info.st_mode & stat.S_IWOTH else 'its group'}"
    return ""


def distrust_folder(folder: Path, what: str) -> str:
    """:func:`distrust` for a folder that may be reached through a link: the link, then the folder it leads to."""
    return distrust(folder, what) or distrust(Path(folder).resolve(), what)


UNWRITABLE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS)  # the disk refuses the bytes


class CannotWrite(InputError):
    """A target the disk would not take (full, over quota, read-only, failing): one line and exit 2, as any
    target that cannot be written; ``reason`` is the system's word for it."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason or message


def _temp_prefix(name: str) -> str:
    """``.name.`` for a temporary name beside ``name``, cut so that the whole temporary name (mkstemp adds 8
    characters and ``.tmp``) stays within NAME_MAX bytes."""
    room = NAME_MAX - len(".") - len(".") - 8 - len(".tmp")
    return "." + os.fsencode(name)[:room].decode(errors="ignore") + "."


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path``; on success it replaces ``path``, on any failure it is removed.
    The file gets the mode a plain ``open`` would give it under the user's umask. A ``path`` that is
    not a regular file (a link, FIFO, device node, folder) is refused, before and again at the rename."""
    path = Path(path)
    replaceable(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path.name), suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, umask_mode())
    finally:
        os.close(fd)
    try:
        try:
            yield Path(tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        except OSError as err:  # a full disk, a quota, an I/O error: the file was not written, nothing replaced
            if err.errno not in UNWRITABLE:
                raise
            raise CannotWrite(f"{path}: cannot write ({err.strerror}); it was left as it was", err.strerror) from None
        replaceable(path)
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
    """An interrupt (SIGINT) or termination (SIGTERM) during :func:`replace_all`; ``message`` says exactly
    which files were replaced, ``signum`` which signal came."""

    def __init__(self, message: str, signum: int = signal.SIGINT) -> None:
        super().__init__(message)
        self.message = message
        self.signum = signum


class _Terminated(KeyboardInterrupt):
    """SIGTERM while the set is being written: unwound like an interrupt, so the stage is removed."""


def _raise_terminated(signum, frame) -> None:
    raise _Terminated


def _handle(handler, signums: tuple[int, ...]) -> dict:
    """``handler`` for each of ``signums``; the previous handlers, to put back. Off the main thread no
    handler can be set: nothing is held."""
    previous = {}
    for signum in signums:
        try:
            previous[signum] = signal.signal(signum, handler)
        except ValueError:
            break
    return previous


def _put_back(previous: dict) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def check_targets(paths: list[Path], option: str) -> None:
    """Before any computation: each target can be replaced (a regular file or a new name; its folder
    exists or can be made, and takes new files)."""
    for path in paths:
        writable_target(path, option, new_folder=True)


def _verb(signum: int) -> str:
    return "terminated" if signum == signal.SIGTERM else "interrupted"


def _made_folders(folder: Path) -> list[Path]:
    """Make ``folder`` and its missing ancestors; the ones made, innermost first (removed again on failure)."""
    missing = []
    probe = Path(folder)
    while not probe.exists() and probe.parent != probe:
        missing.append(probe)
        probe = probe.parent
    Path(folder).mkdir(parents=True, exist_ok=True)
    return missing


def _renamable(staged: Path, path: Path) -> None:
    """The staged file can replace ``path`` with one rename: ``path`` is still a regular file or a new name,
    and the stage lies on the file system of ``path``'s folder (a rename never crosses file systems)."""
    replaceable(path)
    try:
        same = os.stat(staged).st_dev == os.stat(Path(path).parent).st_dev
    except OSError as err:
        raise CannotWrite(f"{path}: cannot write ({err.strerror or err}); no file was replaced") from None
    if not same:
        raise CannotWrite(f"{path}: its folder changed file system while the files were written; no file was replaced")


def replace_all(files: dict[Path, str | bytes], out: Path) -> list[Path]:
    """Write every file of the set ``out`` into a stage, then move them into place, last.

    Each target folder gets its own stage inside it, so every stage lies on its target's own file
    system (``out`` a mount point, a ``figures/`` link to another disk): each move is one rename, and
    every rename is checked possible before the first. An interrupt or a SIGTERM while the files are
    written leaves every target as it was (the stages and the folders made for them are removed);
    during the moves (a few renames) both are held back until they are done and the stages are gone,
    so the set is replaced whole or not at all. Either way an :class:`Interrupted` says which files.
    A disk that fills (or any write that fails) while the files are written is a :class:`CannotWrite`
    and replaces nothing; a move that fails puts back the files moved before it (each old file is
    hard-linked into the stage first) and says what, if anything, it could not put back. Returns the
    targets, in order; they are also noted in every open :func:`softcapgrad.core.replaced.record`."""
    from softcapgrad.core import replaced

    targets = list(files)
    original = _handle(_raise_terminated, (signal.SIGTERM,))
    held: list[int] = []
    stages: dict[Path, Path] = {}  # target folder -> its stage
    made: list[Path] = []
    try:
        staged = {}
        for i, (path, data) in enumerate(files.items()):
            try:
                folder = Path(path).parent
                if folder not in stages:
                    made[:0] = _made_folders(folder)
                    stages[folder] = Path(tempfile.mkdtemp(prefix=_temp_prefix(Path(out).name), suffix=".tmp",
                                                           dir=folder))
                staged[path] = stages[folder] / f"{i}{Path(path).suffix}"
                write_atomic(staged[path], data)
            except CannotWrite as err:
                raise CannotWrite(f"{path}: cannot write ({err.reason}); no file was replaced") from None
            except OSError as err:  # a folder that stopped taking files, a lost permission: nothing replaced either
                raise CannotWrite(f"{path}: cannot write ({err.strerror or err}); no file was replaced") from None
        for path in targets:  # every rename is possible before the first one (a node that appeared is refused)
            _renamable(staged[path], path)
        # from here both signals are held (no moment between the two handlers where SIGTERM kills)
        original = {**_handle(lambda signum, frame: held.append(signum), (signal.SIGINT, signal.SIGTERM)), **original}
    except KeyboardInterrupt as err:
        _put_back(original)
        _remove(stages.values(), made)
        signum = signal.SIGTERM if isinstance(err, _Terminated) else signal.SIGINT
        raise Interrupted(f"{_verb(signum)} before any file was replaced; {len(targets)} file(s) left as they were",
                          signum) from None
    except BaseException:
        _put_back(original)
        _remove(stages.values(), made)
        raise
    undone = False
    try:
        kept, fresh = _keep_old(targets, stages)
        moved: list[Path] = []
        try:
            for path in targets:
                os.replace(staged[path], path)
                moved.append(path)
        except OSError as err:
            still = _put_old_back(moved, kept, fresh)
            undone = not still
            raise CannotWrite(f"{path}: cannot write ({err.strerror or err}); " + (
                "no file was replaced" if undone else
                f"replaced: {', '.join(map(str, still))}; the others were left as they were")) from None
        replaced.note(targets)
    finally:
        _remove(stages.values(), made if undone else [])  # before the signals come back: nothing left to undo
        _put_back(original)
    if held:
        signum = signal.SIGTERM if signal.SIGTERM in held else signal.SIGINT
        raise Interrupted(f"{_verb(signum)} after all {len(targets)} file(s) were replaced (the set is whole): "
                          + ", ".join(map(str, targets)), signum)
    return targets


def _keep_old(targets: list[Path], stages: dict[Path, Path]) -> tuple[dict[Path, Path], set[Path]]:
    """Before the moves: each target that exists hard-linked into its stage (no byte copied), to be put back if a
    later move fails; and the targets that are new names. A file system without hard links keeps no link: a
    failed move then says which of those it left replaced."""
    kept, fresh = {}, set()
    for i, path in enumerate(targets):
        if not os.path.lexists(path):
            fresh.add(path)
            continue
        link = stages[Path(path).parent] / f"{i}.old"
        with contextlib.suppress(OSError):
            os.link(path, link, follow_symlinks=False)
            kept[path] = link
    return kept, fresh


def _put_old_back(moved: list[Path], kept: dict[Path, Path], fresh: set[Path]) -> list[Path]:
    """Undo the moves done, last first: the old file linked back, a new name removed. Returns those left new."""
    still = []
    for path in reversed(moved):
        try:
            if path in kept:
                os.replace(kept[path], path)
            elif path in fresh:
                os.unlink(path)
            else:
                still.append(path)
        except OSError:
            still.append(path)
    return still[::-1]


def _remove(stages, made: list[Path] = ()) -> None:
    """The stages, then the folders made for them (innermost first) where they are empty."""
    import shutil

    for stage in stages:
        shutil.rmtree(stage, ignore_errors=True)
    for folder in made:
        with contextlib.suppress(OSError):
            folder.rmdir()
