"""The numpy-only commands and --help start without the heavy layers.

Each case runs ``python -m softcapgrad ...`` as a fresh child (through runpy, as ``-m`` does) that writes the
names in ``sys.modules`` when it leaves: at ``os._exit`` (the numpy-only commands end there, skipping the
interpreter's teardown) or at a normal exit. ``sys.modules`` holds every module imported, whether by an import
statement or by ``importlib.import_module`` (which ``-X importtime`` does not list).
"""

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "jax", "mlx", "softcapgrad.experiments", "softcapgrad.engines", "softcapgrad.models")
WRAPPER = """import atexit, json, os, runpy, sys
out = sys.argv.pop(1)
def dump():
    with open(out, "w") as f:
        json.dump(sorted(sys.modules), f)
atexit.register(dump)
leave = os._exit
os._exit = lambda code: (dump(), leave(code))
runpy.run_module("softcapgrad", run_name="__main__", alter_sys=True)
"""


def imported(tmp_path, *args: str) -> tuple[int, set[str]]:
    out = tmp_path / "modules.json"
    proc = subprocess.run([sys.executable, "-c", WRAPPER, str(out), *args], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    return proc.returncode, set(json.loads(out.read_text()))


def heavy(names: set[str]) -> list[str]:
    return sorted(n for n in names if any(n == h or n.startswith(h + ".") for h in HEAVY))


@pytest.mark.parametrize("args", [("knee", "--dtype", "bf16", "--cap", "30"), ("ratchet",), ("--help",)],
                         ids=" ".join)
def test_numpy_only_commands_import_no_heavy_layer(tmp_path, args):
    code, names = imported(tmp_path, *args)
    assert code == 0
    assert "softcapgrad.laws.formats" in names and "numpy" in names  # the list is read: the layer it uses
    assert heavy(names) == []


def test_a_command_named_first_imports_only_its_own_command_module(tmp_path):
    code, names = imported(tmp_path, "knee", "--dtype", "bf16", "--cap", "30")
    assert code == 0
    assert sorted(n for n in names if n.startswith("softcapgrad.cli.")) == ["softcapgrad.cli.app",
                                                                            "softcapgrad.cli.common",
                                                                            "softcapgrad.cli.laws",
                                                                            "softcapgrad.cli.limits"]
    code, names = imported(tmp_path, "--help")  # the whole table: every command module, for the list
    assert code == 0 and {"softcapgrad.cli.census", "softcapgrad.cli.engines", "softcapgrad.cli.laws"} <= names
