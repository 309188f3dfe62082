"""fp32_tanh_backward / patch: same forward, a derivative from the input in fp32, on real model code."""

import ml_dtypes
import numpy as np
import pytest
import torch

import softcapgrad
from softcapgrad.laws import formats
from softcapgrad.training.fp32grad import fp32_tanh_backward, patch


def _every(dtype_name: str) -> torch.Tensor:
    dtype = np.dtype(getattr(ml_dtypes, dtype_name, None) or dtype_name)
    values = formats.positive_values(dtype)
    x = formats.to_torch(values, dtype)
    return torch.cat([-x.flip(0), torch.zeros(1, dtype=x.dtype), x])


def _sech2(v: np.ndarray) -> np.ndarray:
    """sech²(v) = 4e^{−2|v|}/(1 + e^{−2|v|})² in float64, without overflow."""
    e = np.exp(-2.0 * np.abs(v))
    return 4.0 * e / (1.0 + e) ** 2


def _ulp(exact: np.ndarray, dtype) -> np.ndarray:
    """One unit in the last place of ``dtype`` at each exact value: the spacing of its binade."""
    stored = exact.astype(dtype)
    return np.abs(np.nextafter(stored, np.array(np.inf, dtype=dtype)).astype(np.float64) - stored.astype(np.float64))


@pytest.mark.parametrize("fn", ["tanh", "sigmoid"])
@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_forward_bit_identical_and_gradient_within_one_ulp_over_every_value(fn, name):
    x = _every(name)
    op = getattr(torch, fn)
    plain = op(x)
    xg = x.clone().requires_grad_(True)
    with fp32_tanh_backward():
        y = op(xg)
    assert torch.equal(y.detach(), plain)
    (g,) = torch.autograd.grad(y.sum(), xg)
    v = x.double().numpy()
    exact = _sech2(v) if fn == "tanh" else np.exp(-np.logaddexp(0, v) - np.logaddexp(0, -v))  # σ(x)σ(−x)
    dtype = np.dtype(getattr(ml_dtypes, name, None) or name)
    normal = exact >= float(ml_dtypes.finfo(dtype).smallest_normal)
    got = g.double().numpy()
    assert np.all(np.abs(got - exact)[normal] <= _ulp(exact[normal], dtype))
    assert np.all(got[normal] > 0)  # no dead zone wherever the exact derivative is a normal number
    x2 = x.clone().requires_grad_(True)
    (eager,) = torch.autograd.grad(op(x2).sum(), x2)
    assert int((eager == 0)[torch.from_numpy(normal)].sum()) > 0  # eager's dead zone is real on these inputs


def test_saves_the_input_instead_of_the_output():
    x = (torch.randn(4, 64, generator=torch.Generator().manual_seed(0)) * 200).to(torch.bfloat16).requires_grad_(True)

    def saved(under_patch: bool) -> list[tuple]:
        packed = []

        def pack(t):
            packed.append((tuple(t.shape), t.dtype))
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            if under_patch:
                with fp32_tanh_backward():
                    30.0 * torch.tanh(x / 30.0) + torch.sigmoid(x)
            else:
                30.0 * torch.tanh(x / 30.0) + torch.sigmoid(x)
        return packed

    assert saved(True) == saved(False) == [((4, 64), torch.bfloat16)] * 2


def test_only_covered_formats_that_need_a_gradient_are_replaced():
    with fp32_tanh_backward():
        y64 = torch.tanh(torch.ones(3, dtype=torch.float64, requires_grad=True))
        y16 = torch.tanh(torch.ones(3, dtype=torch.bfloat16))
        yg = torch.tanh(torch.ones(3, dtype=torch.bfloat16, requires_grad=True))
    assert y64.grad_fn.name() == "TanhBackward0" and y16.grad_fn is None
    assert yg.grad_fn.name() == "FromInputBackward"


def test_composes_with_autocast():
    lin = torch.nn.Linear(8, 8)
    with torch.no_grad():
        lin.weight.copy_(torch.eye(8) * 4.0)
        lin.bias.zero_()
    x = torch.full((1, 8), 1.0)  # Linear under autocast gives bf16 4.0: tanh's knee is 3.47

    def grad(under_patch: bool):
        lin.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if under_patch:
                with fp32_tanh_backward():
                    y = torch.tanh(lin(x))
            else:
                y = torch.tanh(lin(x))
        y.sum().backward()
        return y.detach(), lin.weight.grad.diagonal().clone()

    (y0, g0), (y1, g1) = grad(False), grad(True)
    assert y0.dtype == torch.bfloat16 and torch.equal(y0, y1)
    assert torch.all(g0 == 0) and torch.all(g1 > 0)
    assert torch.allclose(g1, torch.full_like(g1, 1.0 / np.cosh(4.0) ** 2), rtol=2.0**-7)


@pytest.mark.filterwarnings("ignore:.*should not be instantiated:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:.*torch.jit.script_method.* is deprecated:DeprecationWarning")
def test_composes_with_torch_compile():
    class Cap(torch.nn.Module):
        def forward(self, a):
            return 30.0 * torch.tanh(a / 30.0)

    a = torch.tensor([10.0, 120.0, -120.0, 300.0], dtype=torch.bfloat16)
    plain = torch.compile(Cap(), fullgraph=True)
    fixed = Cap()
    patch(fixed)
    fixed = torch.compile(fixed, fullgraph=True)

    def run(model):
        x = a.clone().requires_grad_(True)
        y = model(x)
        (g,) = torch.autograd.grad(y.sum(), x)
        return y.detach(), g

    (y0, g0), (y1, g1) = run(plain), run(fixed)
    assert torch.equal(y0, y1)  # the compiled forward is unchanged by the patch
    assert float(g0[3]) == 0.0 and torch.all(g1 > 0)  # compiled eager-formula dies at 300; the patch does not
    exact = _sech2(a.double().numpy() / 30.0)
    assert np.all(np.abs(g1.double().numpy() - exact) <= 2 * _ulp(exact, np.dtype(ml_dtypes.bfloat16)))


def test_patch_is_removable_and_refuses_twice():
    m = torch.nn.Tanh()
    handle = patch(m)
    with pytest.raises(ValueError):
        patch(m)
    x = torch.tensor([10.0], dtype=torch.bfloat16, requires_grad=True)
    assert m(x).grad_fn.name() == "FromInputBackward"
    handle.remove()
    assert m(x).grad_fn.name() == "TanhBackward0"


def test_public_names():
    assert softcapgrad.fp32_tanh_backward is fp32_tanh_backward and softcapgrad.patch is patch
    from softcapgrad.stacks.watch import DeadZoneMonitor

    assert softcapgrad.DeadZoneMonitor is DeadZoneMonitor


# --- on Gemma 2's own code --------------------------------------------------------------------

transformers = pytest.importorskip("transformers")

from softcapgrad.models import audit  # noqa: E402


def _gemma2(dtype, **sets):
    config = audit.model_type_config("gemma2", {"final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0, **sets})
    torch.manual_seed(0)
    return audit.build(audit.Source(config, None, False), config, "eager", dtype)


def test_gemma2_bf16_logit_at_pre_cap_120_gets_a_gradient_only_with_the_patch():
    ids = torch.randint(0, 256, (1, 6), generator=torch.Generator().manual_seed(0))
    seen = {}

    def to_120(module, args, out):  # one pre-cap logit set to 120 = 4c, past bf16's horizon 104
        shift = torch.zeros_like(out)
        shift[0, -1, 5] = 120.0 - out[0, -1, 5].detach()
        out = out + shift
        seen["a"] = out
        out.register_hook(lambda g: seen.__setitem__("grad", g[0, -1, 5].item()))
        return out

    results = {}
    for use in (False, True):
        model = _gemma2(torch.bfloat16)
        model.lm_head.register_forward_hook(to_120)
        if use:
            patch(model)
        logits = model(input_ids=ids).logits
        logits[0, -1, 5].backward()
        assert seen["a"][0, -1, 5].item() == 120.0 and logits.dtype == torch.bfloat16
        results[use] = (logits.detach(), seen["grad"])
    assert torch.equal(results[False][0], results[True][0])  # forward bit-identical
    assert results[False][1] == 0.0
    assert results[True][1] == pytest.approx(1.0 / np.cosh(4.0) ** 2, rel=2.0**-7)


def test_short_training_run_moves_a_confident_wrong_logit_only_with_the_patch():
    """fp32 master weights, bf16 autocast, SGD on the head (body frozen, so the wrong logit moves only by its own gradient)."""
    wrong, right, token = 7, 3, 11
    ids = torch.full((1, 8), token)

    def pre_cap(model):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            return float(model.lm_head(model.model(input_ids=ids).last_hidden_state)[0, -1, wrong])

    moved = {}
    for use in (False, True):
        model = _gemma2(torch.float32, tie_word_embeddings=False)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            h = model.model(input_ids=ids).last_hidden_state[0, -1].float()
        with torch.no_grad():
            model.lm_head.weight[wrong] = 120.0 * h / h.dot(h)  # every position's wrong logit ≈ 120 = 4c
        model.model.requires_grad_(False)
        if use:
            patch(model)
        start = pre_cap(model)
        opt = torch.optim.SGD(model.lm_head.parameters(), lr=5.0)
        for _ in range(10):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=torch.full((1, 8), right)).loss
            loss.backward()
            if not use:
                assert torch.all(model.lm_head.weight.grad[wrong] == 0)
            opt.step()
            opt.zero_grad()
        moved[use] = (start, pre_cap(model))
    assert moved[False][0] == moved[True][0] == 120.0
    assert moved[False][1] == 120.0  # stalled: its gradient is exactly 0 at every step
    assert moved[True][1] <= 119.0  # at least two bf16 steps of 0.5 down
