"""The committed results do not depend on the CPU or on the optional extras.

The ledger and every figure are compared byte for byte with the committed files in this process,
whatever ATen kernels it uses: `.ci/run` runs those two tests again under ATEN_CPU_CAPABILITY=default
(scalar kernels) and =avx2, so an AVX-512 machine checks the two smaller classes too. The ledger is
also recomputed with jax and transformers hidden, as on an install without the extras.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parents[1] / "results"
LEDGER_KEYS = ("id", "computed", "verdict", "why")  # what the committed ledger holds per claim


def test_every_figure_is_the_committed_one():
    """Figures are drawn from values that do not depend on the vector width (the tether demo runs in
    float64 for that reason), so the PNG bytes are the committed ones on any x86 CPU."""
    pytest.importorskip("matplotlib")
    from softcapgrad.ledger.figures import reproduce_figures

    drawn = reproduce_figures()
    assert set(drawn) <= {p.name for p in (RESULTS / "figures").glob("*.png")}
    changed = [name for name, data in drawn.items() if data != (RESULTS / "figures" / name).read_bytes()]
    capability = os.environ.get("ATEN_CPU_CAPABILITY", "the CPU's own")
    assert not changed, f"figures differ from the committed ones under ATEN_CPU_CAPABILITY={capability}: {changed}"


_HIDDEN = """
import sys
for name in ("jax", "jaxlib", "mlx", "transformers"):
    sys.modules[name] = None  # import fails as on an install without the extra
import json
from softcapgrad.ledger import verdicts as claims
outcomes = claims.evaluate()
print(json.dumps({"rows": [[getattr(o, k) for k in %r] for o in outcomes],
                  "markdown": claims.markdown(outcomes)}))
"""


def test_the_ledger_is_the_same_without_the_optional_extras():
    proc = subprocess.run([sys.executable, "-c", _HIDDEN % (LEDGER_KEYS,)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout)
    committed = json.loads((RESULTS / "claims.json").read_text())["rows"]
    assert got["rows"] == [[r[k] for k in LEDGER_KEYS] for r in committed]
    assert got["markdown"] == (RESULTS / "claims.md").read_text()


def _compile_cpu_row(capability: str) -> dict:
    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability,
           "TORCHINDUCTOR_CACHE_DIR": os.path.join(os.environ["TORCHINDUCTOR_CACHE_DIR"], capability)}
    proc = subprocess.run([sys.executable, "-m", "softcapgrad", "horizon", "--path", "torch-compile-cpu", "--scores", "bf16",
                           "--cap", "30", "--json"], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = json.loads(proc.stdout)["rows"]
    return row


@pytest.mark.slow
def test_torch_compile_cpu_says_the_isa_that_ran_and_honours_aten_cpu_capability():
    """The stack runs what torch.compile runs in the same process: under `default` inductor emits scalar
    code, so the vector stack is not measured (torch-compile-cpu-scalar is that code); under `avx2` its
    label names AVX2 and 256 bits, whatever wider ISA the CPU has."""
    pytest.importorskip("torch")
    from softcapgrad.stacks.runners import inductor_isa

    scalar = _compile_cpu_row("default")
    assert scalar["first_zero_grad_input"] is None and scalar["source"] == "not measured"
    assert "ATEN_CPU_CAPABILITY=default" in scalar["reason"] and "torch-compile-cpu-scalar" in scalar["reason"]
    if inductor_isa(256) is None:
        pytest.skip("this CPU has no AVX2")
    avx2 = _compile_cpu_row("avx2")
    assert avx2["source"] == "measured" and "inductor AVX2 vector code, 256 bits" in avx2["reason"]


def _tether_demo_json(capability: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    if capability is not None:
        env["ATEN_CPU_CAPABILITY"] = capability
    proc = subprocess.run([sys.executable, "-m", "softcapgrad", "tether-demo", "--json"], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.slow
def test_tether_demo_prints_the_same_bytes_under_every_kernel_width():
    """The collapse section trains in float64 with torch's sigmoid, whose vector and scalar kernels differ
    in the last ulps: its printed means must not. Sets its own children's capability (ATen's scalar
    kernels, AVX2 where the CPU has it, and the CPU's own), so `.ci/run` need not run it again."""
    torch = pytest.importorskip("torch")
    capabilities: list[str | None] = ["default", None]
    if torch.backends.cpu.get_cpu_capability() != "DEFAULT":
        capabilities.append("avx2")
    printed = {str(c): _tether_demo_json(c) for c in capabilities}
    assert len(set(printed.values())) == 1, {c: hash(p) for c, p in printed.items()}


_KNEES = """
import json
import numpy as np
from softcapgrad.laws.knee import backend_knee
rows = [backend_knee(np.dtype(d), "torch", [30.0], fn) for d, fn in (("float32", "tanh"), ("float64", "sigmoid"),
                                                                     ("float64", "tanh"))]
print(json.dumps([[r.first_saturating_input, r.varies_with_cpu] for r in rows]))
"""


def _torch_knees(mkl_path: str | None) -> list:
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
    if mkl_path is not None:
        env["MKL_CBWR"] = mkl_path
    proc = subprocess.run([sys.executable, "-I", "-c", _KNEES], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_the_torch_knees_the_knee_figure_draws_do_not_move_with_mkls_code_path():
    """MKL picks its code path by CPU, and torch's float64 tanh is MKL's: on an Intel AVX-512 CPU its knee is
    thousands of ulps from the one MKL's AVX2 path gives. The knee figure draws torch's float32 tanh and
    leaves out the row marked as varying; this forces MKL's paths (MKL_CBWR) in children and checks that
    float32 tanh and float64 sigmoid give the same input on every path, and that float64 tanh is marked."""
    torch = pytest.importorskip("torch")
    if not torch.backends.mkl.is_available():
        pytest.skip("this torch has no MKL")
    paths = [_torch_knees(p) for p in (None, "COMPATIBLE", "AVX2")]
    assert [p[:2] for p in paths[1:]] == [paths[0][:2]] * 2
    assert [p[2][1] for p in paths] == [True] * 3 and not any(r[1] for p in paths for r in p[:2])
