"""Overrides and inputs of the text model types the shrunk defaults do not build or feed (see families/__init__)."""

from __future__ import annotations

from typing import Any, Callable


def _inside(sub: str, fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` set inside the sub-configuration ``sub`` (the same repair for a model and its text model alone)."""
    return {f"{sub}.{k}": v for k, v in fields.items()}


# Qwen4-Exp's default layer kinds include "indexed_attention", whose attention always builds a token indexer (QSA),
# while its class leaves the indexer's sizes unset (None). One key head (the class requires it), a head as wide as
# the attention's rotary part (32), and a budget of 2 blocks of 2 tokens, so the census's 7 tokens select among
# complete blocks. The linear attention's widths are sizes the shrink does not know (16 and 32 heads of 128): 2 and 4
# heads of 32, its key heads still a divisor of its value heads
QWEN4_EXP = {"indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": 32, "indexer_budget": 4,
             "indexer_compress_ratio": 2, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
             "linear_key_head_dim": 32, "linear_value_head_dim": 32}

# its decoder layers build an expert router whatever the config says, while its class leaves the experts None: give
# it experts (6, top 2, width 128)
DIFFUSION_GEMMA = {"num_experts": 6, "top_k_experts": 2, "moe_intermediate_size": 128}

OVERRIDES: dict[str, dict[str, Any]] = {
    # transformers' native mLSTM step sizes its state by the value head dim: q/k heads as wide as v heads
    "xlstm": {"qk_dim_factor": 1.0},
    "diffusion_gemma": _inside("text_config", DIFFUSION_GEMMA),
    "diffusion_gemma_text": DIFFUSION_GEMMA,
    # the class requires num_heads * head_dim == expand * hidden_size (2 * 64) and the mixer repeats n_groups (8)
    # over the heads: 8 heads of 16
    "mamba2": {"num_heads": 8, "head_dim": 16},
    # the class requires mamba_n_heads * mamba_d_head == mamba_expand * hidden_size (2 * 64): 4 heads of 32. Its
    # default has Mamba layers only, yet the forward builds a full-attention mask whose offset it asks the cache for,
    # and a cache of Mamba layers alone refuses: no cache (an inference device, not what the audit measures)
    "bamba": {"mamba_n_heads": 4, "mamba_d_head": 32, "use_cache": False},
    "granitemoehybrid": {"mamba_n_heads": 4, "mamba_d_head": 32, "use_cache": False},
    # its layer kinds come from periods, not lists: attention every 8th layer from layer 4, experts on odd layers, so a
    # cut to 2 layers keeps no attention (and the forward asks the cache for an attention length). Three layers with
    # the attention at layer 2 keep its three kinds: Mamba + dense MLP, Mamba + experts, attention + dense MLP
    "jamba": {"num_hidden_layers": 3, "attn_layer_period": 4, "attn_layer_offset": 2},
    # the shared transformer block is one module tied across the hybrid layers, the first of them the source: a cut
    # that keeps one hybrid layer leaves the tie nothing to match, so keep two. Its sizes derived from the width
    # (attention over [hidden, embeddings]: 2 x hidden; the time-step rank: hidden / 16) derive again from the tiny one
    "zamba": {"num_hidden_layers": 3, "layers_block_type": ["linear_attention", "hybrid", "hybrid"],
              "attention_hidden_size": None, "mamba_dt_rank": "auto"},
    # the class derives these from the width, heads and layer kinds, but they are not fields: the defaults' values
    # come back as keyword arguments and are set after the derivation. The derived values of the tiny configuration
    # (hidden 64, 2 heads, 8 Mamba heads, expand 2, the hybrid layer at index 1 of the cut):
    "zamba2": {"attention_hidden_size": 128, "attention_head_dim": 64, "mamba_headdim": 16, "kv_channels": 32,
               "num_query_groups": 2, "hybrid_layer_ids": [1]},
    # the router's top-k (8) and expert groups (8) reach the shrink under their own names (num_experts_per_token,
    # num_expert_group), not the aliases it shrinks: 2 of the 6 experts, from 2 groups of 3. The linear-attention
    # heads are a width the shrink does not know (32 heads): 2
    "bailing_hybrid": {"num_experts_per_token": 2, "num_expert_group": 2, "linear_num_heads": 2},
    "kimi_linear": {"num_experts_per_token": 2, "linear_num_heads": 2},
    # its class leaves layer_types None and every layer reads its kind (short convolution or attention) from it; the
    # first num_dense_layers (2) layers are dense: four layers, each kind once dense and once with experts
    "lfm2_moe": {"num_hidden_layers": 4, "layer_types": ["conv", "full_attention", "conv", "full_attention"]},
    # its class leaves the expert counts None while every layer past first_k_dense_replace (0) holds routed and
    # shared experts: 6 routed (top 2) and 1 shared
    "dots1": {"n_routed_experts": 6, "num_experts_per_tok": 2, "n_shared_experts": 1},
    # its class rewrites num_hidden_layers to the count of cache slots (layers per stack x H_cycles x (L_cycles + 1))
    # and keeps the layers per stack in num_layers_per_stack: the defaults hand back 16 per stack beside the cut
    # count (2), a cache of 2 slots for 128 attention calls. Unset, the class splits the cut count again: 2 layers
    # per stack, 16 slots
    "hrm_text": {"num_layers_per_stack": None},
    "qwen4_exp_text": QWEN4_EXP,
    "qwen4_exp": _inside("text_config", QWEN4_EXP),
    # its class leaves the vocabulary and the padding id unset (a checkpoint brings its token list), and its
    # positions count the tokens that are not padding: the tiny vocabulary, padding id 1 as in ESM-2's token list
    "esm": {"vocab_size": 256, "pad_token_id": 1},
    # its language-model head refuses an encoder (is_decoder False by default); its axial position embeddings'
    # widths must add up to the hidden size (64), and in training the axial shape's product is the token count:
    # 2 x 4, the census's 8 tokens (the feed pads a shorter sequence)
    "reformer": {"is_decoder": True, "axial_pos_embds_dim": [32, 32], "axial_pos_shape": [2, 4]},
    # each layer's adapter is chosen by language, and the class sets no default language for inputs that name none
    # (a user calls set_default_language, which sets this field): its one language
    "xmod": {"default_language": "en_XX"},
    # the image codes' ids run from image_token_offset for the visual codebook's size and the audio codes' ids follow
    # them, all inside the text vocabulary: a shrunk vocabulary (256) with the default offsets (131272, 262344) and
    # codebook (131072) fails the class's check, and its repair restored the full vocabulary. A codebook of 64 codes
    # for images and one of 64 for audio (its shrunk size) at ids 64 and 128, below the special ids at the top. The
    # two tokenizers (built in fp32 beside the text model, 17 M parameters) are depths and widths the shrink does
    # not know: one residual block per level, 8 audio filters
    "apertus1p5": {"vision_config.codebook_size": 64, "image_token_offset": 64, "audio_token_offset": 128,
                   "vision_config.num_res_blocks": 1, "audio_config.num_filters": 8},
    # ESMFold2 (a structure model: its trunk refines a pair representation of the tokens):
    # - the bundled ESMC refuses grouped-query attention and derives its key heads from its heads when unset; its
    #   special ids (mask 32) lie in its default vocabulary (64), not in the shrunk one (32)
    # - the trunk's single inputs are the atom encoder's output (64) and two residue-type one-hots plus a profile
    #   scalar (2 x 33 + 1): 131 wide; the atom features' width is derived from the element and name-character
    #   one-hots when unset, and the name characters are encoded as ord(c) - 32 (up to 58 for "Z"), so their
    #   vocabulary keeps its default (64)
    # - the trunk's depth, its recycling loops and its pair transition's width are names the shrink does not know
    #   (24 layers, 10 loops, 1024): 2 layers, 1 loop (2 passes), 128
    "esmfold2": {"esmc_config.num_key_value_heads": None, "esmc_config.vocab_size": 64, "single_inputs_size": 131,
                 "char_vocab_size": 64, "atom_feature_dim": None, "folding_trunk_num_hidden_layers": 2,
                 "num_loops": 1, "pair_transition_intermediate_size": 128},
}


def _axial_tokens(cls, config, ids, g) -> dict:
    """Token ids padded (or cut) to the axial position shape's product, the only length Reformer trains on; the
    padding is masked out of the attention and the loss."""
    import math

    import torch

    length = math.prod(config.axial_pos_shape)
    batch, tokens = ids.shape
    kept = ids[:, :length]
    pad = torch.full((batch, max(0, length - tokens)), config.pad_token_id or 0, dtype=ids.dtype)
    mask = torch.cat([torch.ones_like(kept), torch.zeros_like(pad)], dim=1)
    padded = torch.cat([kept, pad], dim=1)
    return {"input_ids": padded, "attention_mask": mask, "labels": padded.masked_fill(mask == 0, -100)}


# the fields of ESMFold2's atom bundle, one argument of its forward
ATOM_FIELDS = ("ref_pos", "ref_charge", "atom_attention_mask", "ref_element", "ref_atom_name_chars", "ref_space_uid",
               "atom_to_token")


def _protein(cls, config, ids, g) -> dict:
    """The features of one protein per row of ``ids`` (a residue per token, id mod 20 of the 20 amino acids), made
    by the library's own featurizer: token indices, chains, residue types, the ESM token ids, a one-sequence MSA,
    and each residue's heavy atoms bundled as the model's atom inputs, padded to the longest row's atoms.

    The bundle's floating tensors stay float32 whatever the model's format: the model casts its atom features to
    its projection's format and builds its rotary angles in float32 itself."""
    import torch
    from transformers.models.esmfold2.modeling_esmfold2 import EsmFold2AtomInputs
    from transformers.models.esmfold2.protein_utils import prepare_protein_features

    rows = [prepare_protein_features("".join("ACDEFGHIKLMNPQRSTVWY"[int(i) % 20] for i in row)) for row in ids]
    atoms = max(r["ref_pos"].shape[1] for r in rows)

    def stacked(key: str) -> "torch.Tensor":
        parts = [r[key] for r in rows]
        if key in ATOM_FIELDS:  # atom rows padded to the longest (the mask marks the padding)
            parts = [torch.cat([p, p.new_zeros(1, atoms - p.shape[1], *p.shape[2:])], dim=1) for p in parts]
        return torch.cat(parts)

    # the distogram's atoms are read by the structure sampler (fold), not by the forward
    fed = {k: stacked(k) for k in rows[0] if k != "distogram_atom_idx"}
    fed["atom_inputs"] = EsmFold2AtomInputs(**{k: fed.pop(k) for k in ATOM_FIELDS})
    return fed


INPUTS: dict[str, Callable] = {
    "reformer": _axial_tokens,
    "esmfold2": _protein,
}
