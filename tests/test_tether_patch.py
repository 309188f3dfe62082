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


def qwen3_next_gated_attention():
    """Qwen3-Next reduced to one gated-attention layer with a dense MLP: the one site the patch holds, without the
    linear-attention and MoE layers it never enters. Under torch.compile that is 30 C++ kernels instead of 59 (and
    about 46 s of CPU for both compiles of the test below instead of 122, measured on 2 cores)."""
    torch.manual_seed(0)
    return Qwen3NextForCausalLM(Qwen3NextConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, layer_types=["full_attention"], mlp_only_layers=[0],
        attn_implementation="eager"))


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
    assert p.step(1, lr, wd, g_target=0.5) == 0.0 and bool((gate.floor == 0).all())  # a hand target: global
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


def _openings(model, patched: bool) -> torch.Tensor:
    """Each head gate's opening on IDS: its output's mean over the tokens, per layer and head (float64)."""
    seen = []

    def keep(module, args, out) -> None:  # None: a forward hook's result would replace the output
        g = out if patched else torch.nn.functional.softplus(out.float())
        seen.append(g.detach().double().reshape(-1, g.shape[-1]).mean(0))

    hooks = [(a.tether_gate if patched else a.g_proj).register_forward_hook(keep)
             for a in (layer.self_attn for layer in model.model.layers)]
    with torch.no_grad():
        model(input_ids=IDS)
    for h in hooks:
        h.remove()
    return torch.stack(seen)


def _set_openings(model, means: list[float]) -> None:
    """Shift each head's g_proj row along the tokens' mean input μ so that its mean u on IDS is ``means[i]``."""
    for layer in model.model.layers:
        proj, kept = layer.self_attn.g_proj, []
        hook = proj.register_forward_hook(lambda m, args, out: kept.append((args[0].detach(), out.detach())) and None)
        with torch.no_grad():
            model(input_ids=IDS)
        hook.remove()
        h, u = kept[0]
        mu = h.reshape(-1, h.shape[-1]).mean(0)
        with torch.no_grad():
            for i, m in enumerate(means):
                proj.weight[i] += (m - u.reshape(-1, u.shape[-1])[:, i].mean()) * mu / mu.dot(mu)


def test_the_patch_keeps_each_gate_s_learnt_opening_when_the_loss_leaves_the_gates_alone():
    """Laguna's softplus head gates set to four openings per layer (mean u −3, −1, 0.5, 2: openings 0.17 to 2.3,
    softplus' own units), patched, then 40 AdamW steps (lr 1e-2; the spring's k = lr·wd = 0.2 leaves 0.8⁴⁰ ≈ 1e-4 of
    a gap) on the same batch with a loss on the output head's
    weights alone: the forward runs (each gate's EMA observes its input) but no gradient reaches the gates' branch.
    The default spring holds each gate at the opening it had on the first batch: θ* = EMA(u) − m₀ with EMA(u) the EMA
    of the same mean m₀, which its roundings (two of 2⁻²⁴ relative per step) keep within 2·2⁻²⁴·|m₀|/(1 − 0.99) of
    m₀; softplus' slope is below 1, so each opening moves by at most |θ| ≤ 256·2⁻²⁴·max|m₀|. The hand target
    g_target = 0.5 pulls the gates instead: with tethergate.md's global anchor (one target per layer, the old default)
    by more than 100 times that bound, with a local one every gate by > 0.05."""
    means = [-3.0, -1.0, 0.5, 2.0]
    bound = 256 * 2.0**-24 * max(abs(m) for m in means)
    moved = {}
    for g_target, anchor in ((None, None), (0.5, "global"), (0.5, "local")):
        model = laguna()
        _set_openings(model, means)
        before = _openings(model, patched=False)
        assert before.min() < 0.2 and before.max() > 2.0  # several openings, some above 1
        p = softcapgrad.patch(model, gates="tether")
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
        for t in range(1, 41):
            opt.zero_grad(set_to_none=True)
            model(input_ids=IDS)
            model.lm_head.weight.square().mean().backward()
            opt.step()
            p.step(t, 1e-2, g_target=g_target, anchor=anchor)
        model.eval()
        moved[anchor] = (_openings(model, patched=True) - before).abs()
        if g_target is None:
            held = torch.tensor(p.held_openings(), dtype=torch.float64)  # link(m₀), m₀ set to float32 rounding
            want = torch.nn.functional.softplus(torch.tensor(means * 2, dtype=torch.float64))
            assert float((held - want).abs().max()) <= 16 * 2.0**-24 * max(abs(m) for m in means)
    assert float(moved[None].max()) <= bound, (moved[None], bound)
    assert float(moved["global"].max()) > 100 * bound  # the old default: one target per layer
    assert float(moved["local"].min()) > 0.05, moved["local"]  # every gate to 0.5


def test_a_trainer_callback_steps_the_spring_with_the_scheduler_s_lr(tmp_path):
    """softcapgrad.TetherCallback in a real Trainer (4 steps, a linear schedule): after each optimizer step the spring
    runs with the lr that step used, as TetherPatch.step called by hand there does, bit for bit; a θ left out of the
    optimizer is one line."""
    pytest.importorskip("accelerate")
    from transformers import Trainer, TrainerCallback, TrainingArguments

    class Spring(TrainerCallback):  # by hand: the lr the scheduler set for the step just taken
        def __init__(self, p):
            self.p = p

        def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
            self.p.step(state.global_step + 1, optimizer.param_groups[0]["lr"])

    thetas = []
    for make in (softcapgrad.TetherCallback, Spring):
        model = laguna()
        p = softcapgrad.patch(model, gates="tether")
        args = TrainingArguments(output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=2,
                                 learning_rate=1e-2, lr_scheduler_type="linear", report_to="none", save_strategy="no",
                                 use_cpu=True, dataloader_num_workers=0, disable_tqdm=True, seed=0)
        data = [{"input_ids": row, "labels": row} for row in IDS.repeat(4, 1)]
        Trainer(model=model, args=args, train_dataset=data, callbacks=[make(p)]).train()
        thetas.append(torch.cat([g.theta.detach().clone() for g in p.gates]))
    assert torch.equal(thetas[0], thetas[1]) and bool(thetas[0].abs().sum() > 0)
    with pytest.raises(ValueError, match="patch the model before"):
        softcapgrad.TetherCallback(p)._lr(torch.optim.SGD(model.lm_head.parameters(), lr=0.1))


def _compiled_grads(model):
    torch._dynamo.reset()
    model.zero_grad(set_to_none=True)
    z = torch.compile(model)(input_ids=IDS).logits
    (z.float() ** 2).mean().backward()
    return z.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if "tether_gate" not in n}


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*should not be instantiated:DeprecationWarning")  # torch's own, at compile
@pytest.mark.filterwarnings("ignore:.*torch.jit.script_method.* is deprecated:DeprecationWarning")
@pytest.mark.parametrize("make", [laguna, qwen3_next_gated_attention], ids=["laguna", "qwen3_next"])
def test_compiled_at_step_0_the_patch_is_the_compiled_model(make):
    """Under torch.compile, bf16, step 0: the patched model against the same model compiled unpatched (compiled
    against eager differs in every gradient either way: inductor's fused fp32 arithmetic). Laguna: logits and every
    gradient bit for bit. Qwen3-Next (its gated-attention layer alone): logits bit for bit; its gradients at most one
    bf16 rounding of the tensor's largest element apart (2⁻⁸ of it; measured: q_proj's alone, by 3.5e-4 of its
    largest, the other 13 equal), where inductor rounds the gate's backward to bf16 at a different place once θ's
    gradient also reads it. With two gated layers that difference reaches the first layer's every gradient through
    the second's backward (measured: 14 of 25 apart, the largest by 2.9e-3), so one layer shows it where it starts."""
    model = make().to(torch.bfloat16)
    model.train()
    z0, g0 = _compiled_grads(model)
    softcapgrad.patch(model, gates="tether")
    z1, g1 = _compiled_grads(model)
    assert torch.equal(z0, z1) and g0.keys() == g1.keys()
    apart = {k: float((g1[k].float() - g0[k].float()).abs().max() / g0[k].float().abs().max()) for k in g0}
    if make is laguna:
        assert all(torch.equal(g0[k], g1[k]) for k in g0), [k for k, v in apart.items() if v]
    assert max(apart.values()) <= 2.0**-8, apart
