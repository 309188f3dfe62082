"""Light environments: one package release (and the few pure packages it needs) beside softcapgrad's own environment.

A light environment is a virtual environment without pip (``python -m venv --without-pip``) whose own site folder
holds the pinned distributions, installed with ``--no-deps``; one ``.pth`` line after them puts softcapgrad's own
site folder (torch, numpy and the rest) on its path. No torch is downloaded or copied. It lives in
``${XDG_CACHE_HOME:-~/.cache}/softcapgrad/releases/<package>-<version>``, is built in a temporary folder beside it
and renamed into place with its stamp (the pins), and is run only when environments/trust.py trusts it, as the
engine environments are. releases.py builds transformers' releases this way (the pins from pip's resolver);
``package`` builds one distribution alone, for an adapter that reads only that distribution's files (unsloth-zoo's
RL functions: engines/adapters/training/adapter_train_rl.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

from softcapgrad.core import child, owner_only
from softcapgrad.core.checks import InputError
from softcapgrad.engines.environments import environments, trust

STAMP = "softcapgrad-release.json"


def root() -> Path:
    return environments.cache_root().parent / "releases"


def folder(package: str, version: str, where: Path | None = None) -> Path:
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)*", version):
        raise InputError(f"--release {version!r}: a release is written as digits and dots, such as 5.6.0")
    return (where or root()) / f"{package}-{version}"


def site(path: Path) -> Path:
    return path / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"


def state_at(here: Path) -> environments.State:
    """The light environment at ``here`` as parity's runner takes it: installed, or why not."""
    name = here.name
    if not os.path.lexists(here):
        return environments.State(name, "not installed", here, None, {}, 0, "")
    why = trust.root_distrust(here.parent) or trust.environment_distrust(here, trust.walk(here)[1],
                                                                          environments.interpreter(here))
    if why:
        return environments.State(name, "untrusted", here, None, {}, 0, why, here)
    try:
        versions = json.loads((here / STAMP).read_text(encoding="utf-8"))["versions"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return environments.State(name, "broken", here, None, {}, 0, f"its stamp {STAMP} is missing or unreadable")
    return environments.State(name, "installed", here, environments.interpreter(here), versions, 0, "")


def build_at(here: Path, resolve, say=lambda line: None) -> Path:
    """The light environment at ``here``, built if absent, reused otherwise; ``resolve(scratch)`` gives the pins
    (package -> version, installed with --no-deps; empty: softcapgrad's own environment holds them already)."""
    parent, label = here.parent, here.name
    with child.terminating("terminated; the build's processes were stopped and its temporary folder removed"), \
            owner_only.owner_writes_only():
        parent.mkdir(parents=True, exist_ok=True)
        st = state_at(here)
        if st.state == "untrusted":
            raise InputError(f"{label}: its environment is untrusted ({st.reason}): remove {st.suspect}")
        if st.state == "installed":
            return here
        with environments._locked(parent, here.name):
            shutil.rmtree(here, ignore_errors=True)  # broken: built afresh
            tmp = parent / f".{here.name}.building-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            try:
                base = getattr(sys, "_base_executable", sys.executable)
                environments._step([base, "-m", "venv", "--without-pip", str(tmp)], parent, say,
                                   f"{label}: creating the environment", 0)
                with tempfile.TemporaryDirectory(prefix="softcapgrad-release-") as scratch:
                    pins = resolve(Path(scratch))
                if pins:
                    environments._step([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
                                        str(site(tmp)), *(f"{k}=={v}" for k, v in sorted(pins.items()))], parent,
                                       say, f"{label}: installing {len(pins)} packages", len(pins))
                else:
                    site(tmp).mkdir(parents=True, exist_ok=True)
                (site(tmp) / "zz-softcapgrad-main.pth").write_text(sysconfig.get_paths()["purelib"] + "\n",
                                                                   encoding="utf-8")
                (tmp / STAMP).write_text(json.dumps({"versions": pins}, sort_keys=True) + "\n", encoding="utf-8")
                os.rename(tmp, here)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    say(f"{label}: installed ({trust.size(here) / 2**20:.0f} MiB)")
    return here


def package_state(package: str, version: str, where: Path | None = None) -> environments.State:
    return state_at(folder(package, version, where))


def package(package: str, version: str, where: Path | None = None, say=lambda line: None) -> Path:
    """The light environment of one distribution at ``version``, alone (--no-deps: what it needs at import is
    softcapgrad's own environment's, or nothing, where its adapter only reads its files)."""
    return build_at(folder(package, version, where), lambda scratch: {package: version}, say)
