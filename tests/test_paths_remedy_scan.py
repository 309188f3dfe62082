"""Implementation paths, the dead-zone-free soft-cap, and the scan audit."""

import math

import ml_dtypes
import numpy as np
import pytest
import torch
from safetensors.numpy import save_file as save_np
from safetensors.torch import save_file as save_pt

import softcapgrad
import recipes as paths
from softcapgrad.laws import formats
from softcapgrad.training import remedy
from softcapgrad.files import scan, tensorfiles
from softcapgrad.laws.descent import Setting
from softcapgrad.laws.lowprecision import Backward, descend_low_precision
from softcapgrad.training.remedy import softcap

REMEDY = Backward("remedy", softcap)


def _brute_force_first_zero(recipe: paths.Recipe, c: float) -> float:
    """Every positive value of the scores format up to 60c, through the recipe, in one autograd call."""
    dtype = formats.resolve(recipe.scores)
    if dtype.itemsize <= 2:
        values = formats.positive_values(dtype)
    else:  # fp32 scores: every fp32 value in [8.9c, 9.1c] (the fp32 knee is 9.01)
        lo, hi = np.array([8.9 * c, 9.1 * c], dtype=np.float32).view(np.uint32)
        values = np.arange(lo, hi + 1, dtype=np.uint32).view(np.float32)
    values = values[values.astype(np.float64) <= 60 * c]
    g = paths.gradient(recipe, values, c)
    zero = np.flatnonzero(g == 0)
    assert zero.size and (g[zero[0]:] == 0).all()
    return float(values.astype(np.float64)[zero[0]])


@pytest.mark.parametrize("name", list(paths.RECIPES))
def test_each_path_first_zero_against_brute_force(name):
    c = 30.0
    assert paths.first_zero(paths.RECIPES[name], c, paths.Sigmoid()).first_true == _brute_force_first_zero(paths.RECIPES[name], c)


def test_path_horizons_order():
    z = {n: paths.first_zero(r, 30.0, paths.Sigmoid()).first_true for n, r in paths.RECIPES.items()}
    assert z["sigmoid-bf16"] < z["eager-bf16"] < z["eager-fp16"] < z["fused-fp32"] <= z["fp32-upcast"] < z["remedy"]
    assert z["remedy"] == pytest.approx(paths.remedy_zero_onset(30.0), rel=0.01)


def test_remedy_forward_identical_to_eager():
    x = formats.to_torch(formats.positive_values(np.dtype(ml_dtypes.bfloat16)), np.dtype(ml_dtypes.bfloat16))
    x = torch.cat([x, -x])
    assert torch.equal(softcapgrad.softcap(x, 30.0), 30.0 * torch.tanh(x / 30.0))


def test_remedy_gradient_within_one_bf16_ulp_of_sech2_over_every_input():
    c = 30.0
    bf16 = np.dtype(ml_dtypes.bfloat16)
    values = formats.positive_values(bf16)
    values = values[values.astype(np.float64) <= 10 * c]
    x = formats.to_torch(np.concatenate([values, -values]), bf16).requires_grad_(True)
    (g,) = torch.autograd.grad(softcapgrad.softcap(x, c).sum(), x)
    exact = 1.0 / np.cosh(x.detach().double().numpy() / c) ** 2  # float64 reference
    got = g.double().numpy()
    # one unit in the last place of bf16 at the exact value: spacing of the bf16 binade holding it
    ulp = np.spacing(exact.astype(ml_dtypes.bfloat16).astype(np.float32)).astype(np.float64) * 2.0**16
    assert np.all(np.abs(got - exact) <= ulp)
    assert np.all(got > 0)  # no dead zone up to 10c


# torch 2.13's dynamo itself instantiates the autograd Function while tracing and warns about it
@pytest.mark.filterwarnings("ignore:.*should not be instantiated:DeprecationWarning")
def test_remedy_saves_one_tensor_and_compiles():
    x = torch.randn(64, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(0)) * 200
    x.requires_grad_(True)
    y = softcapgrad.softcap(x, 30.0)
    assert len(y.grad_fn.saved_tensors) == 1
    compiled = torch.compile(softcapgrad.SoftCap(30.0), fullgraph=True, backend="aot_eager")
    x2 = x.detach().clone().requires_grad_(True)
    (g1,) = torch.autograd.grad(y.sum(), x)
    (g2,) = torch.autograd.grad(compiled(x2).sum(), x2)
    assert torch.equal(g1, g2)
    with pytest.raises(ValueError):
        softcapgrad.SoftCap(0.0)


def test_remedy_fp16_forward_identical_to_eager():
    fp16 = np.dtype(np.float16)
    x = formats.to_torch(formats.positive_values(fp16), fp16)
    x = torch.cat([x, -x, torch.tensor([0.0, float("inf"), -float("inf")], dtype=torch.float16)])
    assert torch.equal(softcapgrad.softcap(x, 7.5), 7.5 * torch.tanh(x / 7.5))


def test_remedy_backward_paths_agree_bit_for_bit():
    """The fp32 chunked backward against the one-pass formula; a broadcast upstream gradient (from
    ``.sum()``) against the same gradient materialised; a graph-building backward against both."""
    gen = torch.Generator().manual_seed(1)
    x32 = torch.randn(40_000, generator=gen) * 200
    up = torch.randn(40_000, generator=gen)
    x = x32.detach().requires_grad_(True)
    (g,) = torch.autograd.grad(softcapgrad.softcap(x, 30.0), x, up)
    assert torch.equal(g, remedy.sech2_wide(x32, 30.0).mul_(up).float())
    xb = (x32 / 4).to(torch.bfloat16).requires_grad_(True)
    (g_sum,) = torch.autograd.grad(softcapgrad.softcap(xb, 30.0).sum(), xb)
    (g_ones,) = torch.autograd.grad(softcapgrad.softcap(xb, 30.0), xb, torch.ones_like(xb))
    (g_graph,) = torch.autograd.grad(softcapgrad.softcap(xb, 30.0).sum(), xb, create_graph=True)
    assert torch.equal(g_sum, g_ones) and torch.equal(g_sum, g_graph.detach())
    assert g_graph.requires_grad  # the formula's backward: differentiable once more


def test_remedy_under_a_dispatch_mode_runs_the_formula():
    """A mode (a monitor, a FLOP counter) sees the formula's tanh on the caller's tensor, never a table
    being built or looked up; TetherGate's chunked path steps aside the same way."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from softcapgrad.training.tether import TetherGate

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append((str(func.overloadpacket), args[0].numel() if args and isinstance(args[0], torch.Tensor) else 0))
            return func(*args, **(kwargs or {}))

    x = (torch.randn(3000, generator=torch.Generator().manual_seed(0)) * 200).to(torch.bfloat16).requires_grad_(True)
    with Seen() as seen:
        softcapgrad.softcap(x, 31.7).sum().backward()
        TetherGate(64)(torch.randn(600, 64))
    names = [op for op, _ in seen.ops]
    assert ("aten.tanh", 3000) in seen.ops and "aten.index_select" not in names
    assert names.count("aten.sigmoid") == 1  # the gate's formula once, not once per chunk


def test_dynamics_remedy_converges_where_eager_stalls():
    s = Setting(cap=30.0)
    bf16 = np.dtype(ml_dtypes.bfloat16)
    eager = descend_low_precision(np.array([110.0]), s, True, bf16)
    remedy = descend_low_precision(np.array([110.0]), s, True, bf16, REMEDY)
    fp32 = descend_low_precision(np.array([110.0]), s, True, np.dtype(np.float32))
    assert eager.status[0] == "stalled"
    assert remedy.status[0] == "converged" and fp32.status[0] == "converged"
    assert remedy.steps[0] == pytest.approx(fp32.steps[0], rel=0.02)


# --- scan --------------------------------------------------------------------------------------


def _data(seed=0):
    gen = np.random.default_rng(seed)
    a = gen.normal(0, 40, size=(300, 50)).astype(np.float32)
    a[0, :5] = [110.0, -150.0, np.nan, 300.0, 103.9]
    return a


def _expected_beyond(a: np.ndarray, first_zero: float) -> int:
    finite = a[~np.isnan(a)].astype(ml_dtypes.bfloat16).astype(np.float64)  # fp32 -> bf16: one rounding
    return int((np.abs(finite) >= first_zero).sum())


def _write(kind: str, tmp_path, a: np.ndarray):
    path = tmp_path / f"t{kind}"
    if kind == ".npy":
        np.save(path, a)
    elif kind == ".pt":
        torch.save({"scores": torch.from_numpy(a), "other": torch.from_numpy(a[:10])}, path)
    else:
        save_np({"scores": a, "other": a[:10]}, str(path))
    return path


@pytest.mark.parametrize("kind", [".npy", ".pt", ".safetensors"])
def test_scan_counts_against_numpy(kind, tmp_path, monkeypatch):
    monkeypatch.setattr(tensorfiles, "CHUNK", 1000)  # force several chunks
    a = _data()
    path = _write(kind, tmp_path, a)
    keys = None if kind == ".npy" else ["scores"]
    report = scan.scan_report(path, 30.0, ["eager-bf16", "fp32-upcast"], keys)
    row = report.tables[0].rows[0]
    finite = a[~np.isnan(a)]
    assert row["count"] == finite.size and row["nan_count"] == 1
    assert row["max_abs"] == float(np.abs(finite).max())
    dead = {r["path"]: r["count"] for r in report.tables[1].rows if r["name"] == row["name"]}
    assert dead == {"eager-bf16": _expected_beyond(a, 104.0), "fp32-upcast": _expected_beyond(a, 272.0)}
    # the median of |a| from bins of 9 significant bits: the upper end of the bin that holds it
    median_abs = np.sort(np.abs(finite.astype(np.float64)))[int(np.ceil(0.5 * finite.size)) - 1]
    zones = scan.dead_zones(["eager-bf16"], 30.0)
    got = scan.scan_sources(scan.select(scan.open_sources(path), keys, path)[:1], 30.0, zones)[0]
    median = [q for q in got.attenuation_quantiles if q["q"] == 0.5][0]["abs_a"]
    assert median_abs < median <= median_abs * (1 + 2.0**-8)


def test_scan_reports_every_tensor_of_a_state_dict(tmp_path):
    path = _write(".pt", tmp_path, _data())
    rows = scan.scan_report(path, 30.0, ["eager-bf16"], None).tables[0].rows
    assert [r["name"] for r in rows] == ["scores", "other"]


def test_scan_example_file(cli):
    code, data, _, _ = cli("scan", "examples/logits.safetensors", "--cap", "30", "--json")
    assert code == 0
    dead = {r["name"]: r["count"] for r in data["dead"] if r["path"] == "torch-eager-cpu"}
    assert dead["final_logits"] > 0 and dead["attn_scores"] == 0


def test_scan_bad_input(cli, tmp_path):
    (tmp_path / "junk.npy").write_text("not an array")
    (tmp_path / "x.csv").write_text("1,2")
    np.save(tmp_path / "ints.npy", np.arange(10))
    torch.save({"w": torch.arange(4)}, tmp_path / "ints.pt")
    cases = [
        ([str(tmp_path / "missing.npy")], "no such file"),
        ([str(tmp_path / "junk.npy")], "cannot read"),
        ([str(tmp_path / "x.csv")], "unsupported file kind"),
        ([str(tmp_path / "ints.npy")], "not floating-point"),
        ([str(tmp_path / "ints.pt")], "not floating-point"),
        (["examples/logits.safetensors", "--key", "nope"], "no tensor named"),
        (["examples/logits.safetensors", "--cap", "0"], "--cap"),
        ([str(tmp_path)], "not a file"),
    ]
    for args, needle in cases:
        code, _, _, err = cli("scan", *args)
        assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, (args, err)


def test_horizon_path_cli_takes_the_old_recipe_names(cli):
    code, data, _, _ = cli("horizon", "--path", "eager-bf16", "--path", "remedy", "--cap", "30", "--json")
    assert code == 0
    rows = {r["path"]: r for r in data["rows"]}
    assert set(rows) == {"torch-eager-cpu", "torch-eager-cpu-remedy"}
    assert {r["scores"] for r in data["rows"]} == {"bfloat16"}
    eager = paths.first_zero(paths.RECIPES["eager-bf16"], 30.0, paths.Sigmoid()).first_true
    assert rows["torch-eager-cpu"]["first_zero_grad_input"] == eager
    assert rows["torch-eager-cpu-remedy"]["first_zero_grad_input"] > 10 * eager
    code, _, _, err = cli("horizon", "--path", "nope")
    assert code == 2 and "torch-eager-cpu" in err


def test_knee_sigmoid(cli):
    code, data, _, _ = cli("knee", "--fn", "sigmoid", "--dtype", "bf16", "--json")
    assert code == 0
    row = data["rows"][0]
    assert row["fn"] == "sigmoid" and row["knee_doc_formula"] is None
    assert row["knee_exact"] == pytest.approx(math.log(511.0))  # logit(1 − 2^−9)
