"""Caps whose arithmetic over- or underflows a format are refused in one line; a machine without a C++
compiler answers without the compiled CPU stacks instead of failing.
"""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from softcapgrad.laws import formats
from softcapgrad.laws.saturation import knee_exact


@pytest.mark.parametrize("argv, format_named", [
    (["knee", "--dtype", "all", "--cap", "1e-45"], "float32"),  # a float32 subnormal: a/c loses its digits
    (["knee", "--dtype", "all", "--cap", "5e-324"], "float32"),  # 0 in float32: a/c = inf
    (["knee", "--dtype", "all", "--cap", "1e308"], "float32"),  # inf in float32
    (["knee", "--dtype", "fp64", "--cap", "1e308"], "float64"),  # c·x_knee = 1.9e309: inf
    (["horizon", "--dtype", "fp64", "--cap", "1e308"], "float64"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_caps_whose_arithmetic_overflows_are_refused(cli, argv, format_named):
    code, _, out, err = cli(*argv, "--json")
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1, (code, err)
    assert format_named in lines[0] and "must lie in" in lines[0]


@pytest.mark.parametrize("name", formats.FORMAT_NAMES)
@pytest.mark.parametrize("in_format", [True, False])
def test_cap_range_is_tight_and_from_the_formats_finfo(name, in_format):
    """At each bound the arithmetic holds; one float64 step past it, it does not."""
    from softcapgrad.laws.horizon import cap_arithmetic, cap_range

    dtype = formats.resolve(name)
    bounds = cap_range(dtype, in_format)
    x_knee = knee_exact(formats.facts(dtype).spacing_below_one)
    f64 = np.finfo(np.float64)
    holders = {np.dtype(cap_arithmetic(dtype)), *([dtype] if in_format else [])}

    def holds(c: float) -> bool:
        normal = all(float(formats.finfo(d).smallest_normal) <= c <= float(formats.finfo(d).max) for d in holders)
        return normal and f64.smallest_normal <= c * x_knee <= f64.max

    assert holds(bounds.lo) and holds(bounds.hi) and bounds.lo < bounds.hi
    assert not holds(math.nextafter(bounds.lo, 0.0)) and not holds(math.nextafter(bounds.hi, math.inf))


def test_the_largest_fp64_cap_answers_with_a_finite_horizon(cli):
    from softcapgrad.laws.horizon import cap_range

    hi = cap_range(formats.resolve("fp64")).hi
    code, data, _, _ = cli("knee", "--dtype", "fp64", "--cap", repr(hi), "--json")
    assert code == 0
    horizons = [h["horizon"] for h in data["horizon_rows"]]
    assert horizons and all(isinstance(h, float) and np.isfinite(h) for h in horizons)


# --- no C++ compiler --------------------------------------------------------------------------------

# inductor looks for its compiler by running `NAME --version` for each NAME in
# torch._inductor.config.cpp.cxx, which holds $CXX (g++ when unset) read when torch is imported; a CXX
# that does not exist is a machine without a compiler (InvalidCxxCompiler before the fix).
NO_CXX = """
import json, sys
from typer.testing import CliRunner
from softcapgrad.cli.app import app

runner, seen = CliRunner(), {}
for name, argv in [("knee", ["knee", "--dtype", "fp32", "--backend", "torch-compile-cpu",
                             "--backend", "torch-compile-cpu-scalar", "--json"]),
                   ("stacks", ["stacks", "--json"]),
                   ("reproduce", ["reproduce", "--out", sys.argv[1], "--only", "^knee-search-fp32$", "--json"])]:
    result = runner.invoke(app, argv)
    seen[name] = {"code": result.exit_code, "out": result.stdout, "err": result.stderr}
print(json.dumps(seen))
"""


def test_without_a_cxx_compiler_the_compiled_stacks_are_not_measured_here(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TORCH_INDUCTOR_INSTALL_GXX"}
    env["CXX"] = str(tmp_path / "no-such-compiler")
    proc = subprocess.run([sys.executable, "-c", NO_CXX, str(tmp_path / "out")], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    for name, run in seen.items():
        assert run["code"] == 0 and run["err"] == "", (name, run)
    knee = json.loads(seen["knee"]["out"])
    compiled = [b for b in knee["backends"] if b["backend"].startswith("torch-compile-cpu")]
    assert len(compiled) == 2
    for row in compiled:
        assert row["source"] == "not measured" and row["reason"].startswith("not measured here: no C++ compiler")
        assert row["first_saturating_input"] is None
    said = [n for n in knee["notes"] if "no C++ compiler" in n]  # one line says what is missing
    assert len(said) == 1 and said[0].startswith("torch-compile-cpu, torch-compile-cpu-scalar: not measured here")
    stacks = {r["path"]: r for r in json.loads(seen["stacks"]["out"])["rows"]}
    for path in ("torch-compile-cpu", "torch-compile-cpu-scalar"):
        assert stacks[path]["source"] == "not measured" and "no C++ compiler" in stacks[path]["reason"]
    assert stacks["torch-eager-cpu"]["source"] == "measured"
    ledger = json.loads(seen["reproduce"]["out"])
    (row,) = ledger["rows"]
    assert row["verdict"] == "not measured here" and row["as_expected"] and row["computed"] is None
    assert "no C++ compiler" in row["why"] and "not measured here" in " ".join(ledger["answer"])
