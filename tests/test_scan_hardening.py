"""scan and the stacks when the answer is not known, the file is not what it says, or the name fixes a format:
not measured is said (never "nowhere"), a bad header or a compressed .pt is one line, the file is never
memory-mapped, an old recipe name never drops a format, and a numpy-only scan imports no torch."""

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from softcapgrad.stacks import registry as stacks

CUDA_STACKS = [name for name, s in stacks.STACKS.items() if s.device == "cuda" and "float16" in s.formats]


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _one_line_refusal(cli, *args) -> str:
    code, _, out, err = cli(*args)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, (code, out, err)
    return err


@pytest.fixture
def values(tmp_path) -> Path:
    path = tmp_path / "v.npy"
    np.save(path, np.linspace(-140.0, 140.0, 1000, dtype=np.float32))  # 2 values at or past eager fp16's 135.25
    return path


# --- not measured is never "nowhere" -------------------------------------------------------------


@pytest.mark.skipif(_cuda(), reason="with CUDA present the CUDA stacks are measured live in fp16")
@pytest.mark.parametrize("name", CUDA_STACKS)
def test_a_cuda_stack_with_no_fp16_figure_is_refused_as_not_measured(cli, values, name):
    if stacks.first_zero(name, "float16", 30.0).source != "not measured":
        pytest.skip("the packaged recording holds fp16 scores for this stack")
    err = _one_line_refusal(cli, "scan", str(values), "--path", name, "--dtype", "fp16")
    assert "not measured" in err and "nowhere" not in err


@pytest.mark.skipif(_cuda(), reason="with CUDA present the CUDA stacks are measured live in fp16")
def test_a_measured_path_beside_an_unmeasured_one_counts_only_the_measured(cli, values):
    if stacks.first_zero("torch-eager-cuda", "float16", 30.0).source != "not measured":
        pytest.skip("the packaged recording holds fp16 scores for torch-eager-cuda")
    code, data, _, err = cli("scan", str(values), "--path", "torch-eager-cuda", "--path", "torch-eager-cpu",
                             "--dtype", "fp16", "--json")
    assert code == 0, err
    dead = {r["path"]: r for r in data["dead"]}
    assert dead["torch-eager-cuda"]["count"] is None and dead["torch-eager-cuda"]["first_zero_grad_input"] is None
    assert dead["torch-eager-cpu"]["count"] == int(np.sum(np.abs(np.load(values).astype(np.float16)) >= 135.25))
    assert any("torch-eager-cuda" in s and "not measured" in s for s in data["answer"])
    assert not any("nowhere" in s for s in data["answer"])
    code, data, _, _ = cli("scan", str(values), "--path", "all", "--dtype", "fp16", "--json")
    assert code == 0 and not any("nowhere" in s for s in data["answer"])
    unknown = {n for n in CUDA_STACKS if stacks.first_zero(n, "float16", 30.0).source == "not measured"}
    assert {r["path"] for r in data["dead"] if r["count"] is None} == unknown


# --- files that are not what they say ------------------------------------------------------------


def _npy(path: Path, header: str, data: bytes, version: int = 1) -> Path:
    text = header.encode("latin1")
    prefix = 10 if version == 1 else 12
    text += b" " * ((-(prefix + len(text) + 1)) % 64) + b"\n"
    size = len(text).to_bytes(2 if version == 1 else 4, "little")
    path.write_bytes(b"\x93NUMPY" + bytes([version, 0]) + size + text + data)
    return path


@pytest.mark.parametrize("header, version, needle", [
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (-5,), }", 1, "negative dimension"),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3), }", 1, "negative dimension"),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }" + " " * 20_000_000, 2, "20,000,"),
    ("{'descr': '<f4', 'fortran_order': 'yes', 'shape': (5,), }", 1, "fortran_order"),
    ("{'descr': '<f1', 'fortran_order': 'yes', 'shape': (5,), }", 1, "fortran_order"),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (5,), 'extra': 1}", 1, "exactly descr"),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': 5, }", 1, "not a tuple"),
])
def test_a_bad_npy_header_is_one_line_with_its_diagnosis(cli, tmp_path, header, version, needle):
    path = _npy(tmp_path / "bad.npy", header, np.ones(6, np.float32).tobytes(), version)
    assert needle in _one_line_refusal(cli, "scan", str(path))


def test_a_fortran_ordered_npy_is_scanned_like_its_values(cli, tmp_path):
    a = np.asfortranarray(np.linspace(-300, 300, 600, dtype=np.float32).reshape(20, 30))
    np.save(tmp_path / "f.npy", a)
    np.save(tmp_path / "c.npy", np.ascontiguousarray(a))
    runs = [cli("scan", str(tmp_path / name), "--json")[1] for name in ("f.npy", "c.npy")]
    assert runs[0]["dead"] == runs[1]["dead"] and runs[0]["quantiles"] == runs[1]["quantiles"]


torch = pytest.importorskip("torch")


def _recompressed(source: Path, target: Path, method: int) -> Path:
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(target, "w", method) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info.filename))
    return target


@pytest.mark.parametrize("method", [zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA])
def test_a_pt_with_compressed_members_is_refused_not_read_as_floats(cli, tmp_path, method):
    noise = torch.randn(995, generator=torch.Generator().manual_seed(0)) * 60.0  # barely compressible
    torch.save({"x": noise}, tmp_path / "plain.pt")
    path = _recompressed(tmp_path / "plain.pt", tmp_path / "packed.pt", method)
    assert "compressed" in _one_line_refusal(cli, "scan", str(path))


def test_a_pt_with_stored_members_rezipped_reads_the_same(cli, tmp_path):
    torch.save({"x": torch.linspace(-200, 200, 995)}, tmp_path / "plain.pt")
    path = _recompressed(tmp_path / "plain.pt", tmp_path / "again.pt", zipfile.ZIP_STORED)
    first, second = (cli("scan", str(p), "--json")[1] for p in (tmp_path / "plain.pt", path))
    assert first["dead"] == second["dead"] and first["rows"][0]["max_abs"] == 200.0


def test_an_uncoalesced_sparse_tensor_is_coalesced_as_torch_does(cli, tmp_path):
    t = torch.sparse_coo_tensor(torch.tensor([[0, 0, 2]]), torch.tensor([60.0, 60.0, 1.0]), (4,), check_invariants=True)  # 0 holds 120
    assert not t.is_coalesced()
    torch.save({"s": t}, tmp_path / "s.pt")
    code, data, _, err = cli("scan", str(tmp_path / "s.pt"), "--json")
    assert code == 0, err
    assert data["rows"][0]["max_abs"] == 120.0 and data["rows"][0]["count"] == 4
    assert data["dead"][0]["count"] == 1  # 120 ≥ 104, bf16's first zero at c = 30


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads the process's memory maps (Linux)")
@pytest.mark.parametrize("kind", [".pt", ".npy", ".safetensors"])
def test_no_file_is_memory_mapped_while_it_is_scanned(tmp_path, kind):
    """A map of a file cut short kills the process with SIGBUS; plain reads give a short read instead."""
    from softcapgrad.files import scan, tensorfiles

    path = tmp_path / f"mapped{kind}"
    values = np.linspace(-200, 200, 3 * tensorfiles.CHUNK, dtype=np.float32)
    if kind == ".pt":
        torch.save({"x": torch.from_numpy(values).reshape(-1, 64).t()}, path)
    elif kind == ".npy":
        np.save(path, values)
    else:
        from safetensors.numpy import save_file

        save_file({"x": values}, str(path))
    seen = []
    sources = scan.open_sources(path)
    for source in sources:
        for load in source.chunks():
            load()
            seen.append(str(path) in Path("/proc/self/maps").read_text())
    assert seen and not any(seen)


def test_a_pt_cut_short_between_chunks_is_one_line(tmp_path):
    """Truncated after the first chunk was read, as a writer rewriting the file would: one line, no signal."""
    code = f"""
import os
import numpy as np, torch
from pathlib import Path
from softcapgrad.core.checks import InputError
from softcapgrad.files import scan, tensorfiles
path = Path({str(tmp_path / "cut.pt")!r})
torch.save({{"x": torch.linspace(-200, 200, 4 * tensorfiles.CHUNK)}}, path)
loads = scan.open_sources(path)[0].chunks()
loads[0]()
os.truncate(path, os.path.getsize(path) // 3)
try:
    for load in loads[1:]:
        load()
except InputError as err:
    print("refused:", err)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-500:])
    assert proc.stdout.startswith("refused:") and "cut short" in proc.stdout


# --- old recipe names fix their format ------------------------------------------------------------


@pytest.mark.parametrize("args", [
    ("scan", "{file}", "--path", "eager-bf16", "--dtype", "fp16"),
    ("scan", "{file}", "--path", "remedy", "--dtype", "fp32"),
    ("scan", "{file}", "--path", "eager-fp16", "--dtype", "bf16"),
    ("horizon", "--path", "eager-bf16", "--scores", "fp16"),
    ("horizon", "--path", "sigmoid-bf16", "--scores", "fp32"),
])
def test_an_old_recipe_name_with_another_format_is_refused(cli, values, args):
    err = _one_line_refusal(cli, *(a.format(file=values) for a in args))
    assert "use --path torch-eager-cpu" in err


def test_an_old_recipe_name_with_its_own_format_still_answers(cli, values):
    code, data, _, err = cli("scan", str(values), "--path", "eager-fp16", "--dtype", "fp16", "--json")
    assert code == 0, err
    assert data["dead"][0]["scores"] == "float16" and data["dead"][0]["first_zero_grad_input"] == 135.25
    code, data, _, err = cli("horizon", "--path", "eager-bf16", "--path", "torch-eager-cpu", "--scores", "bf16",
                             "--scores", "fp16", "--cap", "30", "--json")
    assert code == 0, err
    assert {(r["path"], r["scores"]) for r in data["rows"]} == {
        ("torch-eager-cpu", "bfloat16"), ("torch-eager-cpu", "float16")}


# --- a numpy-only scan imports no torch -----------------------------------------------------------

_NO_TORCH = """
import sys
import numpy as np
from pathlib import Path
from softcapgrad.files import scan
from softcapgrad.files.scantally import DeadZone
path = Path(sys.argv[1])
zones = [DeadZone("given", "bfloat16", 104.0, -104.0), DeadZone("given16", "float16", 135.25, -135.25)]
scans = scan.scan_sources(scan.open_sources(path), 30.0, zones)
print(sum(s.beyond[0]["count"] for s in scans), sum(s.beyond[1]["count"] for s in scans))
print("torch" in sys.modules)
"""


@pytest.mark.parametrize("data", ["float32", "float64", "float16"])
@pytest.mark.parametrize("kind", [".npy", ".safetensors"])
def test_the_value_pass_over_npy_and_safetensors_imports_no_torch(tmp_path, kind, data):
    values = np.linspace(-140.0, 140.0, 1001).astype(data)
    path = tmp_path / f"v{kind}"
    if kind == ".npy":
        np.save(path, values)
    else:
        from safetensors.numpy import save_file

        save_file({"x": values}, str(path))
    proc = subprocess.run([sys.executable, "-c", _NO_TORCH, str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-500:]
    counts, imported = proc.stdout.split("\n")[:2]
    t = torch.from_numpy(values)
    want = (int((t.to(torch.bfloat16).abs() >= 104).sum()), int((t.to(torch.float16).abs() >= 135.25).sum()))
    assert counts == f"{want[0]} {want[1]}" and imported == "False"


def _cpu_only_torch() -> bool:
    from importlib import metadata

    return metadata.version("torch").endswith("+cpu")


@pytest.mark.skipif(not _cpu_only_torch(), reason="this torch may see a GPU: the scan asks torch")
def test_a_scan_against_a_recorded_stack_imports_no_torch(tmp_path):
    np.save(tmp_path / "v.npy", np.linspace(-140.0, 140.0, 1000, dtype=np.float32))
    code = ("import sys\nfrom softcapgrad.cli.app import app\n"
            "try:\n    app(['scan', sys.argv[1], '--path', 'torch-eager-cuda', '--json'])\n"
            "except SystemExit as stop:\n    assert stop.code in (0, None), stop.code\n"
            "print('torch' in sys.modules, file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "v.npy")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-500:]
    assert json.loads(proc.stdout)["dead"][0]["count"] == 260 and proc.stderr.strip() == "False"


def test_the_numpy_conversion_to_the_scores_format_is_torchs():
    from softcapgrad.files.scantally import _to_scores

    rng = np.random.default_rng(0)
    wide = np.concatenate([rng.standard_normal(20000) * 10.0 ** rng.integers(-8, 8, 20000),
                           [1e39, -1e39, 3.4e38, 65520.0, 65519.99, 104.0 + 2.0**-40, np.inf, -np.inf, 0.0, -0.0]])
    # 1 + 2⁻⁸ + 2⁻³⁰: straight to bf16 it rounds up; through float32 (as torch converts a double) it is the tie
    # 1 + 2⁻⁸, which rounds to even, 1.0
    twice = np.array([1 + 2.0**-8 + 2.0**-30, -(104.0 + 2.0**-3 + 2.0**-40)])
    with np.errstate(over="ignore"):
        kinds = (np.concatenate([wide, twice]), wide.astype(np.float32), wide.astype(np.float16))
    for data in kinds:
        for scores, target in (("bfloat16", torch.bfloat16), ("float16", torch.float16), ("float32", torch.float32)):
            mine = _to_scores(data, scores)
            theirs = torch.from_numpy(np.ascontiguousarray(data)).to(target).double().numpy()
            assert np.array_equal(mine, theirs, equal_nan=True), (data.dtype, scores)


# --- the remedies' first zeros, computed ----------------------------------------------------------


def test_stacks_says_where_each_remedy_first_dies_per_format_as_run(cli):
    from softcapgrad.laws import formats
    from softcapgrad.training.fp32grad import fp32_tanh_backward

    code, data, _, err = cli("stacks", "--json")
    assert code == 0, err
    rows = {(r["path"], r["scores"]): r for r in data["remedies"]}
    assert set(rows) == {(p, f) for p in ("torch-eager-cpu-remedy", "torch-eager-cpu-patch") for f in ("bf16", "fp16", "fp32")}

    def patched(v: np.ndarray, dtype) -> np.ndarray:
        x = formats.to_torch(v, dtype).requires_grad_(True)
        with fp32_tanh_backward():
            z = 30.0 * torch.tanh(x / 30.0)
        (g,) = torch.autograd.grad(z.sum(), x)
        return g.double().numpy() == 0.0

    for short, name in (("bf16", "bfloat16"), ("fp16", "float16"), ("fp32", "float32")):
        dtype = formats.resolve(name)
        row = rows[("torch-eager-cpu-patch", short)]
        assert row["source"] == "measured"
        assert row["first_zero_grad_input"] == formats.find_switch(dtype, lambda v: patched(v, dtype)).first_true
        assert row["first_zero_grad_input"] > row["eager_first_zero_grad_input"]
    assert rows[("torch-eager-cpu-patch", "fp32")]["first_zero_grad_input"] > 1000.0  # eager fp32 dies at ≈ 270
    assert any("torch-eager-cpu-patch" in s and "fp32" in s for s in data["answer"])
