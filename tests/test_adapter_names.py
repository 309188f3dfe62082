"""No file of engines/adapters/ (forward/, training/ too) is named after a module an adapter could mean to import.

The adapters' folders are on the import path of every engine's child process (runner.BOOTSTRAP), so a file there
named after a package (transformers.py beside an adapter that imports transformers) would be imported in its
place. Checked against every name the requirements pin, the import names the adapters use, the standard library,
what this environment finds, and, for each engine environment built here, what its own interpreter finds.
"""

import ast
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from softcapgrad.engines.forward import catalog
from softcapgrad.engines.environments import environments

FILES = sorted(p for folder in catalog.ADAPTER_PATH for p in folder.glob("*.py"))
STEMS = [p.stem for p in FILES]


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _pinned() -> set[str]:
    """Every distribution name in requirements/*.txt, as an import name would spell it."""
    names = set()
    for path in environments.REQUIREMENTS.glob("*.txt"):
        for line in path.read_text(encoding="utf-8").splitlines():
            line = line.split("#")[0].strip()
            if line:
                names.add(_normal(re.split(r"[=<>!~\[; ]", line, maxsplit=1)[0]))
    return names


def _imported() -> set[str]:
    """The top-level names the adapters import, their own siblings left out."""
    names = set()
    for path in FILES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names - set(STEMS)


def test_every_adapter_file_has_the_prefix_and_each_engine_finds_its_script():
    assert FILES and all(stem.startswith(catalog.PREFIX) for stem in STEMS), STEMS
    for engine in catalog.engines().values():
        assert catalog.script(engine.adapter).is_file(), engine.name
    assert {f"{catalog.PREFIX}{h}" for h in catalog.SHARED} <= set(STEMS)


def test_no_two_adapter_folders_hold_the_same_name():
    """One import path for every child: a name in two folders would be the first folder's for every adapter."""
    assert len(STEMS) == len(set(STEMS)), sorted(s for s in STEMS if STEMS.count(s) > 1)
    assert sorted(p.name for p in catalog.ADAPTERS.iterdir() if p.suffix == ".py") == [
        "adapter_protocol.py", "adapter_transformers_load.py"]  # imported by both kinds; each adapter in its folder


def test_no_adapter_file_is_named_after_a_pinned_or_imported_module():
    taken = _pinned() | {_normal(n) for n in _imported()} | set(sys.stdlib_module_names)
    assert "transformers" in taken and "keras_hub" in taken and "numpy" in taken  # the sets are read
    assert [s for s in STEMS if _normal(s) in taken] == []


def _elsewhere(stem: str) -> bool:
    """A module of that name found outside the adapters' folders (a test that imported an adapter leaves it in
    sys.modules, where the lookup finds the adapter itself)."""
    spec = importlib.util.find_spec(stem)
    return spec is not None and not (spec.origin and Path(spec.origin).parent in catalog.ADAPTER_PATH)


def test_no_adapter_file_is_named_after_a_module_of_this_environment():
    found = [s for s in STEMS if _elsewhere(s)]
    assert importlib.util.find_spec("numpy") is not None  # the lookup finds what is installed
    assert found == []


@pytest.mark.parametrize("name", [n for n in catalog.environments() if n != environments.MAIN])
def test_no_adapter_file_is_named_after_a_module_of_a_built_engine_environment(name):
    state = environments.state(name)
    if state.state != "installed":
        pytest.skip(f"the {name} environment is not built here")
    code = ("import importlib.util, json, sys; names = json.loads(sys.argv[1]); "
            "print(json.dumps([n for n in names + ['numpy'] if importlib.util.find_spec(n) is not None]))")
    import json

    done = subprocess.run([str(state.python), "-I", "-c", code, json.dumps(STEMS)], capture_output=True,
                          text=True, timeout=120, check=True)
    assert json.loads(done.stdout) == ["numpy"]  # numpy: every environment has it, so the lookup is real
