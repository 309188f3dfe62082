"""The models an engine may have computed instead of the reference, each a named form the verdict can match.

A form is the reference model with one known deviation planted (engines/forward/verdict.py compares an engine's
log-probabilities with each): the local layers' sliding window dropped (with and without the attention cap), the
scores scaled by the head size where query_pre_attn_scalar is not it, the two caps' values swapped, and every layer
local where the config mixes local and full layers.
"""

from __future__ import annotations

import contextlib

from softcapgrad.engines.forward import reference as ref
from softcapgrad.engines.forward import verdict


WINDOWS = ("sliding_window", "attention_window_size")  # the config fields (and module attributes) of a local window


WINDOWLESS = "the sliding window not applied"


@contextlib.contextmanager
def _windows_set(model, width):
    """Every local window (on the config and on each module that keeps its own copy) set to ``width(w)``, then
    restored; yields whether the model has one."""
    saved = [(h, f, getattr(h, f)) for h in (model.config, *model.modules()) for f in WINDOWS
             if isinstance(getattr(h, f, None), int) and getattr(h, f) > 0]
    try:
        for h, f, v in saved:
            setattr(h, f, width(v))
        yield bool(saved)
    finally:
        for h, f, v in saved:
            setattr(h, f, v)


def window_dropped(model):
    """The local layers' sliding window set far beyond the inputs, then restored; yields whether the model has one."""
    return _windows_set(model, lambda w: 10 * ref.MAX_TOKENS)


WIDER = "the sliding window one key wider"
ROTARY_BF16 = "the rotary cos and sin rounded to bf16"
FULL_ROTARY_BF16 = "the full-attention layers' rotary cos and sin rounded to bf16"
FULL = ("full_attention",)  # the layer type whose rotary table FULL_ROTARY_BF16 rounds


def window_widened(model, by: int = 1):
    """The local layers' sliding window ``by`` keys wider (a window of w read as w keys before the query, so w + 1
    in all, where transformers' Gemma keeps w), then restored; yields whether the model has one."""
    return _windows_set(model, lambda w: w + by)


@contextlib.contextmanager
def rotary_rounded(model, only: tuple[str, ...] | None = None):
    """Every rotary embedding module's (cos, sin) rounded to bf16 and back to their own type (an engine that keeps
    its rotary table in bf16 whatever the model's precision), then restored; ``only``: just the calls for those
    layer types, where the module takes one (Gemma 3's one module serves its local and its full layers). Yields
    whether the model has such a module."""
    import inspect

    import torch

    def rounded(module, args, kwargs, out):
        kind = kwargs.get("layer_type", args[2] if len(args) > 2 else None)
        if only is not None and kind not in only:
            return None
        return tuple(t.to(torch.bfloat16).to(t.dtype) for t in out)

    found = [m for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding")
             and (only is None or "layer_type" in inspect.signature(m.forward).parameters)]
    handles = [m.register_forward_hook(rounded, with_kwargs=True) for m in found]
    try:
        yield bool(handles)
    finally:
        for h in handles:
            h.remove()


def window_alternatives(model, ids) -> dict:
    """What an engine that drops the local layers' sliding window computes, with and without the attention cap
    (final cap off, as the attention check compares; and with it, for engines judged on their capped run)."""
    with window_dropped(model) as has_window:
        if not has_window:
            return {}
        forms = {WINDOWLESS: ref.logits(model, ids, off=("final",)),
                 "the sliding window and the attention cap both dropped": ref.logits(model, ids, off=ref.CAPS)}
        if model.config.final_logit_softcapping is not None:  # the same with the final cap on (verdict.CAPPED)
            forms[verdict.CAPPED + WINDOWLESS] = ref.logits(model, ids)
            forms[verdict.CAPPED + "the sliding window and the attention cap both dropped"] = ref.logits(
                model, ids, off=("attention",))
        return forms


SCALED = "the scores scaled by head_dim**-0.5, not query_pre_attn_scalar**-0.5"
SCALED_WINDOWLESS = "the sliding window and the attention cap both dropped, " + SCALED


def scaling_alternatives(model, ids) -> dict:
    """Where query_pre_attn_scalar is not the head size: what an engine that scales the scores by the head size
    computes (final cap off; and on, ``verdict.CAPPED``), and that with the window and the attention cap dropped
    too (queries scaled, so the scores are without any cap). Keras Hub reads the field only as whether it equals
    head_dim, and otherwise scales by hidden_size // num_attention_heads."""
    import torch

    config = model.config
    qpas, head = getattr(config, "query_pre_attn_scalar", None), getattr(config, "head_dim", None)
    if not qpas or not head or qpas == head:
        return {}
    ratio = (qpas / head) ** 0.5  # the module's scores are already times qpas**-0.5

    def rescaled(scores, c):
        return ref.tanh_cap(scores * ratio, c)

    forms = {SCALED: ref.logits(model, ids, off=("final",), cap_fn=rescaled)}
    if ref.caps_of(config)["final"] is not None:
        forms[verdict.CAPPED + SCALED] = ref.logits(model, ids, cap_fn=rescaled)
    queries = [m.q_proj.weight for m in model.modules() if hasattr(m, "q_proj") and hasattr(m, "o_proj")]
    saved = [w.detach().clone() for w in queries]
    try:  # CTranslate2's Gemma 2 reads none of the window, the caps and the field: its scores scale by head_dim
        with torch.no_grad():
            for w in queries:
                w.mul_(ratio)
        with window_dropped(model) as has_window:
            if has_window:
                forms[SCALED_WINDOWLESS] = ref.logits(model, ids, off=ref.CAPS)
    finally:
        with torch.no_grad():
            for w, kept in zip(queries, saved):
                w.copy_(kept)
    return forms


def swapped_alternatives(model, ids) -> dict:
    """The model with the two caps' values exchanged (the attention cap at the final cap's value and the reverse),
    as a library that maps the fields the other way round computes it, with the final cap on the logits and on the
    final hidden state before the output projection (names start with ``verdict.SWAPPED``)."""
    attention = [m for m in model.modules() if getattr(m, "attn_logit_softcapping", None) is not None]
    c_final = model.config.final_logit_softcapping
    if not attention or c_final is None:
        return {}
    c_attention = attention[0].attn_logit_softcapping
    try:
        for m in attention:
            m.attn_logit_softcapping = c_final
        model.config.final_logit_softcapping = c_attention
        return {verdict.SWAPPED: ref.logits(model, ids),
                verdict.SWAPPED + ", the final cap on the final hidden state": ref.hidden_capped(model, ids)}
    finally:
        for m in attention:
            m.attn_logit_softcapping = c_attention
        model.config.final_logit_softcapping = c_final


ALL_LOCAL = "every layer local (the sliding window on the full-attention layers too)"
LOCAL, FULL = "sliding_attention", "full_attention"


def all_local_alternatives(model, ids) -> dict:
    """Where ``layer_types`` mixes local and full layers: the whole model, both caps on, with every layer local,
    as an engine computes it that takes the layer pattern from another field (mistral.rs's Gemma 3 text config
    reads ``sliding_window_pattern``, default 6, and no ``layer_types``: a model of fewer layers is all local)."""
    import copy

    types = list(getattr(model.config, "layer_types", None) or ())
    if set(types) != {LOCAL, FULL}:  # attention layers of both kinds, nothing else (RecurrentGemma's are derived)
        return {}
    config = copy.deepcopy(model.config)
    try:
        config.layer_types = [LOCAL] * len(types)
    except AttributeError:  # a config that computes its layer types from other fields
        return {}
    twin = type(model)(config).to(next(model.parameters()).dtype).eval()
    twin.load_state_dict(model.state_dict())
    forms = {ALL_LOCAL: ref.logits(twin, ids)}
    if ref.caps_of(config)["attention"] is not None:  # as an engine computes it that also applies the attention cap
        forms[ALL_LOCAL + ", the attention cap forced on"] = ref.logits(twin, ids, cap_fn=ref.tanh_cap, force=True)
    return forms


@contextlib.contextmanager
def exact_gelu(model):
    """Every tanh-approximated GELU module (transformers' ``gelu_pytorch_tanh``) replaced by the exact erf form,
    then restored; yields how many were replaced."""
    import torch
    from transformers.activations import GELUTanh

    swapped = [(parent, name, child) for parent in model.modules() for name, child in parent._modules.items()
               if isinstance(child, GELUTanh)]
    try:
        for parent, name, _ in swapped:
            parent._modules[name] = torch.nn.GELU()
        yield len(swapped)
    finally:
        for parent, name, child in swapped:
            parent._modules[name] = child


def gelu_alternatives(model, ids) -> dict:
    """A model whose MLP computes GELU's tanh approximation, as an engine computes it that runs the exact erf form
    (ExecuTorch's XNNPACK lowering drops ``approximate``): with the attention cap and without it (final cap off;
    on, ``verdict.CAPPED``), and the whole model with both caps for engines judged on their capped run."""
    with exact_gelu(model) as swapped:
        if not swapped:
            return {}
        forms = {verdict.EXACT_GELU: ref.logits(model, ids, off=("final",)),
                 verdict.EXACT_GELU_DROPPED: ref.logits(model, ids, off=ref.CAPS)}
        if ref.caps_of(model.config)["final"] is not None:
            forms[verdict.CAPPED + verdict.EXACT_GELU] = ref.logits(model, ids)
            forms[verdict.CAPPED + verdict.EXACT_GELU_DROPPED] = ref.logits(model, ids, off=("attention",))
        with window_dropped(model) as has_window:  # ExecuTorch's custom sdpa drops the window as well
            if has_window:
                forms[verdict.EXACT_GELU_WINDOWLESS] = ref.logits(model, ids, off=ref.CAPS)
        return forms


def gelu_whole(model, ids) -> dict:
    """The whole model with both caps and the exact GELU: a form for engines judged on their capped run alone."""
    with exact_gelu(model) as swapped:
        return {verdict.EXACT_GELU: ref.logits(model, ids)} if swapped else {}
