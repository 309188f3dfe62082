"""gate-demo's gated-attention block against transformers' own LagunaAttention: same weights, same numbers.

RoPE is made the identity (cos = 1, sin = 0) and the q/k RMSNorms are replaced by the identity, the
two things Laguna adds that the document's block leaves out; everything else is Laguna's code.
The model runs in float64, but Laguna computes two things in float32 on purpose: its softplus gate
(``softplus(g_proj(h).float())``, the document's "in FP32") and the eager attention's softmax
(transformers' ``softmax(..., dtype=float32)``). So the two sides agree to float32's unit roundoff
u = 2⁻²⁴ ≈ 6e-8 of the largest value, times a small factor for the sums after those roundings
(measured: 4e-8 to 8e-8); 16u leaves room and still fails on any wrong term (a missing reduction
over d_h or a gate on the wrong axis is an O(1) error).
"""

import pytest
import torch

pytest.importorskip("transformers")

from transformers import LagunaConfig  # noqa: E402
from transformers.models.laguna.modeling_laguna import LagunaAttention  # noqa: E402

from softcapgrad.demos import gates  # noqa: E402

REL = 16 * 2.0**-24  # float32's unit roundoff (Laguna's gate and softmax), ×16 for the sums after them


def laguna(shape: gates.Shape, p: dict, gating="per-head", heads_per_layer=None, layer: int = 0) -> LagunaAttention:
    heads = heads_per_layer or [shape.H_q, shape.H_q]
    config = LagunaConfig(hidden_size=shape.D, num_attention_heads=max(heads), num_key_value_heads=shape.H_kv,
                          head_dim=shape.d_h, num_hidden_layers=len(heads), num_attention_heads_per_layer=heads,
                          layer_types=["full_attention"] * len(heads), gating=gating, attention_bias=False,
                          vocab_size=32, intermediate_size=8, moe_intermediate_size=8, num_experts=2,
                          num_experts_per_tok=1, shared_expert_intermediate_size=8)
    config._attn_implementation = "eager"
    block = LagunaAttention(config, layer, heads[layer]).double()
    block.q_norm = torch.nn.Identity()
    block.k_norm = torch.nn.Identity()
    with torch.no_grad():
        block.q_proj.weight.copy_(p["W_Q"].T)
        block.k_proj.weight.copy_(p["W_K"].T)
        block.v_proj.weight.copy_(p["W_V"].T)
        block.o_proj.weight.copy_(p["W_O"].T)
        if gating == "per-head":
            block.g_proj.weight.copy_(p["W_g"].T)
    return block


def run(block: LagunaAttention, H: torch.Tensor) -> torch.Tensor:
    B, T, _ = H.shape
    cos = torch.ones(B, T, block.head_dim, dtype=H.dtype)  # RoPE at angle 0: the identity
    sin = torch.zeros(B, T, block.head_dim, dtype=H.dtype)
    mask = torch.full((T, T), float("-inf"), dtype=H.dtype).triu(1).expand(B, 1, T, T)
    out, _ = block(H, (cos, sin), mask)
    return out


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool((a - b).abs().max() <= REL * b.abs().max())


SHAPES = [gates.Shape(B=2, T=5, D=16, H_q=4, H_kv=2, d_h=4), gates.Shape(B=1, T=7, D=24, H_q=6, H_kv=3, d_h=8)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"Hq{s.H_q}Hkv{s.H_kv}")
def test_per_head_forward_and_hand_backward_match_laguna(shape):
    p = gates._weights(shape, seed=3)
    f = gates.gated_attention(p, shape)
    hand = gates.gate_backward_by_hand(p, f, shape)
    block = laguna(shape, p)
    H = p["H"].clone().requires_grad_(True)
    Y = run(block, H)
    assert Y.shape == f["Y"].shape and close(Y, f["Y"])
    (Y * p["R"]).sum().backward()
    assert close(H.grad, hand["H"])  # both branches into H: attention and gate
    assert close(block.g_proj.weight.grad.T, hand["W_g"])  # ∂L/∂W_g = Hᵀ Z̄_g: the reduction over d_h included
    assert block.g_proj.weight.shape == (shape.H_q, shape.D)  # one gate per (token, head)


def test_per_element_gate_is_one_value_per_channel():
    shape = SHAPES[0]
    p = gates._weights(shape, seed=5)
    f = gates.gated_attention(p, shape)
    block = laguna(shape, p, gating="per-element")
    contrast = {r["gate"]: r for r in gates.per_element_contrast(shape)}
    assert list(block.g_proj.weight.T.shape) == contrast["per-element"]["W_g_shape"]
    assert block.g_proj.out_features == contrast["per-element"]["gate_values_per_token"]
    W = torch.randn(shape.D, shape.H_q * shape.d_h, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        block.g_proj.weight.copy_(W.T)
    # the document's block with the broadcast replaced by one gate per channel
    A = f["A"].reshape(shape.B, shape.T, -1)
    expected = (A * torch.nn.functional.softplus(p["H"] @ W)) @ p["W_O"]
    assert close(run(block, p["H"]), expected)


def test_layers_with_different_head_counts_and_the_cost_figures():
    heads = [2, 4]
    cfg = gates.Config(D=16, H_kv=2, d_h=4)
    for layer, h in enumerate(heads):
        shape = gates.Shape(B=2, T=5, D=cfg.D, H_q=h, H_kv=cfg.H_kv, d_h=cfg.d_h)
        p = gates._weights(shape, seed=11 + layer)
        block = laguna(shape, p, heads_per_layer=heads, layer=layer)
        assert block.num_heads == h
        assert close(run(block, p["H"]), gates.gated_attention(p, shape)["Y"])
        cost = gates.layer_cost(cfg, h)
        assert cost["gate_params"] == block.g_proj.weight.numel()
        assert cost["qkvo_params"] == sum(getattr(block, n).weight.numel() for n in ("q_proj", "k_proj", "v_proj", "o_proj"))
        assert cost["gate_values_per_token"] == block.g_proj.out_features
        assert cost["attention_channels_per_token"] == block.o_proj.in_features
