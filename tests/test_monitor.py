"""DeadZoneMonitor on transformers' own model code: counts against a brute force from captured values."""

import linecache

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from softcapgrad.laws import horizon as horizon_law
from softcapgrad.stacks.watch import DeadZoneMonitor, first_zero  # noqa: E402
from softcapgrad.training.monitor import short_file  # noqa: E402

from monitoring import BF16, MODELS, Capture, _expected, _rows, _step, confident, ids, tiny  # noqa: E402

@pytest.mark.parametrize("model_type", list(MODELS))
def test_counts_equal_brute_force_per_module(model_type, monkeypatch):
    model = confident(tiny(model_type))
    capture = Capture(model, monkeypatch)
    with DeadZoneMonitor() as monitor:
        _step(model, ids())
    expected = capture.brute_force()
    rows = {r.module: r for r in monitor.rows()}
    assert set(rows) == set(expected)
    for module, (n, saturated, zero_grad, largest) in expected.items():
        row = rows[module]
        assert (row.count, row.backward_count, row.saturated, row.zero_grad) == (n, n, saturated, zero_grad), module
        assert row.max_abs_input == largest
    if model_type == "llama":
        assert rows == {}  # no cap at all: nothing to count
    else:
        assert sum(r.saturated for r in rows.values()) > 0 and sum(r.zero_grad for r in rows.values()) > 0


def test_gemma2_sites_caps_formats_and_call_sites():
    model = confident(tiny("gemma2"))
    with DeadZoneMonitor() as monitor:
        _step(model, ids())
    rows = {r.module: r for r in monitor.rows()}
    assert set(rows) == {"model.layers.0.self_attn", "model.layers.1.self_attn", "Gemma2ForCausalLM"}
    assert {m: r.cap for m, r in rows.items()} == {"model.layers.0.self_attn": 50.0, "model.layers.1.self_attn": 50.0,
                                                   "Gemma2ForCausalLM": 30.0}
    for row in rows.values():
        assert row.dtype == "bfloat16" and row.path == "torch-eager-cpu" and row.calls == 1
        assert row.first_zero_grad_input == horizon_law.first_zero_gradient(row.cap, BF16).first_true
        # the call site is the line of transformers' Gemma 2 code that calls the tanh
        file, line = row.site.rsplit(":", 1)
        assert file == "transformers/models/gemma2/modeling_gemma2.py"
        import transformers

        source = transformers.__file__.replace("__init__.py", file.removeprefix("transformers/"))
        assert "torch.tanh" in linecache.getline(source, int(line))
        assert row.max_abs == pytest.approx(row.cap * row.max_abs_input)
    assert rows["Gemma2ForCausalLM"].first_zero_grad_input == 104.0


def test_report_prints_two_views_and_writes_one_table():
    import json

    from softcapgrad.core.report import as_json

    model = confident(tiny("gemma2"))
    with DeadZoneMonitor() as monitor:
        _step(model, ids())
    data = json.loads(as_json(monitor.report()))
    assert "where" not in data and "counts" not in data  # printed views of the same rows
    assert [r["module"] for r in data["rows"]] == [r.module for r in monitor.rows()]
    assert f"{sum(r.zero_grad for r in monitor.rows()):,} received" in data["answer"][0] and len(data["answer"]) == 1
    text = monitor.table(width=100)
    assert max(len(line) for line in text.splitlines()) <= 100 and "model.layers.0.self_attn" in text


def test_gemma3_attention_cap_never_runs():
    """Gemma 3's config carries attn_logit_softcapping, but its attention never applies it (transformers 5.24)."""
    model = confident(tiny("gemma3_text"))
    with DeadZoneMonitor() as monitor:
        _step(model, ids())
    assert [(r.module, r.cap) for r in monitor.rows()] == [("Gemma3ForCausalLM", 30.0)]


def test_monitor_changes_nothing():
    model = confident(tiny("gemma2"))
    batch = ids()
    plain = _step(model, batch)
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    with DeadZoneMonitor():
        watched = _step(model, batch)
    assert torch.equal(plain, watched)
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters()))


def test_sigmoid_counts_and_pairing():
    x = torch.cat([torch.linspace(-40, 40, 801), torch.tensor([-200.0, 200.0])]).to(torch.bfloat16).requires_grad_(True)
    with DeadZoneMonitor() as monitor:
        y = torch.sigmoid(x)
        (y * torch.linspace(1, 2, y.numel()).to(torch.bfloat16)).sum().backward()
    (row,) = monitor.rows()
    stored = ((y == 0) | (y == 1)).detach()
    assert row.fn == "sigmoid" and row.cap is None and row.count == x.numel()
    assert row.saturated == int(stored.sum()) > 0
    assert row.zero_grad == int((x.grad == 0).sum()) > 0
    assert row.first_zero_grad_input == first_zero_sigmoid_brute_force()


def first_zero_sigmoid_brute_force() -> float:
    from softcapgrad.laws import formats

    values = formats.positive_values(BF16)
    x = formats.to_torch(values, BF16).requires_grad_(True)
    torch.sigmoid(x).sum().backward()
    return float(values.astype(np.float64)[int(np.argmax((x.grad == 0).numpy()))])


@pytest.mark.filterwarnings("ignore:.*should not be instantiated:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:.*torch.jit.script_method.* is deprecated:DeprecationWarning")  # inductor's first import
@pytest.mark.filterwarnings("ignore:.*should not be instantiated:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:.*torch.jit.script_method.* is deprecated:DeprecationWarning")  # inductor's first import
def test_compiled_code_runs_compiled_and_is_counted_on_its_own_path():
    """Under the monitor a compiled cap keeps its compiled gradient (non-zero at 120 where eager's is 0)."""
    monitor = DeadZoneMonitor()
    cap = torch.compile(lambda a: 30.0 * torch.tanh(a / 30.0))
    a = torch.tensor([120.0], dtype=torch.bfloat16, requires_grad=True)
    (expected,) = torch.autograd.grad(cap(a).sum(), a)
    with monitor:
        (got,) = torch.autograd.grad(cap(a).sum(), a)
    assert torch.equal(got, expected) and float(got) > 0
    (row,) = monitor.rows()
    assert (row.path, row.count, row.dead) == ("torch-compile-cpu", 1, 0) and row.first_zero_grad_input > 120
    assert monitor.compiled_regions >= 1 and monitor.hidden() is None


def test_first_zero_from_the_real_stack_table_and_short_file():
    assert first_zero("torch-eager-cpu", "bfloat16", 50.0).value == 174.0
    assert first_zero("torch-eager-cpu", "bfloat16", 1.0, "sigmoid").value == first_zero_sigmoid_brute_force()
    absent = first_zero("flex-attention-cpu", "float32", 50.0)
    assert absent.value is None and absent.source == "not measured"
    assert first_zero("torch-eager-cpu", "float64", 30.0).source == "not measured"
    import transformers

    assert short_file(transformers.__file__) == "transformers/__init__.py"


@pytest.mark.parametrize("reentrant", [True, False])
def test_checkpointed_forward_counted_once_in_its_own_module(reentrant, monkeypatch):
    """The replayed forward pairs with the backward that reads it, in the real module, and is not counted again."""
    model = confident(tiny("gemma2")).train()
    batch = ids()
    with monkeypatch.context() as patch:
        capture = Capture(model, patch)
        _step(model, batch)
    expected = _expected(capture)
    model.zero_grad(set_to_none=True)
    model.activation_checkpointing_enable({"use_reentrant": reentrant})
    replayed = Capture(model, monkeypatch)
    with DeadZoneMonitor() as monitor:
        _step(model, batch)
    assert len(replayed.calls) == len(capture.calls) + 2  # both layers' attention ran again in the backward
    assert _rows(monitor) == expected
    assert {r.module: r.recomputed for r in monitor.rows()} == {
        "model.layers.0.self_attn": 1, "model.layers.1.self_attn": 1, "Gemma2ForCausalLM": 0}
    assert sum(z for *_, z, _ in expected.values()) > 0


def test_two_models_and_two_instances_get_their_own_rows(monkeypatch):
    first, second = confident(tiny("gemma2")), confident(tiny("gemma2"), logits=40.0, queries=400.0)
    batch = ids()
    expected = {}
    for name, model in (("Gemma2ForCausalLM#1", first), ("Gemma2ForCausalLM#2", second)):
        with monkeypatch.context() as patch:
            capture = Capture(model, patch)
            _step(model, batch)
        expected |= {f"{name}/{m}": v for m, v in _expected(capture).items()}
        model.zero_grad(set_to_none=True)
    with DeadZoneMonitor() as monitor:
        _step(first, batch)
        _step(second, batch)
    assert _rows(monitor) == expected
    assert expected["Gemma2ForCausalLM#1/Gemma2ForCausalLM"] != expected["Gemma2ForCausalLM#2/Gemma2ForCausalLM"]
    with DeadZoneMonitor(models={"teacher": first}) as named:
        _step(first, batch)
    assert {r.module for r in named.rows()} == {"teacher/Gemma2ForCausalLM", "teacher/model.layers.0.self_attn",
                                                 "teacher/model.layers.1.self_attn"}


def test_autocast_counts_in_the_format_the_cap_ran(monkeypatch):
    """An fp32 model under bf16 autocast: the caps run on bf16 matmul outputs; counts equal the brute force."""
    model = confident(tiny("gemma2", dtype=torch.float32))
    capture = Capture(model, monkeypatch)
    with DeadZoneMonitor() as monitor, torch.autocast("cpu", dtype=torch.bfloat16):
        _step(model, ids())
    assert {x.dtype for _, x, _ in capture.calls} == {torch.bfloat16}
    assert _rows(monitor) == _expected(capture)
    assert {r.dtype for r in monitor.rows()} == {"bfloat16"} and sum(r.zero_grad for r in monitor.rows()) > 0


def test_every_n_watches_the_first_step_and_each_nth_only(monkeypatch):
    model = confident(tiny("gemma2"))
    batch = ids()
    capture = Capture(model, monkeypatch)
    _step(model, batch)  # the same batch and weights each step (no optimizer): every step counts alike
    once = _expected(capture)
    monitor = DeadZoneMonitor(every=2)
    seen = []
    for _ in range(5):
        with monitor.step() as watched:
            seen.append(watched)
            _step(model, batch)
    assert seen == [True, False, True, False, True] and (monitor.steps, monitor.watched) == (5, 3)
    assert _rows(monitor) == {m: (3 * n, 3 * b, 3 * s, 3 * z, largest) for m, (n, b, s, z, largest) in once.items()}
    assert {r.calls for r in monitor.rows()} == {3}
    with pytest.raises(ValueError, match="every must be"):
        DeadZoneMonitor(every=0)
