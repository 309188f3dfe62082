"""``parity --engine X --python PATH``: an interpreter the user gives (an engine's own build, a pinned company stack)
in place of X's environment, checked before anything is measured.

The interpreter is probed once in a child: isolated (``-I``), in a temporary folder, standard input /dev/null, the
runner's short list of variables, its own process group killed however the probe ends, and a time limit. The probe
prints one JSON object: ``sys.version``, the executable, every installed distribution with its version, and whether
each module the adapter needs can be found (``importlib.util.find_spec``, which locates a top-level module without
running it). A missing file, something that is not a Python interpreter, one that hangs or one without the engine's
modules is one line and exit 2.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import tempfile
from pathlib import Path

from softcapgrad.core.checks import InputError

PROBE_TIMEOUT = 60.0  # seconds: importlib.metadata over a large environment on a loaded 2-core machine takes ~2 s
ANSWER_LIMIT = 4 * 2 ** 20  # bytes of the probe's answer read (a few thousand distributions fit)
# The top-level modules each adapter imports (numpy too, for every adapter: the protocol writes .npy files).
IMPORTS = {"transformers": ("transformers", "torch"), "torchexport": ("torch", "transformers"),
           "onnx": ("onnxruntime", "onnx", "torch", "transformers"), "llamacpp": ("llama_cpp",),
           "vllm_cpu": ("vllm",), "kerashub": ("keras", "jax"), "ct2": ("ctranslate2",),
           "executorch_rt": ("executorch", "optimum"), "gemma_jax": ("gemma",), "lit_gpt": ("litgpt",),
           "mistral_rs": ("mistralrs",), "mlxlm": ("mlx_lm",), "openvino_intel": ("optimum", "openvino"),
           "optimum_onnx": ("optimum", "onnxruntime"), "tiny_grad": ("tinygrad",), "torch_tune": ("torchtune",),
           "train_unsloth_rl": ("transformers", "torch", "unsloth_zoo")}
ANY_OF = {"kerashub": ("keras_nlp", "keras_hub")}  # modules of which the adapter needs one (the first it speaks)
PROBE = ("import sys, json, importlib.util as u, importlib.metadata as m\n"
         "found = {}\n"
         "for name in sys.argv[1:]:\n"
         "    try:\n"
         "        spec = u.find_spec(name)\n"
         "    except (ImportError, ValueError):\n"
         "        spec = None\n"
         "    found[name] = None if spec is None else (spec.origin or '')\n"
         "packages = {d.metadata['Name']: d.version for d in m.distributions() if d.metadata['Name']}\n"
         "print(json.dumps({'softcapgrad_probe': 1, 'version': sys.version, 'executable': sys.executable,\n"
         "                  'modules': found, 'packages': dict(sorted(packages.items()))}))\n")


def modules(adapter: str) -> tuple[str, ...]:
    return ("numpy", *IMPORTS.get(adapter, ()), *ANY_OF.get(adapter, ()))


def _release(text: str) -> tuple:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(text).release
    except InvalidVersion:
        return ()


def speaks(adapter: str, engine: str, packages: dict, where: str) -> str:
    """The distribution the adapter will run, as ``name version``, where its ``RELEASES`` literal declares releases
    (package -> (first, last), tried in order); one line naming the range where the interpreter holds none of them
    at a declared release. An adapter without the literal speaks whatever it finds ("")."""
    from softcapgrad.engines.forward import catalog

    declared = catalog._literal(catalog.script(adapter), "RELEASES")
    if not isinstance(declared, dict) or not declared:
        return ""
    held_by = {re.sub(r"[-_.]+", "-", k).lower(): v for k, v in packages.items()}
    for name, (first, last) in declared.items():
        held = held_by.get(name)
        if held is not None and _release(first) <= _release(held) <= _release(last):
            return f"{name} {held}"
    spans = ", then ".join(f"{name} {a} to {b}" for name, (a, b) in declared.items())
    found = ", ".join(f"{name} {held_by[name]}" for name in declared if name in held_by) or "neither"
    raise InputError(f"{where}: engine {engine} speaks {spans}; this interpreter has {found}")


def runnable(path: Path) -> Path:
    """``path`` as an absolute path (the child starts elsewhere; a link is kept, as a venv's interpreter is one),
    or one line: missing, a link to nothing, a folder, not executable. Cheap: checked before any other work."""
    path = Path(os.path.abspath(path))
    if not os.path.lexists(path):
        raise InputError(f"--python {path}: no such file")
    if not path.exists():
        raise InputError(f"--python {path}: a symbolic link to nothing")
    if path.is_dir():
        raise InputError(f"--python {path}: is a folder, not an interpreter")
    if not os.access(path, os.X_OK):
        raise InputError(f"--python {path}: not executable")
    return path


def probe(path: Path, adapter: str, engine: str, timeout: float | None = None) -> dict:
    """The interpreter's facts (version, path, packages, module origins), or one line: a missing file, something
    that is not Python, an interpreter that does not answer in ``timeout`` seconds, or one where the engine's
    modules cannot be found."""
    from softcapgrad.engines.forward import runner

    path = runnable(path)
    limit = PROBE_TIMEOUT if timeout is None else timeout
    with tempfile.TemporaryDirectory(prefix="softcapgrad-probe-") as tmp:
        try:
            child = subprocess.Popen([str(path), "-I", "-c", PROBE, *modules(adapter)], cwd=tmp,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env=runner.environment(Path(tmp)), start_new_session=True)
        except OSError as err:
            raise InputError(f"--python {path}: cannot be run ({err.strerror or err}): not an interpreter") from None
        try:
            out, _ = child.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            _kill(child)
            child.communicate()
            raise InputError(f"--python {path}: no answer in {limit:g} s (stopped): not a working Python "
                             "interpreter") from None
        finally:
            _kill(child)  # whatever it started, on every way out (Ctrl-C included)
            if child.poll() is None:
                child.wait()
    facts = _answer(out[:ANSWER_LIMIT], child.returncode)
    if facts is None:
        raise InputError(f"--python {path}: not a Python interpreter (it did not answer the probe, exit code "
                         f"{child.returncode})")
    missing = [name for name, origin in facts["modules"].items() if origin is None
               and name not in ANY_OF.get(adapter, ())]
    either = ANY_OF.get(adapter, ())
    if either and all(facts["modules"].get(name) is None for name in either):
        missing.append(" or ".join(either))
    if missing:
        raise InputError(f"--python {path}: engine {engine} cannot be imported there (no module "
                         f"{', '.join(missing)} in Python {facts['version'].split()[0]})")
    speaks(adapter, engine, facts["packages"], f"--python {path}")
    return {"path": str(path), "version": facts["version"], "executable": facts["executable"],
            "modules": facts["modules"], "packages": facts["packages"]}


def _kill(child: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)


def _answer(out: bytes, code: int) -> dict | None:
    """The probe's JSON, checked for its shape (None: not what the probe prints)."""
    if code != 0:
        return None
    try:
        facts = json.loads(out.decode("utf-8").strip().splitlines()[-1])
    except (ValueError, IndexError, RecursionError):
        return None
    shape = {"version": str, "executable": str, "modules": dict, "packages": dict}
    if not (isinstance(facts, dict) and facts.get("softcapgrad_probe") == 1
            and all(isinstance(facts.get(k), t) for k, t in shape.items())):
        return None
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in facts["packages"].items()):
        return None
    if not all(isinstance(v, (str, type(None))) for v in facts["modules"].values()):
        return None
    return facts


def state(facts: dict, environment: str):
    """The State that runs the engine with the probed interpreter in place of ``environment``."""
    from softcapgrad.engines.environments.environments import State

    return State(environment, "installed", None, Path(facts["path"]), dict(facts["packages"]), 0, "")
