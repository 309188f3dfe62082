"""transformers' own Gemma 2 capping code against the stacks, over every finite bf16 value.

A tiny Gemma 2 from a config with random weights (nothing downloaded); its final-logit cap and its
attention-score cap must give the gradient of torch-eager-cpu bit for bit, and under torch.compile
the gradient of torch-compile-cpu. The compiled graphs are the registry's: the stack's evaluation at
the same format and cap is compiled once and shared with the other tests.
"""

import numpy as np
import pytest

from softcapgrad.laws import formats
from softcapgrad.stacks import registry as stacks

BF16 = formats.resolve("bf16")
POSITIVE = formats.positive_values(BF16)
EVERY = np.concatenate([-POSITIVE[::-1], np.zeros(1, dtype=BF16), POSITIVE])  # every finite bf16 value but −0


@pytest.fixture(scope="module")
def gemma():
    pytest.importorskip("transformers")
    from softcapgrad.models import gemma2

    model = gemma2.tiny_model()
    caps = model.config.final_logit_softcapping, model.config.attn_logit_softcapping
    return gemma2, model, caps


def _stack(path: str, c: float) -> np.ndarray:
    return stacks.gradient(stacks.STACKS[path], EVERY, BF16, c)


SUBNORMAL = (EVERY != 0) & (np.abs(EVERY.astype(np.float64)) < float(formats.finfo(BF16).smallest_normal))


def test_eager_caps_are_torch_eager_cpu_bit_for_bit(gemma):
    """The claim is about the cap's gradient: bit for bit at every bf16 value, on any CPU.

    The attention scores reach the cap through a bf16 matmul (q·kᵀ with k the identity). Whether
    that matmul keeps a subnormal product or flushes it to 0 is the CPU's choice (oneDNN's native
    bf16 kernels, avx512_bf16 or AMX, flush; ATen's AVX2 and scalar kernels keep it), not the cap's.
    So the forward is compared exactly on the normal values and, on the subnormal ones, only
    allowed to be that value's cap or 0. The gradient does not depend on it: at a subnormal or
    zero score sech² is 1 in bf16 either way, so it is compared on every value.
    """
    import torch

    gemma2, model, (final_c, attn_c) = gemma
    x = formats.to_torch(EVERY, BF16)
    for (z, g), c in ((gemma2.final_cap(model, EVERY), final_c), (gemma2.attention_cap(model, EVERY), attn_c)):
        expected = (c * torch.tanh(x / c)).double().numpy()
        assert np.array_equal(z[~SUBNORMAL], expected[~SUBNORMAL]), "the hooks hand the cap its input exactly"
        assert np.all((z[SUBNORMAL] == expected[SUBNORMAL]) | (z[SUBNORMAL] == 0)), "a subnormal score is kept or flushed"
        assert np.array_equal(g, _stack("torch-eager-cpu", c))
        assert g[np.abs(EVERY.astype(np.float64)) >= stacks.first_zero("torch-eager-cpu", "bf16", c).value].max() == 0


def test_compiled_caps_are_torch_compile_cpu_bit_for_bit(gemma):
    import torch

    gemma2, model, (final_c, attn_c) = gemma
    # the stack first: it compiles with torch's own import-time deprecation warnings silenced, so the
    # test does not depend on another test having imported the compiler before
    want_final, want_attention = _stack("torch-compile-cpu", final_c), _stack("torch-compile-cpu", attn_c)
    _, final = gemma2.final_cap(model, EVERY, torch.compile(model))
    _, attention = gemma2.attention_cap(model, EVERY, torch.compile(model.model.layers[0].self_attn))
    assert np.array_equal(final, want_final)
    assert np.array_equal(attention, want_attention)
    eager = _stack("torch-eager-cpu", final_c)
    assert not np.array_equal(final, eager), "compiled code is not eager code"
