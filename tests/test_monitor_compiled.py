"""The monitor inside torch.compile: caps counted in the graph on their input, nothing computed differently.

The brute force is the compiled path's own gradient: chosen pre-cap values pushed through the
compiled cap (alone, and as Gemma 2's final cap inside the compiled model), the elements whose
gradient comes back exactly 0 counted, and the same values compared with the path's first zero.
"""

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from softcapgrad.models import gemma2  # noqa: E402
from softcapgrad.stacks import registry  # noqa: E402
from softcapgrad.stacks.watch import DeadZoneMonitor  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:.*should not be instantiated:DeprecationWarning"),
              pytest.mark.filterwarnings("ignore:.*torch.jit.script_method.* is deprecated:DeprecationWarning")]
C = 30.0


def _cap(a):
    return C * torch.tanh(a / C)


def _values(n: int = 4096) -> torch.Tensor:
    """bf16 pre-cap values on both sides of the compiled path's first zero (about 260 at c = 30)."""
    g = torch.Generator().manual_seed(0)
    return (torch.randn(n, generator=g) * 300).to(torch.bfloat16)


def _run(cap, a: torch.Tensor):
    a = a.detach().requires_grad_(True)
    z = cap(a)
    (g,) = torch.autograd.grad(z, a, torch.ones_like(z))
    return z.detach(), g


def _plain_compile(fn, a: torch.Tensor):
    """``fn`` compiled for ``a``'s shape with no in-graph counter (inductor without the pass)."""
    from torch._inductor import config

    compiled = torch.compile(fn, dynamic=False)
    with config.patch(pre_grad_custom_pass=None):
        _run(compiled, a)
    return compiled


def test_compiled_cap_counted_in_graph_equals_its_zero_gradients_bit_for_bit_unchanged():
    a = _values()
    plain = _plain_compile(lambda a: _cap(a), a)
    monitor = DeadZoneMonitor()  # installs the pass: what compiles from now on carries the counter
    counted = torch.compile(lambda a: _cap(a), dynamic=False)
    z0, g0 = _run(plain, a)
    z1, g1 = _run(counted, a)  # the counter in the graph, no monitor watching
    with monitor:
        z2, g2 = _run(counted, a)
    assert torch.equal(z0, z1) and torch.equal(z0, z2) and torch.equal(g0, g1) and torch.equal(g0, g2)
    (row,) = monitor.rows()
    first = registry.first_zero("torch-compile-cpu", "bfloat16", C).value
    zero = int((g0 == 0).sum())
    assert zero > 0 and int((g0[a.abs() < first] == 0).sum()) == 0  # the compiled path's zeros are |a| ≥ first zero
    assert (row.path, row.cap, row.first_zero_grad_input, row.count, row.dead) == (
        "torch-compile-cpu", C, first, a.numel(), zero)
    assert row.saturated is None and row.zero_grad is None and row.max_abs == float(a.abs().max())
    assert row.site.endswith(f"test_monitor_compiled.py:{_cap.__code__.co_firstlineno + 1}")
    assert "compiled" in monitor.report().answer[0] and monitor.hidden() is None


def test_compiled_gemma2_final_cap_counted_against_its_own_gradient():
    model = gemma2.tiny_model()
    compiled = torch.compile(model)
    first = registry.first_zero("torch-compile-cpu", "bfloat16", C).value
    values = np.linspace(-2 * first, 2 * first, 3001)
    with DeadZoneMonitor() as monitor:  # the first call compiles, with the counters
        _, grad = gemma2.final_cap(model, values, compiled)
    rows = {r.module: r for r in monitor.rows()}
    final = rows["Gemma2ForCausalLM"]
    a = torch.tensor(values).to(torch.bfloat16).double().numpy()
    assert final.path == "torch-compile-cpu" and final.cap == C and final.calls == 1
    assert final.dead == int((np.abs(a) >= first).sum()) == int((grad == 0).sum()) > 0
    assert set(rows) == {"Gemma2ForCausalLM", "model.layers.0.self_attn"}  # the attention's cap, counted too


def test_compiled_without_counter_says_so_in_one_line():
    plain = _plain_compile(lambda a: _cap(a), _values())
    with DeadZoneMonitor() as monitor:
        _run(plain, _values())
    assert monitor.rows() == []
    assert monitor.hidden().startswith("1 compiled region ran with no in-graph counter")
    assert monitor.report().answer == ("No tanh or sigmoid ran: nothing was counted.", monitor.hidden()[0].upper()
                                       + monitor.hidden()[1:] + ".")


@pytest.mark.slow
def test_counter_changes_no_bit_of_a_compiled_gemma2_step():
    """Logits and every parameter gradient of a compiled tiny Gemma 2 step, with and without the counters."""
    from torch._inductor import config

    model = gemma2.tiny_model()
    batch = torch.randint(0, gemma2.VOCAB, (2, 16), generator=torch.Generator().manual_seed(2))

    def step(forward):
        model.zero_grad(set_to_none=True)
        logits = forward(input_ids=batch).logits
        (logits.float() * 100).logsumexp(-1).sum().backward()
        return [logits.detach()] + [p.grad for p in model.parameters()]

    plain = torch.compile(model, dynamic=False)
    with config.patch(pre_grad_custom_pass=None):
        expected = step(plain)
    torch.compiler.reset()  # dynamo's cache is per code object: the next compile must not reuse the plain one
    monitor = DeadZoneMonitor()
    with monitor:
        got = step(torch.compile(model, dynamic=False))
    assert all(torch.equal(x, y) for x, y in zip(expected, got))
    assert {(r.module, r.path, r.cap) for r in monitor.rows()} == {
        ("Gemma2ForCausalLM", "torch-compile-cpu", 30.0), ("model.layers.0.self_attn", "torch-compile-cpu", 50.0)}


def test_aot_eager_runs_eager_ops_and_is_counted_on_the_eager_path():
    """aot_eager runs no inductor pass but runs the traced aten ops one by one: the monitor sees them as eager ops."""
    compiled = torch.compile(lambda a: _cap(a), backend="aot_eager", dynamic=False)
    a = _values()
    _run(compiled, a)
    with DeadZoneMonitor() as monitor:
        _, g = _run(compiled, a)
    (row,) = monitor.rows()
    zero = int((g == 0).sum())
    assert (row.path, row.cap, row.zero_grad, row.dead) == ("torch-eager-cpu", C, zero, zero) and zero > 0


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf:UserWarning")  # dynamo's own
@pytest.mark.parametrize("reentrant", [True, False])
def test_compiled_checkpointed_model_counts_each_cap_once(reentrant):
    """A compiled, checkpointed tiny Gemma 2: each site once per step, with as many elements as the step has."""
    from monitoring import confident, ids, tiny

    model = confident(tiny("gemma2")).train()
    model.activation_checkpointing_enable({"use_reentrant": reentrant})
    compiled = torch.compile(model)
    batch = ids()
    DeadZoneMonitor()  # before the first compile
    compiled(input_ids=batch, labels=batch).loss.backward()
    with DeadZoneMonitor() as monitor:
        compiled(input_ids=batch, labels=batch).loss.backward()
    rows = {r.module: r for r in monitor.rows()}
    heads, vocab = model.config.num_attention_heads, model.config.vocab_size
    tokens = batch.numel()
    assert {m: (r.path, r.calls, r.count) for m, r in rows.items()} == {
        "model.layers.0.self_attn": ("torch-compile-cpu", 1, heads * batch.shape[0] * batch.shape[1] ** 2),
        "model.layers.1.self_attn": ("torch-compile-cpu", 1, heads * batch.shape[0] * batch.shape[1] ** 2),
        "Gemma2ForCausalLM": ("torch-compile-cpu", 1, tokens * vocab)}
