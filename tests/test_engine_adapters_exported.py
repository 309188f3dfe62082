"""The exporter engines' adapters and pinned environments (ONNX Runtime through optimum-onnx, CTranslate2,
OpenVINO through optimum-intel): each file pins every package exactly and each adapter names its routes."""

import ast
import re
from pathlib import Path

import pytest

import softcapgrad.engines

ENGINES = Path(softcapgrad.engines.__file__).parent
NAMES = [p.stem.removeprefix("adapter_") for p in (ENGINES / "adapters" / "forward").glob("adapter_*.py")
         if p.stem.removeprefix("adapter_") in {"optimum_onnx", "ct2", "openvino_intel"}]
PIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9.+!-]+$")


@pytest.mark.parametrize("name", NAMES)
def test_requirements_pin_every_line_exactly_and_cpu_torch(name):
    lines = [line for line in (ENGINES / "requirements" / f"{name}.txt").read_text().splitlines()
             if line and not line.startswith("#")]
    assert lines and all(PIN.match(line) for line in lines), [line for line in lines if not PIN.match(line)]
    torch = [line for line in lines if line.lower().startswith("torch==")]
    assert torch == ["torch==2.13.0+cpu"]


@pytest.mark.parametrize("name", NAMES)
def test_adapter_names_a_default_route_and_imports_no_softcapgrad(name):
    tree = ast.parse((ENGINES / "adapters" / "forward" / f"adapter_{name}.py").read_text())
    routes = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                  and any(getattr(t, "id", "") == "ROUTES" for t in node.targets))
    assert "default" in ast.literal_eval(routes)
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                 and node.module}
    assert "softcapgrad" not in imported


def test_the_three_adapters_are_present():
    assert sorted(NAMES) == ["ct2", "openvino_intel", "optimum_onnx"]
