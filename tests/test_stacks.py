"""The real stacks: each live figure against the stack's own one-line explanation, the old recipes against the
stacks they name, the packaged recording, the one-sided sigmoid, and the command line."""

from importlib.resources import files

import numpy as np
import pytest

import recipes as paths
from softcapgrad.laws import formats
from softcapgrad.core import names
from softcapgrad.stacks import recording as recorded
from softcapgrad.stacks import registry as stacks
from softcapgrad.core.checks import InputError

BF16, FP32 = formats.resolve("bf16"), np.dtype(np.float32)
REC = recorded.packaged()


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


recorded_only = pytest.mark.skipif(_cuda(), reason="with CUDA present the CUDA stacks are measured, not read back")


def test_the_registry_and_the_command_line_lists_agree():
    assert names.STACK_PATHS == tuple(stacks.STACKS)
    assert names.KNEE_STACKS == tuple(n for n, s in stacks.STACKS.items() if s.has_knee)
    for name, s in stacks.STACKS.items():
        assert f"-{s.device}" in name and s.library in ("torch", "jax", "mlx")
        assert s.computes and "\n" not in s.computes
        assert s.formats and all(formats.canonical_name(f) == f for f in s.formats)
    for old, (stack, scores) in stacks.ALIASES.items():
        assert old in paths.RECIPES and scores in stacks.STACKS[stack].formats


@pytest.mark.parametrize("old", list(stacks.ALIASES))
def test_each_old_recipe_is_its_stack_bit_for_bit(old):
    """The recipe names horizon --path keeps: the same gradient as the stack, at every value of the format."""
    stack, scores = stacks.ALIASES[old]
    dtype = formats.resolve(scores)
    values = formats.positive_values(dtype)
    for c in (30.0, 50.0):
        want = paths.gradient(paths.RECIPES[old], values, c)
        assert np.array_equal(stacks.gradient(stacks.STACKS[stack], values, dtype, c), want)
        assert stacks.first_zero(old, "fp32", c).value == float(values[np.argmax(want == 0)].astype(np.float64))


def test_fused_fp32_is_dropped_because_it_equals_no_fused_kernel():
    with pytest.raises(InputError, match="flex-attention-cuda"):
        stacks.resolve_path("fused-fp32")
    emulated = paths.first_zero(paths.RECIPES["fused-fp32"], 30.0, paths.Sigmoid()).first_true
    assert emulated == stacks.first_zero("torch-eager-cpu", "fp32", 30.0).value  # the CPU's eager fp32 tanh
    for fused in ("flex-attention-cuda", "torch-compile-cuda"):
        assert REC.find(fused, "first_zero_grad_input", "float32", 30.0).value != emulated


def _first_reaching(values: np.ndarray, arguments: np.ndarray, knee: float) -> float:
    """The first of ``values`` whose argument to tanh is at or past ``knee`` (tanh returns 1.0 from there on)."""
    reached = arguments.astype(np.float64) >= knee
    assert reached.any() and reached[np.argmax(reached):].all()
    return float(values[np.argmax(reached)].astype(np.float64))


def test_torch_eager_cpu_fp32_dies_where_its_tanh_of_a_true_division_is_one():
    knee = stacks.knee("torch-eager-cpu", "fp32")
    assert knee.source == "measured" and knee.monotone
    lo, hi = np.array([8.9 * 30, 9.2 * 30], dtype=np.float32).view(np.uint32)
    window = np.arange(lo, hi, dtype=np.uint32).view(np.float32)
    want = _first_reaching(window, window / np.float32(30.0), knee.value)
    assert stacks.first_zero("torch-eager-cpu", "fp32", 30.0).value == want


@pytest.mark.parametrize("path, caps", [("torch-compile-cpu", (30.0, 50.0)), ("torch-compile-cpu-scalar", (30.0,))])
def test_torch_compile_cpu_backward_recomputes_tanh_in_fp32_from_the_input(path, caps):
    """Its one line says: a upcast to fp32, a/c a true division, tanh recomputed from the saved input in fp32.
    Then the first zero over bf16 inputs is where fl32(a/c) reaches the compiled tanh's own fp32 knee."""
    knee = stacks.knee(path, "fp32")
    assert knee.source == "measured" and knee.monotone
    values = formats.positive_values(BF16)
    for c in caps:
        found = stacks.first_zero(path, "bf16", c)
        assert found.monotone and found.value == _first_reaching(values, values.astype(np.float32) / np.float32(c), knee.value)


def test_inductor_vector_tanh_saturates_before_its_scalar_tanh_and_the_exact_knee():
    vector, scalar = stacks.knee("torch-compile-cpu", "fp32"), stacks.knee("torch-compile-cpu-scalar", "fp32")
    exact = formats.find_switch(FP32, lambda v: np.tanh(v.astype(np.float64)) > 1 - 2.0**-25).first_true
    assert vector.value < scalar.value and vector.value < exact


@pytest.mark.parametrize("scores", ["bf16", "fp32"])
def test_jax_jit_cpu_divides_by_multiplying_with_the_reciprocal(scores):
    """XLA rewrites a/c as a·fl(1/c) (fp32), each op rounded to the scores format; the knee is XLA's own tanh's."""
    pytest.importorskip("jax")
    dtype = formats.resolve(scores)
    knee = stacks.knee("jax-jit-cpu", scores)
    if dtype.itemsize <= 2:
        values = formats.positive_values(dtype)
    else:
        lo, hi = np.array([7.9 * 30, 8.1 * 50], dtype=np.float32).view(np.uint32)
        values = np.arange(lo, hi, dtype=np.uint32).view(np.float32)
    for c in (30.0, 50.0):
        q = (values.astype(np.float32) * (np.float32(1.0) / np.float32(c))).astype(dtype)
        found = stacks.first_zero("jax-jit-cpu", scores, c)
        assert found.value == _first_reaching(values, q, knee.value)


def test_a_scaled_sigmoid_dies_on_one_side_only():
    sig = stacks.dead_zone("torch-eager-cpu-sigmoid", 30.0)
    tanh = stacks.dead_zone("torch-eager-cpu", 30.0)
    large_negative = np.full(4096, -1000.0, dtype=np.float32)
    assert not stacks.dead(sig, large_negative).any(), "σ's gradient at −1000 is tiny but not zero"
    assert stacks.dead(sig, -large_negative).all() and stacks.dead(tanh, large_negative).all()
    assert sig.one_sided and not tanh.one_sided and tanh.below == -tanh.above
    # the sigmoid's negative side dies only where bf16's σ underflows: live just above, dead at it
    edge = formats.neighbours_below(BF16, -sig.below, 1).astype(np.float64)
    g = stacks.gradient(stacks.STACKS["torch-eager-cpu-sigmoid"], -edge, BF16, 30.0)
    assert g[0] != 0 and g[1] == 0


# --- the recording ---------------------------------------------------------------------------


def test_the_packaged_recording_round_trips_and_names_its_provenance():
    text = files("softcapgrad.stacks").joinpath("data", recorded.PACKAGED).read_text(encoding="utf-8")
    assert recorded.dumps(recorded.parse(text, "packaged")) == text
    assert {"torch", "cuda", "driver", "triton", "jax"} <= set(REC.versions)
    assert REC.device in REC.provenance and REC.date in REC.provenance
    for row in REC.rows:
        stack = stacks.STACKS[row.path]
        assert stack.device == "cuda" and row.scores in stack.formats
        assert (row.cap is None) == (row.quantity == "first_saturating_input")
        assert row.monotone is (row.last_unsaturated is None)
        assert row.last_unsaturated is None or row.last_unsaturated > row.value


def test_the_recorded_model_rows_agree_with_the_formula_rows():
    """transformers' Gemma 2 and flex forward on the GPU gave what the bare formula gave there."""
    checks = [r for r in REC.rows if r.site != recorded.FORMULA]
    assert checks
    for row in checks:
        assert REC.find(row.path, row.quantity, row.scores, row.cap).value == row.value


def test_a_recording_written_and_read_back_is_the_same(tmp_path):
    rec = recorded.Recording("GPU X", "2027-01-01", {"torch": "9"}, "made here", (
        recorded.Row("torch-eager-cuda", "first_zero_grad_input", "bfloat16", 30.0, 104.0, True),
        recorded.Row("jax-jit-cuda", "first_saturating_input", "float32", None, 7.5, False, 7.75, note="odd"),
    ))
    path = tmp_path / "r.json"
    path.write_text(recorded.dumps(rec), encoding="utf-8")
    assert recorded.load(path) == rec


@pytest.mark.parametrize("text, needle", [
    ("{", "not JSON"),
    ('{"format": "other"}', "not a softcapgrad recording"),
    ('{"format": "%s", "device": "", "date": "d", "provenance": "p", "versions": {}}' % recorded.FORMAT, "'device'"),
    ('{"format": "%s", "device": "g", "date": "d", "provenance": "p", "versions": {}, "rows": [{"path": "x", '
     '"quantity": "speed", "scores": "bfloat16"}]}' % recorded.FORMAT, "quantity 'speed'"),
    ('{"format": "%s", "device": "g", "date": "d", "provenance": "p", "versions": {}, "rows": [{"path": "x", '
     '"quantity": "first_zero_grad_input", "scores": "bfloat16", "value": "104"}]}' % recorded.FORMAT, r"rows\[0\]"),
])
def test_a_malformed_recording_is_one_line(text, needle):
    with pytest.raises(InputError, match=needle) as err:
        recorded.parse(text, "r.json")
    assert "\n" not in str(err.value) and str(err.value).startswith("r.json")


@recorded_only
def test_cuda_stacks_come_from_the_recording_or_say_not_measured():
    found = stacks.first_zero("torch-compile-cuda", "bf16", 30.0)
    row = REC.find("torch-compile-cuda", "first_zero_grad_input", "bfloat16", 30.0)
    assert (found.value, found.monotone, found.source) == (row.value, row.monotone, REC.source)
    fp16 = stacks.first_zero("torch-eager-cuda", "fp16", 30.0)
    assert fp16.source == "not measured" and fp16.value is None and "float16" in fp16.reason
    other_cap = stacks.first_zero("flex-attention-cuda", "bf16", 40.0)
    assert other_cap.source == "not measured" and "c = 30, 50" in other_cap.reason


@recorded_only
def test_a_non_monotone_recording_says_where_the_lasting_run_starts():
    found = stacks.first_zero("jax-jit-cuda", "fp32", 30.0)
    assert found.monotone is False and found.value < found.saturated_run_start
    assert found.saturated_run_start == float(np.nextafter(np.float32(found.last_unsaturated), np.float32(np.inf)))


# --- the command line ------------------------------------------------------------------------


def test_horizon_path_tags_every_cell(cli):
    code, data, _, _ = cli("horizon", "--path", "torch-eager-cpu", "--path", "tanh-approx-cuda", "--path",
                           "jax-eager-cuda", "--scores", "fp32", "--cap", "30", "--json")
    assert code == 0
    rows = {r["path"]: r for r in data["rows"]}
    assert rows["torch-eager-cpu"]["source"] == "measured"
    if not _cuda():
        assert rows["tanh-approx-cuda"]["source"] == REC.source
        assert rows["tanh-approx-cuda"]["first_zero_grad_input"] == REC.find(
            "tanh-approx-cuda", "first_zero_grad_input", "float32", 30.0).value
    assert data["float32_scores"][0]["c = 30"] == rows["torch-eager-cpu"]["first_zero_grad_input"]
    assert data["answer"] and all(r["reason"] for r in data["rows"])


@pytest.mark.parametrize("args, needle", [
    (["horizon", "--path", "fused-fp32"], "flex-attention-cuda"),
    (["horizon", "--path", "torch-eager-gpu"], "did you mean"),
    (["horizon", "--scores", "fp32"], "--scores does not apply without --path"),
    (["horizon", "--path", "torch-eager-cpu-upcast", "--scores", "fp32"], "takes bfloat16, float16"),
    (["horizon", "--path", "torch-eager-cpu", "--at", "120"], "--at does not apply with --path"),
])
def test_horizon_path_bad_input_is_one_line(cli, args, needle):
    code, _, _, err = cli(*args)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_stacks_lists_every_stack_and_its_source(cli):
    code, data, _, _ = cli("stacks", "--json")
    assert code == 0
    rows = {r["path"]: r for r in data["rows"]}
    assert set(rows) == set(stacks.STACKS)
    assert rows["torch-eager-cpu"]["source"] == "measured"
    assert data["params"]["recording"]["device"] == REC.device


@pytest.mark.skipif(_cuda(), reason="measures on CUDA when present")
def test_stacks_record_refuses_without_cuda(cli, tmp_path):
    target = tmp_path / "rec.json"
    code, _, out, err = cli("stacks", "--record", str(target))
    assert code == 2 and out == "" and "CUDA" in err and len(err.strip().splitlines()) == 1
    assert not target.exists()


def test_knee_backends_include_the_stacks(cli):
    code, data, _, _ = cli("knee", "--dtype", "fp32", "--backend", "torch-eager-cpu", "--backend", "jax-jit-cuda",
                           "--backend", "tanh-approx-cuda", "--json")
    assert code == 0
    rows = {b["backend"]: b for b in data["backends"]}
    assert rows["torch-eager-cpu"]["source"] == "measured" and rows["torch-eager-cpu"]["monotone"]
    if not _cuda():
        jax = rows["jax-jit-cuda"]
        assert jax["source"] == REC.source and jax["monotone"] is False
        assert jax["first_saturating_input"] < jax["saturated_run_start"]
        assert rows["tanh-approx-cuda"]["first_saturating_input"] == REC.find(
            "tanh-approx-cuda", "first_saturating_input", "float32", None).value
        assert "not monotone: jax-jit-cuda" in data["answer"][-1]


@pytest.mark.skipif(not _cuda(), reason="needs a CUDA device: records every CUDA stack live")
def test_a_new_recording_on_cuda_covers_every_cuda_stack(tmp_path):
    from softcapgrad.models.record import measure

    rec = measure()
    measured = {(r.path, r.scores) for r in rec.rows if r.site == recorded.FORMULA and r.cap is not None}
    for stack in stacks.STACKS.values():
        if stack.device == "cuda" and not stacks.runs_here(stack):
            assert {(stack.name, f) for f in stack.formats} <= measured
    assert recorded.parse(recorded.dumps(rec), "new") == rec
