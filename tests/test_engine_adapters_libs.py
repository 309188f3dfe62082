"""The library engines' adapters and pinned requirements: each adapter runs from its own environment, so what it
imports, what its file is called and what its requirements pin are checked here without any engine installed."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

import softcapgrad.engines as engines_package
from softcapgrad.engines.forward import catalog

ROOT = Path(engines_package.__file__).parent
ADAPTERS, REQUIREMENTS = ROOT / "adapters" / "forward", ROOT / "requirements"
# adapter -> the top-level modules of its engine that it may import
ENGINES = {
    "mlxlm": {"mlx", "mlx_lm"},
    "mistral_rs": {"mistralrs"},
    "lit_gpt": {"litgpt", "torch"},
    "torch_tune": {"torchtune", "torch"},
    "gemma_jax": set(),
    "tiny_grad": set(),
    "kerashub": {"keras", "keras_hub", "safetensors"},
    "executorch_rt": {"executorch", "optimum", "torch", "transformers"},
}
# adapter -> modules it imports only for the older releases it declares, reached with --python in light environments
# (engines/releases/light.py), so its own environment's requirements do not pin them
OLDER = {"kerashub": {"keras_nlp"}}
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)$")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def _pins(engine: str) -> dict[str, str]:
    """The pins of the requirements file of the engine whose adapter is ``engine``."""
    environment = next(e.environment for e in catalog.engines().values() if e.adapter == engine)
    pins = {}
    for line in (REQUIREMENTS / f"{environment}.txt").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            match = PIN.match(line.strip())
            assert match, f"{engine}.txt: {line!r} is not NAME==VERSION"
            pins[match.group(1).lower().replace("-", "_").replace(".", "_")] = match.group(2)
    return pins


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_an_adapter_imports_only_the_standard_library_numpy_protocol_and_its_engine(engine):
    allowed = set(sys.stdlib_module_names) | {"__future__", "numpy", "adapter_protocol"} | ENGINES[engine]
    allowed |= OLDER.get(engine, set())
    assert _imports(ADAPTERS / f"adapter_{engine}.py") <= allowed, _imports(ADAPTERS / f"adapter_{engine}.py") - allowed


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_an_adapter_file_does_not_shadow_a_package_of_its_environment(engine):
    # the adapters' folders are on the child's sys.path: an adapter named after a package would hide it
    assert f"adapter_{engine}" not in _pins(engine) and f"adapter_{engine}" not in ENGINES[engine]


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_an_adapter_declares_a_default_route_and_short_route_ids(engine):
    tree = ast.parse((ADAPTERS / f"adapter_{engine}.py").read_text(encoding="utf-8"))
    routes = next(ast.literal_eval(n.value) for n in tree.body
                  if isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "ROUTES" for t in n.targets))
    assert "default" in routes and all(re.fullmatch(r"[a-z0-9][a-z0-9-]{0,15}", r) for r in routes)
    assert all(isinstance(text, str) and text and "\n" not in text for text in routes.values())


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_requirements_pin_every_package_with_cpu_torch_and_no_cuda_build(engine):
    pins = _pins(engine)
    assert "numpy" in pins  # the protocol module needs it in every environment
    assert pins.get("torch", "2.13.0+cpu") == "2.13.0+cpu"
    assert not [name for name in pins if name.startswith(("nvidia_", "triton", "torchvision", "torchaudio",
                                                           "torchcodec"))]
    for module in ENGINES[engine]:
        assert module in pins or module.replace("_", "") in {p.replace("_", "") for p in pins}, module
