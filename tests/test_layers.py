"""The package's layers, read from its imports (ast): no circle, nothing imports upward, laws stay torch-free.

Every import counts, at module level or inside a function: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "softcapgrad"

# bottom to top; packages on one rank are siblings and may not import each other
RANKS = {"core": 0, "laws": 1, "training": 2, "stacks": 3, "demos": 3, "models": 4, "files": 4, "integrations": 4,
         "experiments": 5, "engines": 5, "ledger": 6, "page": 6, "cli": 7}
TOP_LEVEL = {"__init__", "__main__", "tether"}  # the package's entry and its public re-exports
# engines/ is layered the same way, one folder per concern: the environments at the bottom, the forward check
# (parity) on them, and what is built on parity beside one another; adapters/ holds the scripts the engines'
# own interpreters run, which import nothing of the package but softcapgrad.training (adapter_monitor_check)
ENGINE_RANKS = {"environments": 0, "adapters": 0, "forward": 1, "served": 2, "training": 2, "releases": 2,
                "repro": 3,  # bundles of parity's findings and of train-parity's
                "incidents": 3}  # the public incidents, replayed on releases (releases/) and read from results


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[tuple[str, int, bool]]:
    """(imported module, line, at module level) for every import of the package in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno, id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, node.lineno, id(node) in top))
            if node.module.startswith("softcapgrad"):  # `from softcapgrad.x import y` may name a module y
                for a in node.names:
                    candidate = f"{node.module}.{a.name}"
                    if candidate in MODULES:
                        found.append((candidate, node.lineno, id(node) in top))
    return found


FILES = sorted(PACKAGE.rglob("*.py"))
MODULES = {module_name(p) for p in FILES}


def layer(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "softcapgrad" or len(parts) == 1:
        return None
    return parts[1] if parts[1] in RANKS else None


def engine_folder(module: str) -> str | None:
    parts = module.split(".")
    if parts[:2] != ["softcapgrad", "engines"] or len(parts) < 3:
        return None
    return parts[2] if parts[2] in ENGINE_RANKS else None


def crossings(folder, ranks: dict) -> list[str]:
    """Every import of a module in a lower or sibling folder (``folder``: a module's, None outside the ranks)."""
    found = []
    for path in FILES:
        source = folder(module_name(path))
        if source is None:
            continue
        for target, line, _ in imports(path):
            to = folder(target)
            if to is not None and to != source and ranks[to] >= ranks[source]:
                found.append(f"{path.relative_to(PACKAGE)}:{line} imports {target}")
    return found


def graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for path in FILES:
        name = module_name(path)
        edges[name] = {m for m, _, _ in imports(path) if m in MODULES and m != name}
    return edges


def test_every_module_sits_in_a_layer():
    outside = [m for m in MODULES if layer(m) is None and m.split(".")[-1] not in TOP_LEVEL and m != "softcapgrad"]
    assert outside == []


def test_no_layer_imports_a_higher_or_sibling_layer():
    assert crossings(layer, RANKS) == []


def test_engines_has_no_module_at_its_root():
    assert sorted(p.name for p in (PACKAGE / "engines").glob("*.py")) == ["__init__.py"]


def test_every_engines_module_sits_in_a_folder():
    outside = [m for m in MODULES if layer(m) == "engines" and m != "softcapgrad.engines" and engine_folder(m) is None]
    assert outside == []


def test_no_engines_folder_imports_a_higher_or_sibling_folder():
    assert crossings(engine_folder, ENGINE_RANKS) == []


def test_no_import_circle():
    edges = graph()
    state: dict[str, int] = {}
    circles = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                circles.append(" -> ".join(trail[trail.index(nxt):] + [nxt]) if nxt in trail else nxt)
            elif nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert circles == []


@pytest.mark.parametrize("heavy", ["torch", "jax", "mlx", "transformers"])
def test_laws_never_import_heavy_frameworks_at_module_level(heavy):
    found = [f"{p.relative_to(PACKAGE)}:{line}" for p in FILES if layer(module_name(p)) == "laws"
             for m, line, top in imports(p) if top and (m == heavy or m.startswith(heavy + "."))]
    assert found == []


def test_library_code_never_imports_the_command_line():
    found = [f"{p.relative_to(PACKAGE)}:{line}" for p in FILES if layer(module_name(p)) not in ("cli", None)
             for m, line, _ in imports(p) if m.startswith("softcapgrad.cli") or m in ("typer", "click")]
    assert found == []


def test_the_rules_see_a_crossing():
    """The checker itself: an upward import written into a layer is reported."""
    probe = ast.parse("def f():\n    from softcapgrad.cli.app import main\n")
    node = probe.body[0].body[0]
    assert isinstance(node, ast.ImportFrom) and layer(node.module) == "cli"
    assert RANKS[layer(node.module)] > RANKS["laws"]
    assert engine_folder("softcapgrad.engines.training.parity") == "training"
    assert ENGINE_RANKS["training"] >= ENGINE_RANKS["releases"]  # siblings: an import between them is a crossing
    assert ENGINE_RANKS["training"] < ENGINE_RANKS["repro"]  # the bundles of train-parity's findings read training/


def test_public_names_keep_their_addresses():
    import softcapgrad
    from softcapgrad import tether
    from softcapgrad.stacks.watch import DeadZoneMonitor
    from softcapgrad.training import fp32grad, remedy, tether as training_tether

    assert softcapgrad.softcap is remedy.softcap and softcapgrad.SoftCap is remedy.SoftCap
    assert softcapgrad.fp32_tanh_backward is fp32grad.fp32_tanh_backward and softcapgrad.patch is fp32grad.patch
    assert softcapgrad.DeadZoneMonitor is DeadZoneMonitor
    for name in ("TetherGate", "FloorSchedule", "tethergate_step"):
        assert getattr(tether, name) is getattr(training_tether, name)
