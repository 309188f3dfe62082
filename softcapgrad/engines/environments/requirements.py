"""An environment's pinned requirements file (``requirements/<name>.txt``) and the adapters' folders.

A file pins every package of its environment, dependencies included (``pip install --no-deps -r FILE``), and may
carry three kinds of comment line: ``# remove: NAME ...`` (packages uninstalled after the install), ``# python: X.Y``
(the interpreter to build with) and ``# then: SCRIPT`` (a script of adapters/ the new interpreter runs last). The
environment's key is the sha256 of the file's bytes.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from softcapgrad.core.checks import InputError

ENGINES = Path(__file__).resolve().parents[1]  # the engines package: requirements/ and adapters/ are data files there
REQUIREMENTS = ENGINES / "requirements"
ADAPTERS = ENGINES / "adapters"
# the adapters' folders, in the order the child's import path takes them: the modules every adapter may import, the
# forward check's adapters, the training check's (which import forward ones: the same model loaders)
ADAPTER_PATH = (ADAPTERS, ADAPTERS / "forward", ADAPTERS / "training")


@dataclass(frozen=True)
class Requirements:
    name: str
    path: Path
    packages: tuple[str, ...]  # requirement lines, as written
    removals: tuple[str, ...]  # packages uninstalled after the install
    python: str | None  # "3.11": the interpreter to build with (None: the one running softcapgrad)
    digest: str  # sha256 of the file's bytes, hex
    then: tuple[str, ...] = ()  # adapters/ scripts run by the new environment's interpreter after the install


def names() -> list[str]:
    """Every environment the project builds (one per requirements file), in name order."""
    return sorted(p.stem for p in REQUIREMENTS.glob("*.txt"))


def requirements_file(name: str) -> Path:
    return REQUIREMENTS / f"{name}.txt"


def read(name: str, path: Path | None = None) -> Requirements:
    """The requirements of environment ``name`` (its file under requirements/, or ``path``)."""
    path = path or requirements_file(name)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise InputError(f"engine environment {name}: no requirements file {path.name} ({err.strerror})") from None
    packages, removals, python, then = [], [], None, []
    for raw in data.decode("utf-8").splitlines():
        line = raw.strip()
        if line.startswith("#"):
            body = line[1:].strip()
            if body.startswith("remove:"):
                removals += body[len("remove:"):].split()
            elif body.startswith("python:"):
                python = body[len("python:"):].strip()
            elif body.startswith("then:"):
                then += body[len("then:"):].split()
        elif line:
            packages.append(line.split(" #")[0].strip())
    return Requirements(name, path, tuple(packages), tuple(removals), python, hashlib.sha256(data).hexdigest(),
                        tuple(then))


def adapter_file(name: str) -> Path:
    """The file ``name`` (``adapter_<x>.py``) in the first of the adapters' folders that holds it; where none does, the
    folder of its kind (training for ``adapter_train_*``, else forward)."""
    for place in ADAPTER_PATH:
        if (place / name).is_file():
            return place / name
    return ADAPTERS / ("training" if name.startswith("adapter_train_") else "forward") / name
