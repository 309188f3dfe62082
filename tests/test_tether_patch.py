"""softcapgrad.patch(model, gates="tether"): transformers' own gated models, patched without editing them.

At step 0 the patched model is the unpatched one bit for bit (the anchored gate with θ = 0, β = 1, F = 0 and an
open clamp runs exact operations around the same link kernel: training/anchored.py), so ``torch.equal`` is the
check, for outputs and for every parameter's gradient. After that the gate is the document's: θ gets a gradient,
the spring moves it towards its anchor.
"""

import math

import pytest
import torch

pytest.importorskip("transformers")

from transformers import (LagunaConfig, LagunaForCausalLM, LlamaConfig, LlamaForCausalLM,  # noqa: E402
                          Qwen3NextConfig, Qwen3NextForCausalLM)

import softcapgrad  # noqa: E402
from softcapgrad.core.checks import InputError  # noqa: E402
from softcapgrad.training.anchored import AnchoredGate  # noqa: E402
from softcapgrad.training.tether import anchor_targets  # noqa: E402


def laguna(gating="per-head", seed=0):
    cfg = LagunaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=8, max_position_embeddings=16, sliding_window=16,
                       layer_types=["full_attention"] * 2, mlp_layer_types=["dense"] * 2, gating=gating,
                       attn_implementation="eager")
    torch.manual_seed(seed)
    return LagunaForCausalLM(cfg)


def qwen3_next():
    cfg = Qwen3NextConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                          layer_types=["full_attention", "linear_attention"], num_experts=4, num_experts_per_tok=2,
                          moe_intermediate_size=16, shared_expert_intermediate_size=16, linear_num_value_heads=2,
                          linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
                          attn_implementation="eager")
    torch.manual_seed(0)
    return Qwen3NextForCausalLM(cfg)


IDS = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))


def _grads(model):
    model.zero_grad(set_to_none=True)
    z = model(input_ids=IDS).logits
    (z.float() ** 2).mean().backward()
    return z.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if "tether_gate" not in n}


@pytest.mark.parametrize("gating", ["per-head", "per-element"])
def test_laguna_bit_for_bit_at_step_0(gating):
    model = laguna(gating if gating == "per-head" else False)
    z0, g0 = _grads(model)
    p = softcapgrad.patch(model, gates="tether")
    z1, g1 = _grads(model)
    assert [h.cls for h in p.held] == ["LagunaAttention"] * 2 and p.refused == []
    assert p.held[0].gates == (4 if gating == "per-head" else 32) and p.held[0].link == "softplus"
    assert torch.equal(z0, z1)
    assert g0.keys() == g1.keys() and all(torch.equal(g0[k], g1[k]) for k in g0)
    assert all(g.theta.grad is not None and bool(g.theta.grad.abs().sum() > 0) for g in p.gates)


def test_qwen3_next_bf16_bit_for_bit_and_refusals():
    model = qwen3_next().to(torch.bfloat16)
    with torch.no_grad():
        z0 = model(input_ids=IDS).logits
        p = softcapgrad.patch(model, gates="tether")
        z1 = model(input_ids=IDS).logits
    assert torch.equal(z0, z1)
    assert [(h.module, h.link, h.gates) for h in p.held] == [("model.layers.0.self_attn", "sigmoid", 32)]
    kinds = {(r.module, r.kind) for r in p.refused}
    assert ("model.layers.0.mlp.gate", "router") in kinds and ("model.layers.0.mlp.shared_expert_gate", "router") in kinds
    assert ("model.layers.1.linear_attn", "activation") in kinds


def test_outputs_change_once_theta_moves_and_remove_restores():
    model = laguna()
    with torch.no_grad():
        z0 = model(input_ids=IDS).logits
        p = softcapgrad.patch(model, gates="tether")
        for g in p.gates:
            g.theta.fill_(1.0)
        assert not torch.equal(z0, model(input_ids=IDS).logits)
        p.remove()
        assert torch.equal(z0, model(input_ids=IDS).logits)
    assert not any("tether_gate" in n for n, _ in model.named_parameters())


def test_spring_pulls_theta_to_its_anchor():
    """tethergate.md's spring with k = lr·wd (the floor stays 0): θ − θ* shrinks by (1 − k) per step."""
    model = laguna()
    p = softcapgrad.patch(model, gates="tether")
    model.train()
    with torch.no_grad():
        model(input_ids=IDS)  # the first observation sets the EMA
    gate = p.gates[0]
    target = anchor_targets(gate, 0.5, "global").clone()
    before = (gate.theta - target).clone()
    lr, wd = 1e-2, 20.0
    assert p.step(1, lr, wd) == 0.0 and bool((gate.floor == 0).all())
    after = gate.theta - target
    torch.testing.assert_close(after, before * (1 - lr * wd), rtol=1e-6, atol=1e-7)
    # the softplus link's anchor: θ* = EMA(u) − log(e^0.5 − 1)
    torch.testing.assert_close(target, gate.ema_s.mean().expand_as(target) - math.log(math.expm1(0.5)),
                               rtol=0, atol=1e-6)


def test_refused_in_one_line():
    with pytest.raises(InputError, match="no head gate this patch can hold") as err:
        softcapgrad.patch(LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=16,
                                                       num_hidden_layers=1, num_attention_heads=2)), gates="tether")
    assert "\n" not in str(err.value)
    model = laguna()
    with pytest.raises(InputError, match="holds tether"):
        softcapgrad.patch(model, gates="sigmoid")
    softcapgrad.patch(model, gates="tether")
    with pytest.raises(InputError, match="already patched"):
        softcapgrad.patch(model, gates="tether")


def test_anchored_gate_link_names():
    with pytest.raises(InputError, match="link must be one of"):
        AnchoredGate(2, "softmax")


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*should not be instantiated:DeprecationWarning")  # torch's own, at compile
@pytest.mark.filterwarnings("ignore:.*torch.jit.script_method.* is deprecated:DeprecationWarning")
def test_compiled_patched_model_matches_eager():
    """torch.compile traces the mode: the same gate (θ moved off 0, so the gate matters) to fp32 rounding of the
    fused kernels (a few ulps of the largest logit), and θ gets the same gradient."""
    model = laguna()
    p = softcapgrad.patch(model, gates="tether")
    with torch.no_grad():
        for g in p.gates:
            g.theta.fill_(1.0)
    eager = model(input_ids=IDS).logits
    eager.sum().backward()
    want = [g.theta.grad.clone() for g in p.gates]
    model.zero_grad(set_to_none=True)
    compiled = torch.compile(model)(input_ids=IDS).logits
    compiled.sum().backward()
    scale = float(eager.detach().abs().max())
    torch.testing.assert_close(compiled, eager, rtol=0, atol=16 * 2.0**-24 * scale)
    for g, w in zip(p.gates, want):
        torch.testing.assert_close(g.theta.grad, w, rtol=1e-4, atol=1e-5 * float(w.abs().max()))
