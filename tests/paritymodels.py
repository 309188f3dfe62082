"""parity's tests' tiny Gemma 2 (both caps set) and what an engine that returns only log-probabilities gives."""

import numpy as np

from softcapgrad.engines.forward import reference as ref
from softcapgrad.engines.forward import verdict
from softcapgrad.models import audit

TOKENS = 12


def _config(**fields):
    from transformers import Gemma2Config

    base = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, head_dim=32, query_pre_attn_scalar=32, max_position_embeddings=128,
                final_logit_softcapping=30.0, attn_logit_softcapping=50.0)
    return Gemma2Config(**{**base, **fields})


def _built(**fields):
    src = audit.Source(_config(**fields), None, False)
    model = ref.build(src, 0)
    ids = np.random.default_rng(0).integers(0, 240, TOKENS)
    return model, ids


def _as_fp32_logprobs(z):
    """What an engine that returns only log-probabilities gives: an fp32 log-softmax, -inf where fp32 underflows."""
    lp = verdict.log_probs(z)
    return np.where(lp < verdict.LN_TINY, -np.inf, lp)
