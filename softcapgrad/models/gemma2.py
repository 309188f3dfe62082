"""transformers' Gemma 2, driven so that its own capping code sees chosen pre-cap values.

A tiny Gemma 2 is built from a ``Gemma2Config`` with random weights (nothing is downloaded), with
eager attention. Gemma 2 caps in two places, both in transformers' code: the final logits
(``Gemma2ForCausalLM.forward``: logits / c, tanh, · c) and the attention scores
(``eager_attention_forward``: the same on q·kᵀ·scaling). Forward hooks put the chosen values where
each cap reads its input; the gradient that comes back to them is the cap's own, for an upstream
gradient of ones (the output comes back too):

- final logits: a hook replaces ``lm_head``'s output with the values; nothing follows the cap.
- attention: hooks make q the values and k, v the identity (head_dim keys e_j, one per token), the
  rotary embedding the identity (cos 1, sin 0), ``query_pre_attn_scalar`` = 1 (scaling 1), and the
  output projection the identity; the softmax is replaced by the identity cast it wraps, so the
  attention output is the capped scores themselves. Every step but the cap is exact: one non-zero
  product per matmul entry, multiplications by 1.
"""

from __future__ import annotations

import contextlib
import types
from typing import Callable

import numpy as np

from softcapgrad.laws import formats
from softcapgrad.stacks.runners import BATCH, batched

HEADS, HEAD_DIM = 8, 64  # HEADS·HEAD_DIM² = BATCH scores per attention call
VOCAB = 4096  # BATCH // VOCAB tokens of final logits per call


def tiny_model(final_cap: float = 30.0, attn_cap: float = 50.0, dtype: str = "bf16", device: str = "cpu", seed: int = 0):
    """Gemma2ForCausalLM with one layer, random weights, eager attention, in ``dtype`` on ``device``."""
    import torch
    from transformers import Gemma2Config, Gemma2ForCausalLM

    config = Gemma2Config(
        vocab_size=VOCAB, hidden_size=HEADS * HEAD_DIM, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=HEADS, num_key_value_heads=1, head_dim=HEAD_DIM, query_pre_attn_scalar=1,
        final_logit_softcapping=final_cap, attn_logit_softcapping=attn_cap, max_position_embeddings=HEAD_DIM,
        attn_implementation="eager",
    )
    torch.manual_seed(seed)
    return Gemma2ForCausalLM(config).to(device=device, dtype=formats.torch_dtype(formats.resolve(dtype))).eval()


def _pairs(values: np.ndarray, run: Callable[[np.ndarray], np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """``run`` gives (output, gradient) per value; the two arrays over ``values``."""
    both = batched(values, run, width=2)
    return both[:, 0], both[:, 1]


@contextlib.contextmanager
def _hooks(*pairs):
    handles = [module.register_forward_hook(hook) for module, hook in pairs]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def final_cap(model, values: np.ndarray, forward: Callable | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Gemma2ForCausalLM's capped final logits at each value, and d/da there; ``forward``: the model or its compile."""
    import torch

    forward = model if forward is None else forward
    p = next(model.parameters())
    tokens = BATCH // VOCAB

    def run(chunk: np.ndarray) -> np.ndarray:
        a = torch.from_numpy(chunk).to(device=p.device, dtype=p.dtype).reshape(1, tokens, VOCAB).requires_grad_(True)
        with _hooks((model.lm_head, lambda m, i, o: a)):
            logits = forward(input_ids=torch.zeros(1, tokens, dtype=torch.long, device=p.device)).logits
        (g,) = torch.autograd.grad(logits, a, torch.ones_like(logits))
        return torch.stack([logits.detach().reshape(-1), g.reshape(-1)], 1).double().cpu().numpy()

    return _pairs(values, run)


def attention_cap(model, values: np.ndarray, attention: Callable | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Gemma 2's capped attention scores at each value, and d/da there; ``attention``: layer 0's attention or its compile."""
    import torch
    from transformers.models.gemma2 import modeling_gemma2

    layer = model.model.layers[0].self_attn
    attention = layer if attention is None else attention
    p = next(model.parameters())
    eye = torch.eye(HEAD_DIM, device=p.device, dtype=p.dtype).unsqueeze(0)  # token j's key and value: e_j
    rotary = (torch.ones_like(eye), torch.zeros_like(eye))  # cos 1, sin 0: the identity rotation
    identity_softmax = types.SimpleNamespace(functional=types.SimpleNamespace(
        softmax=lambda x, dim=-1, dtype=None: x.to(dtype), dropout=torch.nn.functional.dropout))

    def run(chunk: np.ndarray) -> np.ndarray:
        q = torch.from_numpy(chunk).to(device=p.device, dtype=p.dtype).reshape(1, HEAD_DIM, HEADS * HEAD_DIM)
        q.requires_grad_(True)
        hooks = ((layer.q_proj, lambda m, i, o: q), (layer.k_proj, lambda m, i, o: eye),
                 (layer.v_proj, lambda m, i, o: eye), (layer.o_proj, lambda m, i, o: i[0]))
        hidden = torch.zeros(1, HEAD_DIM, HEADS * HEAD_DIM, device=p.device, dtype=p.dtype)
        saved = modeling_gemma2.nn
        modeling_gemma2.nn = identity_softmax
        try:
            with _hooks(*hooks):
                out, _ = attention(hidden, position_embeddings=rotary, attention_mask=None)
        finally:
            modeling_gemma2.nn = saved
        (g,) = torch.autograd.grad(out, q, torch.ones_like(out))
        return torch.stack([out.detach().reshape(-1), g.reshape(-1)], 1).double().cpu().numpy()

    return _pairs(values, run)

