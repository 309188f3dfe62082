"""Measured dead zones kept on disk, so a repeated scan of a CPU stack needs numpy alone.

Where an eager CPU stack's gradient through the cap dies, for one scores format and cap, is a small fact
that takes ``import torch`` and a search over the format to find. Once measured it is kept in
``${XDG_CACHE_HOME:-~/.cache}/softcapgrad/stacks/dead-zones-<key>.json``; the key holds everything the
measurement can depend on: the installed torch, numpy and ml_dtypes versions (read from their metadata,
without importing them), the CPU (its architecture and its whole flag list, which decide the kernels ATen
dispatches to), ``ATEN_CPU_CAPABILITY``, and a hash of the code that measures. Another CPU, another
capability or another torch reads another file, so the cache answers exactly what a measurement would
answer here. On a CPU whose flags cannot be read, nothing is cached.

The file is JSON and only JSON: it is parsed, never executed or unpickled. It is used only where no one but
this user can have put or changed it: its folder and the file must be this user's and writable by neither
group nor others (the cache writes both so, whatever the umask). It is ignored, in one line on stderr, and
rewritten at the next measurement, when it is not such a file, is larger than ``MAX_BYTES``, does not parse,
carries another key, or holds an entry of any other shape; in a folder someone else may write nothing is
written. An entry whose values are not a dead zone the law allows (:func:`impossible`: a ≥ above or
a ≤ below with 0 < above and below < 0, finite values of its scores format, and the rest of it what its
name says) is ignored the same way, measured again and replaced. Files are written whole (``core.files``);
a cache folder that cannot be written only means the next run measures again.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
import platform
import stat
from importlib import metadata
from pathlib import Path

import numpy as np

from softcapgrad.core import files, owner_only
from softcapgrad.core.checks import InputError
from softcapgrad.laws import formats

FORMAT = "softcapgrad dead zones 1"
MAX_BYTES = 1 << 20
FIELDS = {"path": str, "scores": str, "cap": float, "above": (float, type(None)), "below": (float, type(None)),
          "one_sided": bool, "source": str, "reason": str}
_MEASURING = ("laws", "stacks", "training", "core")  # the package folders whose code a measurement runs
_LOG = logging.getLogger(__name__)  # unconfigured, Python writes its warnings to stderr as the bare line
_said: set[str] = set()  # each line once per process: every stack of a scan reads the same file


def folder() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "softcapgrad" / "stacks"


def cacheable(stack) -> bool:
    """Eager torch on the CPU: measured here, by torch alone (compiled code also depends on the C++ compiler)."""
    return stack.library == "torch" and stack.device == "cpu" and stack.engine == "torch-eager"


def _cpu() -> str | None:
    """The CPU as ATen sees it: architecture and the flag list of the first processor; None when unreadable."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            return f"{platform.machine()} {' '.join(sorted(value.split()))}"
    return None


def _versions() -> dict | None:
    try:
        return {name: metadata.version(name) for name in ("torch", "numpy", "ml_dtypes")}
    except metadata.PackageNotFoundError:
        return None


def _code() -> str:
    """A hash of the source that measures: a change to it measures again."""
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for sub in _MEASURING:
        for path in sorted((root / sub).glob("*.py")):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


@functools.cache
def key() -> dict | None:
    """What a measurement here depends on; None where it cannot be known (then nothing is cached)."""
    cpu, versions = _cpu(), _versions()
    if cpu is None or versions is None:
        return None
    return {"versions": versions, "cpu": hashlib.sha256(cpu.encode()).hexdigest()[:16],
            "aten_cpu_capability": os.environ.get("ATEN_CPU_CAPABILITY", ""), "code": _code()}


def _file(k: dict) -> Path:
    name = hashlib.sha256(json.dumps(k, sort_keys=True).encode()).hexdigest()[:16]
    return folder() / f"dead-zones-{name}.json"


def entry(path: str, scores: str, c: float, sigmoid: tuple[float, float, float]) -> str:
    """An entry's name: stack, scores format, cap and sigmoid constants, floats in hex (exact)."""
    return "|".join((path, scores, float(c).hex(), *(float(v).hex() for v in sigmoid)))


def _reject(constant: str):
    raise ValueError(f"non-finite number {constant} in the cache")


def _valid(zone) -> bool:
    if not isinstance(zone, dict) or set(zone) != set(FIELDS):
        return False
    for name, kind in FIELDS.items():
        value = zone[name]
        if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
            return False
        if isinstance(value, float) and not math.isfinite(value):
            return False
    return True


def impossible(name: str, zone: dict) -> str:
    """Why an entry of the right shape cannot be what a measurement stored under ``name`` ("" when it can be): its
    stack, format and cap are its name's, the cap is finite and > 0, the zone is a ≥ above or a ≤ below with
    0 < above and below < 0 (either side may be unknown), each a finite value of the scores format, one_sided says
    whether below is −above, it was measured, and its reason is one line."""
    parts = name.split("|")
    try:
        cap, constants = float.fromhex(parts[2]), [float.fromhex(p) for p in parts[3:]]
    except (IndexError, ValueError, OverflowError):
        return "its name is not one this cache writes"
    if len(constants) != 3 or (zone["path"], zone["scores"], zone["cap"]) != (parts[0], parts[1], cap):
        return "its stack, format or cap is not its name's"
    if not (math.isfinite(cap) and cap > 0):
        return f"its cap {cap!r} is not a finite number > 0"
    try:
        dtype = formats.resolve(zone["scores"])
    except InputError:
        return f"{zone['scores']!r} is not a float format"
    top = float(formats.finfo(dtype).max)
    for side, value, sign in (("≥", zone["above"], 1.0), ("≤", zone["below"], -1.0)):
        if value is not None and not 0 < sign * value <= top:
            return (f"a {side} {value:g} is no dead zone (the law: a ≥ h or a ≤ −h with 0 < h ≤ {top:g}, the largest "
                    f"{dtype.name})")
        if value is not None and float(np.asarray(value).astype(dtype)) != value:
            return f"{value!r} is not a {dtype.name} value"
    if zone["one_sided"] != (zone["below"] != (None if zone["above"] is None else -zone["above"])):
        return "its one_sided flag contradicts its two sides"
    if zone["source"] != "measured":
        return f"its source is {zone['source']!r}; only measured zones are kept"
    if not zone["reason"].isprintable() or len(zone["reason"]) > 500:
        return "its reason is not one line of text"
    return ""


def _read(path: Path, k: dict) -> tuple[dict, str]:
    """The entries of the cache file, and why it is ignored ("" when it is used, or there is none)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return {}, ""
    except OSError as err:
        return {}, f"it cannot be read ({err.strerror})"
    why = (files.distrust_folder(path.parent, f"its folder {path.parent}")
           or (f"it is {files.node_kind(info.st_mode)}" if not stat.S_ISREG(info.st_mode) else "")
           or files.distrust(path, "it", info=info)
           or (f"it is larger than {MAX_BYTES:,} bytes" if info.st_size > MAX_BYTES else ""))
    if why:
        return {}, why
    try:
        data = json.loads(path.read_bytes(), parse_constant=_reject)
    except (OSError, ValueError, RecursionError):
        return {}, "it is not JSON"
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("key") != k:
        return {}, "it is not a cache of this format and key"
    zones = data.get("zones")
    if not isinstance(zones, dict) or not all(isinstance(n, str) and _valid(z) for n, z in zones.items()):
        return {}, "it holds an entry of another shape"
    return zones, ""


def _say(line: str) -> None:
    if line not in _said:
        _said.add(line)
        _LOG.warning(line)


def lookup(name: str) -> dict | None:
    """The cached fields of one entry, or None (an ignored file or entry is said in one line)."""
    k = key()
    if k is None:
        return None
    path = _file(k)
    zones, why = _read(path, k)
    if why:
        kept = "" if not why.startswith("its folder") else f", and keeping nothing until {path.parent} is removed"
        _say(f"softcapgrad: the dead-zone cache {path} is ignored: {why}; measuring again{kept}")
        return None
    zone = zones.get(name)
    if zone is not None and (why := impossible(name, zone)):
        parts = name.split("|")
        shown = f"{parts[0]} ({parts[1]} scores, c = {zone['cap']:g})" if len(parts) > 1 else name
        _say(f"softcapgrad: the dead-zone cache entry for {shown} in {path} is ignored: {why}; measuring again")
        return None
    return zone


def store(name: str, zone: dict) -> None:
    """Add one measured entry; a cache that cannot be written is left as it is."""
    k = key()
    if k is None or not _valid(zone) or impossible(name, zone):
        return
    path = _file(k)
    if os.path.lexists(path.parent) and files.distrust_folder(path.parent, ""):
        return  # someone else may write there: what is written could not be trusted back
    zones = {n: z for n, z in _read(path, k)[0].items() if not impossible(n, z)}  # the impossible ones go
    text = json.dumps({"format": FORMAT, "key": k, "zones": {**zones, name: zone}}, sort_keys=True, indent=1)
    try:
        with owner_only.owner_writes_only():
            files.write_atomic(path, text + "\n")
    except (OSError, InputError):
        pass
