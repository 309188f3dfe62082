"""The transformers reference: fp32, eager attention, caps applied, and each cap switched off in turn.

A model built tiny (and a model folder with ``parity DIR --bind``) has its weights scaled so that every cap
binds on random token ids (``bind``; a folder otherwise runs as saved): each layer's queries (its query
projection, or the query norm's gain where a norm follows the projection) so that the largest
|a/c| of its attention scores reaches ``TARGET``, then the final logits do: through the output
projection where it is not tied to the input embeddings (nanochat's final norm has no gain), else
the final norm's gain. Each is linear in the scaled weight, so one measurement per site sets the
scale. Gemma norms multiply by (1 + w), others by w (measured on the norm with w = 0): a gain K is
w -> K(1 + w) - 1 or w -> K w.

The attention cap is read and, for the planted failures, replaced inside the model's own modeling
module: its ``eager_attention_forward`` is wrapped for the duration of one forward. Model types
whose attention is not there (xLSTM) or that have no attention cap field have their final cap only.
Which field holds each cap, and how it is switched off, is engines/forward/modeltypes.py's.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from softcapgrad.core.checks import InputError
from softcapgrad.engines.forward import modeltypes as types
from softcapgrad.engines.forward import norms

SUPPORTED = tuple(types.LABELS)  # labels of causal models parity builds (engines/forward/modeltypes.py)
NOT_YET = types.NOT_YET
CAPS = ("attention", "final")
GENERATION = 3  # the builder's: 2 spreads the weights by the width (modeltypes.INIT_RANGE) and opens closed paths;
# 3 draws each norm's gains apart (modeltypes.NORM_SPREAD), so that an engine that exchanges two norms is seen
TARGET = 4.0  # largest |a/c| the inputs are scaled to reach at every cap: tanh(4) = 0.99933, well past the knee
PARAMETER_LIMIT = 50_000_000  # each engine converts and runs the model in 30 s on a CPU core: tiny models only
MAX_TOKENS = 512
VARIANTS = {"capped": (), "attention off": ("attention",), "final off": ("final",), "uncapped": CAPS}

CapFn = Callable  # (scores tensor, c) -> capped scores


WINDOW = types.WINDOW
tiny_sets = types.tiny_sets
caps_of = types.caps_of


def check(config) -> None:
    """Before building: a supported type, at least one cap set, and a size an engine converts in seconds."""
    from softcapgrad.models.tiny import parameters_estimate

    kind = getattr(config, "model_type", "?")
    if kind not in {types.model_type(label) for label in SUPPORTED}:
        raise InputError(f"parity runs {', '.join(SUPPORTED)} (their caps are where the engines look for them); "
                         f"this model is {kind}")
    caps = caps_of(config)
    if all(v is None for v in caps.values()):
        fields = [f"--set {types.field(config, cap)}={types.DEFAULT_CAP[cap]}" for cap in CAPS
                  if types.field(config, cap)]
        raise InputError(f"this {kind} model has no soft-cap set: give {' '.join(fields)}")
    for cap, value in caps.items():
        if value is not None and not (isinstance(value, (int, float)) and 1e-3 <= float(value) <= 1e4):
            raise InputError(f"{types.field(config, cap)} {value!r}: a parity check needs a cap in [0.001, 10000]")
    n = parameters_estimate(config)
    if n > PARAMETER_LIMIT:
        raise InputError(f"this configuration would hold about {n:.3g} parameters; parity converts the model once per "
                         f"engine and runs tiny models only (at most {PARAMETER_LIMIT:.0e}): refused before building")


def build(src, seed: int):
    """The model in fp32 with eager attention, random weights from ``seed`` (or the directory's, kept as they are).
    Random weights have the paths their class's init closes opened, each norm's gains drawn apart and, where no
    attention cap is set, softer queries (modeltypes.OPENED, NORM_SPREAD, SOFT_QUERIES)."""
    import torch

    from softcapgrad.models import audit

    torch.manual_seed(seed)
    with audit.quiet():
        model = audit.build(src, src.config, "eager", torch.float32).eval()
    if not src.weights:
        _open(model)
    return model


def _open(model) -> None:
    import torch

    opened = types.OPENED.get(model.config.model_type, {})
    with torch.no_grad():
        for name, p in model.named_parameters():
            for suffix, value in opened.items():
                if name.endswith(suffix):
                    p.fill_(value)
        for norm, _ in norms.norm_modules(model).values():
            weight = getattr(norm, "weight", None)
            if weight is not None and weight.dim() == 1:
                gains = 1 + types.NORM_SPREAD * (2 * torch.rand(weight.shape, dtype=torch.float64) - 1)
                norms.gain(norm, gains)
    if caps_of(model.config)["attention"] is not None:
        return
    for m in model.modules():
        if hasattr(m, "q_norm") and getattr(m.q_norm, "weight", None) is not None:
            norms.gain(m.q_norm, types.SOFT_QUERIES)
        elif getattr(getattr(m, "q_proj", None), "weight", None) is not None and hasattr(m, "k_proj"):
            with torch.no_grad():
                m.q_proj.weight.mul_(types.SOFT_QUERIES)


def _modeling(model):
    return sys.modules[type(model).__module__]


def _allowed(mask, shape):
    import torch

    if mask is None:
        return torch.ones(shape, dtype=torch.bool)
    mask = mask[..., : shape[-1]]
    return mask if mask.dtype == torch.bool else mask == 0


@functools.lru_cache(maxsize=1)
def first_zero() -> float:
    """The |a/c| from which fp32's tanh rounds to 1.0, so that autograd's gradient 1 − y² through the cap is exactly
    0: atanh(1 − ε₋/2) with fp32's spacing below 1 (laws/saturation.py), about 9.01."""
    from softcapgrad.laws import formats
    from softcapgrad.laws.saturation import knee_exact

    return knee_exact(formats.facts(np.dtype(np.float32)).spacing_below_one)


def _count(seen: dict, cap: str, ratio) -> None:
    """Into ``seen``: how many of ``ratio``'s |a/c| lie at or past fp32's first zero of the gradient, and of how many."""
    seen[f"{cap} past"] = seen.get(f"{cap} past", 0) + int((ratio >= first_zero()).sum())
    seen[f"{cap} entries"] = seen.get(f"{cap} entries", 0) + int(ratio.numel())


def tanh_cap(scores, c: float):
    """The cap as transformers computes it: a / c, tanh, times c."""
    import torch

    return torch.tanh(scores / c) * c


@contextlib.contextmanager
def attention_patch(model, seen: dict | None = None, cap_fn: CapFn | None = None, force: bool = False):
    """For the duration: the largest |a/c| of each layer's scores into ``seen``; ``cap_fn`` replaces the cap;
    ``force`` applies it where the config sets a cap that transformers' code does not pass (dead config).
    A model whose attention is not the module's ``eager_attention_forward`` (xLSTM) runs as it is."""
    import torch

    module = _modeling(model)
    if not hasattr(module, "eager_attention_forward"):
        yield
        return
    original = module.eager_attention_forward
    repeat = getattr(module, "repeat_kv")

    def patched(attn, query, key, value, attention_mask, dropout=0.0, scaling=None, softcap=None, **kwargs):
        c = softcap if softcap is not None else getattr(attn, "attn_logit_softcapping", None)  # set, maybe unused
        if c is None or (seen is None and cap_fn is None):
            return original(attn, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                            softcap=softcap, **kwargs)
        scaling = attn.head_dim ** -0.5 if scaling is None else scaling
        k, v = repeat(key, attn.num_key_value_groups), repeat(value, attn.num_key_value_groups)
        scores = torch.matmul(query, k.transpose(2, 3)) * scaling
        if seen is not None:
            live = scores.detach().abs()[_allowed(attention_mask, scores.shape).expand(scores.shape)]
            seen[attn.layer_idx] = max(seen.get(attn.layer_idx, 0.0), float(live.max()) / c)
            _count(seen, "attention", live / c)
            seen["attention applied"] = seen.get("attention applied", False) or softcap is not None
        if cap_fn is None or (softcap is None and not force):
            return original(attn, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                            softcap=softcap, **kwargs)
        weights = cap_fn(scores, c)
        if attention_mask is not None:
            weights = weights + attention_mask[..., : k.shape[-2]]
        weights = torch.softmax(weights, dim=-1, dtype=torch.float32).to(query.dtype)
        return torch.matmul(weights, v).transpose(1, 2).contiguous(), weights

    module.eager_attention_forward = patched
    try:
        yield
    finally:
        module.eager_attention_forward = original


@contextlib.contextmanager
def caps_off(model, off):
    """The named caps switched off (their field None, or the type's off value, in the config and in each
    attention module)."""
    final = types.field(model.config, "final")
    saved_final = getattr(model.config, final)
    layers = [m for m in model.modules() if hasattr(m, "attn_logit_softcapping")]
    saved_attn = [m.attn_logit_softcapping for m in layers]
    held = getattr(model, "logit_softcap", None)  # a module that read the final cap at init (Inkling 2)
    saved_held = getattr(held, "softcap", None)
    try:
        if "final" in off:
            setattr(model.config, final, types.off_value(model.config, "final"))
            if held is not None:
                held.softcap = types.OFF
        if "attention" in off:
            for m in layers:
                m.attn_logit_softcapping = None
        yield
    finally:
        setattr(model.config, final, saved_final)
        if held is not None:
            held.softcap = saved_held
        for m, value in zip(layers, saved_attn):
            m.attn_logit_softcapping = value


def logits(model, ids: np.ndarray, off=(), cap_fn: CapFn | None = None, final_fn: CapFn | None = None,
           seen: dict | None = None, force: bool = False) -> np.ndarray:
    """The model's logits over the whole vocabulary at each token, float64 [tokens, vocab].

    ``cap_fn`` computes the attention cap instead of transformers' code; ``final_fn`` the final cap
    (applied to the uncapped logits); ``seen`` collects each site's largest |a/c| ("final" for the head).
    """
    import torch

    c = caps_of(model.config)["final"]
    head = model.get_output_embeddings()
    handle = None
    if seen is not None and c is not None:
        def record(m, i, out):
            seen["final"] = max(seen.get("final", 0.0), float(out.detach().abs().max()) / c)
            _count(seen, "final", out.detach().abs() / c)
        handle = head.register_forward_hook(record)
    final_off = set(off) | ({"final"} if final_fn is not None else set())
    try:
        with torch.no_grad(), caps_off(model, final_off), attention_patch(model, seen, cap_fn, force):
            out = model(input_ids=torch.as_tensor(ids).reshape(1, -1), use_cache=False).logits[0]
    finally:
        if handle is not None:
            handle.remove()
    if final_fn is not None and c is not None and "final" not in off:
        out = final_fn(out, c)
    return out.double().numpy()


def _final_site(model):
    """What scales the logits: the output projection where it is not tied to the input embeddings, else the
    final norm's gain (both are linear in the logits)."""
    head = model.get_output_embeddings()
    if head.weight is not model.get_input_embeddings().weight:
        return "output projection", head
    for name in ("norm", "final_norm", "out_norm"):
        norm = getattr(model.base_model, name, None)
        if norm is not None and getattr(norm, "weight", None) is not None:
            return "final norm", norm
    raise InputError(f"{model.config.model_type}: its output projection is tied to the embeddings and no final "
                     "norm with a gain was found: nothing scales its logits alone")


def _scale_final(model, k: float) -> str:
    import torch

    name, site = _final_site(model)
    if name == "final norm":
        norms.gain(site, k)
    else:
        with torch.no_grad():
            site.weight.mul_(k)
            if site.bias is not None:
                site.bias.mul_(k)
    return name


def bind(model, ids: np.ndarray, target: float = TARGET) -> dict[str, float]:
    """Scale the queries layer by layer, then the final norm (or the output projection), so that each cap's
    largest |a/c| is ``target``."""
    import torch

    scales = {}
    caps = caps_of(model.config)
    if caps["attention"] is not None and hasattr(_modeling(model), "eager_attention_forward"):
        for i, layer in enumerate(model.model.layers):
            seen: dict = {}
            logits(model, ids, seen=seen)
            k = target / seen[i] if seen.get(i) else 1.0
            attn = layer.self_attn
            if hasattr(attn, "q_norm"):
                norms.gain(attn.q_norm, k)
            else:
                with torch.no_grad():
                    attn.q_proj.weight.mul_(k)
            scales[f"queries of layer {i}"] = k
    if caps["final"] is not None:
        seen = {}
        logits(model, ids, seen=seen)
        k = target / seen["final"]
        scales[_scale_final(model, k)] = k
    return scales


@dataclass(frozen=True)
class Reference:
    model_type: str
    caps: dict  # cap -> c (None: not set)
    ids: np.ndarray  # [tokens]
    reach: dict  # "attention" / "final" -> largest |a/c| over every site of that cap (applied or not)
    applied: dict  # "attention" / "final" -> whether transformers' own code applies the cap
    logits: dict  # variant (VARIANTS) -> float64 [tokens, vocab]
    scales: dict  # which weights were scaled, by how much
    alternatives: dict  # attention cap computed another way (final cap off) -> float64 [tokens, vocab]
    width: int  # the longest reduction of the model (hidden or MLP width): the n of the γ_n bound
    final_alternatives: dict = None  # final cap put elsewhere in the model (attention cap kept) -> [tokens, vocab]
    past: dict = None  # cap -> {"past": entries at or past fp32's first zero of the gradient, "of": entries seen}


def _in(dtype):
    def cap(scores, c):
        return (scores.to(dtype) / c).tanh().mul(c).to(scores.dtype)
    return cap


def attention_alternatives():
    """Attention-cap forms an engine might compute instead (torch, on the scores tensor)."""
    import torch

    return {"the cap computed in bf16": _in(torch.bfloat16), "the cap computed in fp16": _in(torch.float16),
            "a hard clip to [-c, c]": lambda s, c: s.clamp(-c, c),
            "c·x/sqrt(1+x²) instead of tanh": lambda s, c: s / torch.sqrt(1 + (s / c) ** 2)}


def hidden_capped(model, ids: np.ndarray) -> np.ndarray:
    """The final cap applied to the final hidden state before the output projection, not to the logits."""
    c = caps_of(model.config)["final"]
    handle = model.get_output_embeddings().register_forward_pre_hook(lambda m, args: (tanh_cap(args[0], c),))
    try:
        return logits(model, ids, off=("final",))
    finally:
        handle.remove()


def reference(model, ids: np.ndarray, scales: dict) -> Reference:
    seen: dict = {}
    out = {"capped": logits(model, ids, seen=seen)}
    for name, off in VARIANTS.items():
        if name != "capped":
            out[name] = logits(model, ids, off=off)
    caps = caps_of(model.config)
    layers = [v for k, v in seen.items() if isinstance(k, int)]
    reach = {"attention": max(layers) if layers else None, "final": seen.get("final")}
    alternatives = {} if not seen.get("attention applied") else {
        name: logits(model, ids, off=("final",), cap_fn=fn) for name, fn in attention_alternatives().items()}
    width = max(int(np.max(getattr(model.config, name, 0) or 0)) for name in ("hidden_size", "intermediate_size"))
    applied = {"attention": bool(seen.get("attention applied")), "final": caps["final"] is not None}
    if caps["attention"] is not None and not applied["attention"]:  # what the dead cap would do, were it applied
        out["attention forced"] = logits(model, ids, off=("final",), cap_fn=tanh_cap, force=True)
    final_alternatives = {} if caps["final"] is None else {
        "the cap applied to the final hidden state before the output projection": hidden_capped(model, ids)}
    past = {cap: {"past": seen[f"{cap} past"], "of": seen[f"{cap} entries"]} for cap in CAPS
            if seen.get(f"{cap} entries")}
    return Reference(model.config.model_type, caps, np.asarray(ids).reshape(-1), reach, applied, out, scales,
                     alternatives, width, final_alternatives, past)


def save(model, folder: Path, off=()) -> Path:
    """The model as a transformers directory (config.json, model.safetensors) with the named caps switched off."""
    from softcapgrad.models import audit

    from transformers.utils import logging

    folder.mkdir(parents=True, exist_ok=True)
    bars = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()  # its bar on stderr is not the answer
    with caps_off(model, off), audit.quiet():
        config = model.config
        fields = {cap: types.field(config, cap) for cap in CAPS if types.field(config, cap)}
        saved = {cap: getattr(config, name) for cap, name in fields.items()}
        try:
            for cap in off:
                if cap in fields:
                    setattr(config, fields[cap], types.off_value(config, cap))
            model.save_pretrained(folder)
        finally:
            for cap, value in saved.items():
                setattr(config, fields[cap], value)
            if bars:
                logging.enable_progress_bar()
    return folder
