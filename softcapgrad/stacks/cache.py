"""Measured dead zones kept on disk, so a repeated scan of a CPU stack needs numpy alone.

Where an eager CPU stack's gradient through the cap dies, for one scores format and cap, is a small fact
that takes ``import torch`` and a search over the format to find. Once measured it is kept in
``${XDG_CACHE_HOME:-~/.cache}/softcapgrad/stacks/dead-zones-<key>.json``; the key holds everything the
measurement can depend on: the installed torch, numpy and ml_dtypes versions (read from their metadata,
without importing them), the CPU (its architecture and its whole flag list, which decide the kernels ATen
dispatches to), ``ATEN_CPU_CAPABILITY``, and a hash of the code that measures. Another CPU, another
capability or another torch reads another file, so the cache answers exactly what a measurement would
answer here. On a CPU whose flags cannot be read, nothing is cached.

The file is JSON and only JSON: it is parsed, never executed or unpickled. It is ignored (and rewritten at
the next measurement) when it is not a regular file of this user, is larger than ``MAX_BYTES``, does not
parse, carries another key, or holds an entry of any other shape. Files are written whole
(``core.files``); a cache folder that cannot be written only means the next run measures again.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import platform
import stat
from importlib import metadata
from pathlib import Path

from softcapgrad.core import files
from softcapgrad.core.checks import InputError

FORMAT = "softcapgrad dead zones 1"
MAX_BYTES = 1 << 20
FIELDS = {"path": str, "scores": str, "cap": float, "above": (float, type(None)), "below": (float, type(None)),
          "one_sided": bool, "source": str, "reason": str}
_MEASURING = ("laws", "stacks", "training", "core")  # the package folders whose code a measurement runs


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


def _read(path: Path, k: dict) -> dict:
    """The entries of the cache file, or {} for a missing, foreign, oversized, malformed or mis-keyed one."""
    try:
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_size > MAX_BYTES:
            return {}
        data = json.loads(path.read_bytes(), parse_constant=_reject)
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("key") != k:
        return {}
    zones = data.get("zones")
    if not isinstance(zones, dict) or not all(isinstance(n, str) and _valid(z) for n, z in zones.items()):
        return {}
    return zones


def lookup(name: str) -> dict | None:
    """The cached fields of one entry, or None."""
    k = key()
    return None if k is None else _read(_file(k), k).get(name)


def store(name: str, zone: dict) -> None:
    """Add one measured entry; a cache that cannot be written is left as it is."""
    k = key()
    if k is None or not _valid(zone):
        return
    path = _file(k)
    zones = {**_read(path, k), name: zone}
    text = json.dumps({"format": FORMAT, "key": k, "zones": zones}, sort_keys=True, indent=1)
    try:
        files.write_atomic(path, text + "\n")
    except (OSError, InputError):
        pass
