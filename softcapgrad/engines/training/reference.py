"""The training check's references: one step of parity's tiny model in float64, caps on, each off, none, and
the caps' wrong gradients, beside what a route's step returned.

The model is parity's (engines/forward/reference.py: built in fp32 with eager attention, its caps bound by
scaled weights), copied to float64 for the references. Each reference is one forward with the token
ids as inputs and labels (the model's own loss) and one backward: its loss, returned logits, every
parameter's gradient, and the output projection's output (the final cap's input a) with the
gradient there. transformers' Gemma code casts to fp32 inside its norms and its attention softmax
whatever the weights' type, so these references hold one fp32 rounding per norm and softmax: within
the fp32 bound the verdicts allow (engines/training/verdict.py), far inside a bf16 one.

Besides the four variants (``reference.VARIANTS``), the references hold each cap computed forward as
c·tanh(a/c) with another backward (``FORMS``): straight-through (the upstream gradient unchanged),
detached (no gradient), the gradient of a·tanh(a/c) instead, and the exact backward rounded to bf16
under the fp64 forward; the two caps' values swapped; where the model has local layers, both caps
with the sliding window not applied (engines/forward/alternatives.py: MLX's Gemma 2 attends to every token); and the
deviations outside the caps EasyDeL's Gemma 2 computes (the rotary cos and sin in bf16, the local window one key
wider), each alone and together, with both caps and with the attention cap off. A route's step matching one of
those names what it computes.
"""

from __future__ import annotations

import copy
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from softcapgrad.engines.forward import alternatives, reference as ref

SWAPPED = "the two caps' values swapped"
HIDDEN = "the final cap on the final hidden state before the output projection"
SWAPPED_HIDDEN = SWAPPED + ", the final cap on the final hidden state"
FF_NORMS = ("pre_feedforward_layernorm", "post_feedforward_layernorm")
HIDDEN_EXCHANGED = HIDDEN + ", the pre- and post-feed-forward norms exchanged"
EXCHANGED = SWAPPED_HIDDEN + ", the pre- and post-feed-forward norms exchanged"
WHOLE_FORMS = (SWAPPED, SWAPPED_HIDDEN, EXCHANGED)  # forms that change both caps at once
Z_TANH = "the final cap computed as a·tanh(a/c) for c·tanh(a/c)"  # unsloth-zoo 2026.4.6's RL log-softmax


def z_tanh(a, c):
    """The wrong form of the final cap, forward and (its own) backward: a·tanh(a/c)."""
    import torch

    return a * torch.tanh(a / c)
FORM_NAMES = ("straight-through (the upstream gradient unchanged)", "detached (no gradient through the cap)",
              "the gradient of a·tanh(a/c) instead", "the exact backward rounded to bf16")


@dataclass(frozen=True)
class Step:
    """What one training step computed (float64 copies): the loss, the returned logits [tokens, vocab], each
    parameter's gradient, and where known the final cap's input a and the gradients at a and at the logits."""

    loss: float
    logits: np.ndarray
    grads: dict
    precap: np.ndarray | None = None
    precap_grad: np.ndarray | None = None
    logits_grad: np.ndarray | None = None
    lora: dict | None = None  # a LoRA step: base weight name -> its adapter's A [r, in]; ``grads`` then hold dL/dB
    lora_scale: float | None = None
    token_log_probs: np.ndarray | None = None  # a fused head: each position's log-prob of the next token, no logits
    frozen: frozenset = frozenset()  # parameters the route trains none of (mlx-lm's full fine-tune: embedding, norm)
    attention: np.ndarray | None = None  # [scores, 4]: each attention-cap score's a, dL/da, dL/dz, c, where exposed


def next_token_log_probs(logits: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """log p(x_{t+1}) at each position t but the last, from logits [tokens, vocab] (float64)."""
    z = np.asarray(logits, dtype=np.float64)
    lp = z - z.max(axis=-1, keepdims=True)
    lp = lp - np.log(np.exp(lp).sum(axis=-1, keepdims=True))
    ids = np.asarray(ids).reshape(-1)
    return lp[np.arange(len(ids) - 1), ids[1:]]


def lora_view(step: Step):
    """How a full gradient dL/dW reads in a LoRA step's terms: dL/dB = scale·(dL/dW)·Aᵀ at B = 0, for each adapted
    weight (None: not a LoRA step, gradients compare as they are)."""
    if not step.lora:
        return None
    scale, lora = step.lora_scale, step.lora

    def view(grads: dict) -> dict:
        return {name: scale * grads[name] @ a.T for name, a in lora.items() if name in grads}

    return view


@dataclass(frozen=True)
class TrainReference:
    model_type: str
    caps: dict  # cap -> c (None: not set)
    applied: dict  # cap -> whether transformers' own code applies it (parity's reference says)
    ids: np.ndarray
    steps: dict  # variant (reference.VARIANTS) -> Step
    forms: dict  # cap -> {form name -> Step}: the cap applied forward with that backward, the other cap on
    swapped: Step | None  # both caps applied, each at the other's value (None: not both set)
    width: int
    scales: dict
    model: object = None  # the float64 model (train mode), for ``backprop``
    others: dict = None  # whole-model forms by name (HIDDEN, SWAPPED_HIDDEN, EXCHANGED) -> Step: the final cap elsewhere
    reach: dict = None  # a saved model's (train-parity DIR, weights not scaled): cap -> its largest |a/c| on the ids


def read_step(path: Path) -> Step:
    """A route's .npz (adapter_train_transformers), read without pickle."""
    with np.load(path, allow_pickle=False) as data:
        if isinstance(data, np.ndarray) or not isinstance(data.files, list):
            raise ValueError("not an archive of named arrays")
        values = {k: np.asarray(data[k], dtype=np.float64) for k in data.files}
    if ("logits" not in values and "token_log_probs" not in values) or "loss" not in values:
        raise ValueError("no loss, logits or token log-probs in the step's file")
    grads = {k[len("grad/"):]: v for k, v in values.items() if k.startswith("grad/")}
    lora = {k[len("lora_A/"):]: v for k, v in values.items() if k.startswith("lora_A/")}
    frozen = frozenset(k[len("frozen/"):] for k in values if k.startswith("frozen/"))
    if frozen & set(grads):
        raise ValueError(f"the step's file gives a gradient for a parameter it says is frozen: {sorted(frozen & set(grads))[0]}")
    if lora and (set(lora) != set(grads) or "lora_scale" not in values
                 or any(grads[n].ndim != 2 or a.ndim != 2 or grads[n].shape[1] != a.shape[0] for n, a in lora.items())):
        raise ValueError("a LoRA step's file needs, for each adapted weight, dL/dB [out, r], A [r, in] and the scale")
    attention = values.get("attention_cap")
    if attention is not None and (attention.ndim != 2 or attention.shape[1] != 4):
        raise ValueError(f"attention_cap holds {attention.shape}, not one row of (a, dL/da, dL/dz, c) per score")
    return Step(float(values["loss"]), values.get("logits"), grads, values.get("precap"), values.get("precap_grad"),
                values.get("logits_grad"), lora or None, float(values["lora_scale"]) if lora else None,
                values.get("token_log_probs"), frozen, attention)


def upstream(step: Step, ids: np.ndarray) -> tuple[np.ndarray | None, str]:
    """dL/dz at the returned logits: the route's own where it exposes it, else derived from the model's loss (the
    mean cross-entropy of each position's logits against the next token; the last position enters no loss) at
    the returned logits, where the loss reads another copy of them (autocast hands back an fp32 copy)."""
    if step.logits_grad is not None:
        return step.logits_grad, ""
    z = step.logits
    if z is None or z.ndim != 2 or z.shape[0] != np.asarray(ids).size:
        return None, ""
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    g = np.zeros_like(z)
    n = z.shape[0] - 1
    g[:n] = p[:n]
    g[np.arange(n), np.asarray(ids).reshape(-1)[1:]] -= 1.0
    return g / max(n, 1), "dL/dz derived from the returned logits and the mean cross-entropy (the route's own " \
                          "is not exposed: its loss reads another copy of the logits)"


def readable(path: Path) -> str | None:
    """Why the step's file cannot be read (None: it can)."""
    try:
        read_step(path)
    except (OSError, ValueError, zipfile.BadZipFile) as err:
        return f"the step's file {path.name} cannot be read: {err}"
    return None


def _form(backward):
    """c·tanh(a/c) forward, ``backward(g, a, c)`` as its gradient."""
    import torch

    class Cap(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, c):
            ctx.save_for_backward(a)
            ctx.c = c
            return torch.tanh(a / c) * c

        @staticmethod
        def backward(ctx, g):
            (a,) = ctx.saved_tensors
            return backward(g, a, ctx.c), None

    return lambda a, c: Cap.apply(a, c)


def forms() -> dict:
    """Each wrong gradient by name: the cap function (scores, c) -> capped, with that backward."""
    import torch

    def low(g, a, c):
        t = torch.tanh(a / c).to(torch.bfloat16)
        return (g.to(torch.bfloat16) * (1 - t * t)).to(g.dtype)

    backwards = (lambda g, a, c: g, lambda g, a, c: torch.zeros_like(g),
                 lambda g, a, c: g * (torch.tanh(a / c) + (a / c) / torch.cosh(a / c) ** 2), low)
    return {name: _form(b) for name, b in zip(FORM_NAMES, backwards)}


def step(model, ids: np.ndarray, off=(), attention_fn=None, final_fn=None, hidden: bool = False) -> Step:
    """One forward and backward of ``model`` (float64, training mode) with its own loss; ``attention_fn`` and
    ``final_fn`` compute the caps instead of transformers' code (the final one on the output projection's output);
    ``hidden``: the final cap on the output projection's input instead (the final hidden state)."""
    import torch

    c = ref.caps_of(model.config)["final"]
    head = model.get_output_embeddings()
    kept = {}
    if hidden:
        off = set(off) | {"final"}
        pre = head.register_forward_pre_hook(lambda m, args: (ref.tanh_cap(args[0], c),))
        try:
            return step(model, ids, off, attention_fn)
        finally:
            pre.remove()

    def on_head(module, args, out):
        out.retain_grad()
        kept["precap"] = out
        return out if final_fn is None else final_fn(out, c)

    model.zero_grad(set_to_none=True)
    handle = head.register_forward_hook(on_head)
    off = set(off) | ({"final"} if final_fn is not None else set())
    try:
        with ref.caps_off(model, off), ref.attention_patch(model, cap_fn=attention_fn):
            x = torch.as_tensor(ids, dtype=torch.long).reshape(1, -1)
            out = model(input_ids=x, labels=x, use_cache=False)
            out.logits.retain_grad()
            out.loss.backward()
    finally:
        handle.remove()
    grads = {n: p.grad.detach().double().numpy().copy() for n, p in model.named_parameters() if p.grad is not None}
    a = kept.get("precap")
    return Step(float(out.loss.detach()), out.logits.detach()[0].double().numpy(), grads,
                None if a is None else a.detach()[0].double().numpy(),
                None if a is None or a.grad is None else a.grad[0].double().numpy(),
                None if out.logits.grad is None else out.logits.grad[0].double().numpy())


def _swapped(model, ids, hidden: bool = False) -> Step | None:
    attention = [m for m in model.modules() if getattr(m, "attn_logit_softcapping", None) is not None]
    final = ref.types.field(model.config, "final")
    c_final = getattr(model.config, final) if final else None
    if not attention or c_final is None:
        return None
    c_attention = attention[0].attn_logit_softcapping
    try:
        for m in attention:
            m.attn_logit_softcapping = c_final
        setattr(model.config, final, c_attention)
        return step(model, ids, hidden=hidden)
    finally:
        for m in attention:
            m.attn_logit_softcapping = c_attention
        setattr(model.config, final, c_final)


def _exchanged(model, ids, swap: bool) -> Step | None:
    """torchtune's Gemma 2 as it computes: the final cap on the hidden state (and, ``swap``, both caps swapped, as
    its named builders pass them), and each layer's pre- and post-feed-forward norms exchanged (each holds the
    other's gain). The gradients are named as the weights' source: the gain that came from
    ``pre_feedforward_layernorm`` is applied after the MLP, so its gradient is that position's."""
    import torch

    layers = [m for m in model.modules() if all(hasattr(m, n) for n in FF_NORMS)]
    if not layers:
        return None
    pairs = [tuple(getattr(m, n).weight for n in FF_NORMS) for m in layers]

    def exchange():
        with torch.no_grad():
            for a, b in pairs:
                saved = a.detach().clone()
                a.copy_(b)
                b.copy_(saved)

    exchange()
    try:
        done = _swapped(model, ids, hidden=True) if swap else step(model, ids, hidden=True)
    finally:
        exchange()
    if done is None:
        return None
    rename = {}
    for name in done.grads:
        for mine, other in (FF_NORMS, FF_NORMS[::-1]):
            if f".{mine}." in f".{name}":
                rename[name] = name.replace(mine, other)
    grads = {rename.get(n, n): g for n, g in done.grads.items()}
    return Step(done.loss, done.logits, grads, done.precap, done.precap_grad, done.logits_grad)


_ROTARY = {alternatives.ROTARY_BF16: None, alternatives.FULL_ROTARY_BF16: alternatives.FULL}  # form -> layer types
OUTSIDE = (alternatives.WIDER, *_ROTARY, *(f"{alternatives.WIDER}, {r}" for r in _ROTARY))
ROUNDED = frozenset(n for n in OUTSIDE if n.endswith(tuple(_ROTARY)))  # the forms that round part of the model to bf16
OFF = ", the attention cap off"


def _outside(wide, ids, caps: dict) -> dict:
    """The model with deviations outside the caps that a library was found to compute (EasyDeL: Gemma 2's rotary
    table in bf16, Gemma 3's for its full-attention layers, the local window one key wider), each alone and with
    the window, with both caps and with the attention cap off; only those the model has (a rotary embedding, one
    that takes a layer type, a local window)."""
    import contextlib

    out = {}
    for name in OUTSIDE:
        rotary = next((r for r in _ROTARY if name.endswith(r)), None)
        with contextlib.ExitStack() as stack:
            had = [stack.enter_context(alternatives.window_widened(wide)) if alternatives.WIDER in name else True,
                   stack.enter_context(alternatives.rotary_rounded(wide, _ROTARY[rotary])) if rotary else True]
            if not all(had):
                continue
            out[name] = step(wide, ids)
            if caps["attention"] is not None:
                out[name + OFF] = step(wide, ids, ("attention",))
    return out


def train_reference(model, ids: np.ndarray, scales: dict, applied: dict) -> TrainReference:
    """The float64 references of parity's bound model (``model`` is left as it is)."""
    wide = copy.deepcopy(model).double().train()
    caps = ref.caps_of(wide.config)
    steps = {name: step(wide, ids, off) for name, off in ref.VARIANTS.items()}
    named = forms()
    by_cap = {}
    if caps["attention"] is not None and applied["attention"]:
        by_cap["attention"] = {n: step(wide, ids, attention_fn=f) for n, f in named.items()}
    if caps["final"] is not None:
        by_cap["final"] = {n: step(wide, ids, final_fn=f) for n, f in named.items()}
    width = max(int(np.max(getattr(wide.config, n, 0) or 0)) for n in ("hidden_size", "intermediate_size"))
    others = {}
    with alternatives.window_dropped(wide) as has_window:  # a library whose local layers attend to every token
        if has_window:
            others[alternatives.WINDOWLESS] = step(wide, ids)
    others.update(_outside(wide, ids, caps))
    if caps["final"] is not None:  # a library that caps the normed hidden state (torchtune's Gemma2FinalNorm)
        others[HIDDEN] = step(wide, ids, hidden=True)
        others[Z_TANH] = step(wide, ids, final_fn=z_tanh)
        if (exchanged := _exchanged(wide, ids, swap=False)) is not None:
            others[HIDDEN_EXCHANGED] = exchanged
        if applied["attention"] and (both := _swapped(wide, ids, hidden=True)) is not None:
            others[SWAPPED_HIDDEN] = both
            if (exchanged := _exchanged(wide, ids, swap=True)) is not None:
                others[EXCHANGED] = exchanged
    return TrainReference(wide.config.model_type, caps, applied, np.asarray(ids).reshape(-1), steps, by_cap,
                          _swapped(wide, ids) if applied["attention"] else None, width, scales, wide, others)


def backprop(reference: TrainReference, precap_grad: np.ndarray, attention_fn=None) -> dict:
    """Every parameter's gradient when the route's own dL/da (at the final cap's input) is carried back through
    the float64 model with the attention cap as ``attention_fn`` computes it (None: transformers' code): the
    model's gradients with the final cap's backward taken from the route, so that the rest is judged alone."""
    import torch

    model = reference.model
    kept = {}

    def on_head(module, args, out):
        kept["a"] = out

    model.zero_grad(set_to_none=True)
    handle = model.get_output_embeddings().register_forward_hook(on_head)
    try:
        with ref.caps_off(model, ("final",)), ref.attention_patch(model, cap_fn=attention_fn):
            model(input_ids=torch.as_tensor(reference.ids, dtype=torch.long).reshape(1, -1), use_cache=False)
            kept["a"].backward(torch.as_tensor(precap_grad, dtype=torch.float64).reshape(kept["a"].shape))
    finally:
        handle.remove()
    return {n: p.grad.detach().double().numpy().copy() for n, p in model.named_parameters() if p.grad is not None}


def save_folder(model, folder: Path) -> Path:
    """A route's model folder: the weights and config, and the stand-in tokenizer every folder of a run carries. A
    route that builds its tokenizer from the folder (axolotl, trl, unsloth) otherwise gets transformers' default
    for the model type, whose padding side may differ from the capped folder's."""
    from softcapgrad.engines.forward.vocabulary import write_tokenizer

    saved = ref.save(model, folder)
    write_tokenizer(saved, model.config.to_dict())
    return saved


def prepare(src, seq_len: int, seed: int, work: Path):
    """Parity's bound model (fp32) and its references; the folder ``capped`` and ids.npy under ``work`` for the
    routes."""
    from softcapgrad.engines.forward import runner
    from softcapgrad.models import audit

    ref.check(src.config)
    model = ref.build(src, seed)
    ids = audit.random_ids(src.config, 1, seq_len, seed).numpy().reshape(-1)
    scales = ref.bind(model, ids)
    seen: dict = {}
    ref.logits(model, ids, seen=seen)
    applied = {"attention": bool(seen.get("attention applied")), "final": ref.caps_of(model.config)["final"] is not None}
    runner.write_ids(work, ids)
    save_folder(model, work / "capped")
    return train_reference(model, ids, scales, applied), model
