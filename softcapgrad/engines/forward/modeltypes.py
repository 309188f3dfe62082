"""The capped causal model types parity builds: each one's cap fields, its tiny configuration, its off value.

A label names a model type and which of its caps are set: ``gemma3_text`` is Gemma 3 with the final
cap only, ``gemma3_text+attention`` with the attention cap set as well (which transformers' Gemma 3
code never passes to its attention). The fields that hold the caps differ by type
(``logits_soft_cap`` in RecurrentGemma, ``output_logit_soft_cap`` in xLSTM); a type's own default
cap is kept where it has one, 30 (final) and 50 (attention) where it ships none.

A cap is switched off by writing None where the config class accepts it. Where its validation
refuses None (Gemma 3n, RecurrentGemma, xLSTM declare a float) the off value is ``OFF`` = 2**64:
a power of two, so ``x / c`` and ``· c`` are exact, and |x / c| < 2**-24 for every |x| < 2**40, where
fp32's and bf16's tanh return their input: ``c · tanh(x / c)`` is then ``x`` bit for bit
(tests/test_parity_types.py measures it on the model's own logits).
"""

from __future__ import annotations

import copy

FIELDS = {"final": ("final_logit_softcapping", "logits_soft_cap", "output_logit_soft_cap"),
          "attention": ("attn_logit_softcapping",)}
DEFAULT_CAP = {"final": 30, "attention": 50}
WINDOWS = ("sliding_window", "attention_window_size", "sliding_window_size")  # the local layers' window, by type
OFF = 2.0 ** 64
WINDOW = 8  # the tiny configs' sliding window: shorter than the default 16 tokens, so the local layers' window binds

LABELS = {  # label -> (model type, caps set); where the attention cap is applied is the modeling code's own
    "gemma2": ("gemma2", ("final", "attention")),
    "gemma2+qpas": ("gemma2", ("final", "attention")),
    "gemma3_text": ("gemma3_text", ("final",)),
    "gemma3_text+attention": ("gemma3_text", ("final", "attention")),
    "vaultgemma": ("vaultgemma", ("final", "attention")),
    "gemma3n_text": ("gemma3n_text", ("final",)),
    "gemma4_text": ("gemma4_text", ("final",)),
    "gemma4_unified_text": ("gemma4_unified_text", ("final",)),
    "recurrent_gemma": ("recurrent_gemma", ("final",)),
    "nanochat": ("nanochat", ("final",)),
    "beam": ("beam", ("final",)),
    "xlstm": ("xlstm", ("final",)),
    "inkling2_text": ("inkling2_text", ("final",)),
    "inkling2_loop_text": ("inkling2_loop_text", ("final",)),
}
NOTES = {  # label -> what its rows leave out, a sentence of the results
    "gemma2+qpas": "Its query_pre_attn_scalar is twice its head_dim: an engine that scales the scores by "
                   "head_dim**-0.5 instead computes other attention",
    "xlstm": "Its gate cap (gate_soft_cap, inside the mLSTM gates) stays on in every variant: only the final cap "
             "is judged",
    "inkling2_text": "Its MLP caps (mlp_gate_softcap, mlp_up_softcap) stay on in every variant: only the final cap "
                     "is judged",
    "inkling2_loop_text": "Its MLP caps (mlp_gate_softcap, mlp_up_softcap) stay on in every variant: only the final "
                          "cap is judged",
    "recurrent_gemma": "It has no attention cap; its local attention window is attention_window_size",
}
NOT_YET = (  # capped types the census finds that parity does not build, with what stopped each (measured)
    ("t5gemma", "an encoder-decoder: T5GemmaForConditionalGeneration fed the token ids alone refuses (\"You must "
                "specify exactly one of input_ids or inputs_embeds\", its decoder's), and AutoModelForCausalLM, "
                "the engines' causal loader here, has no t5gemma entry"),
    ("paligemma", "image and text in: PaliGemmaForConditionalGeneration runs on token ids alone, but "
                  "AutoModelForCausalLM, the engines' causal loader here, has no paligemma entry; its language "
                  "model is Gemma 2 (text_config), whose caps parity checks as gemma2"),
    ("laguna", "its only cap is the MoE router's (moe_router_logit_softcapping, 0 = off as shipped): neither "
               "an attention nor a final cap"),
    ("mistral_large4_text", "MistralLarge4TextModel has no language-model head: the final cap is applied by "
                            "MistralLarge4ForConditionalGeneration (image and text), for which AutoModelForCausalLM "
                            "has no entry"),
    ("muse_spark_text", "MuseSparkTextModel has no language-model head: the final cap is applied by "
                        "MuseSparkForConditionalGeneration (image and text), for which AutoModelForCausalLM has no "
                        "entry"),
    ("muse_glimmer_text", "MuseGlimmerTextModel has no language-model head: the final cap is applied by "
                          "MuseGlimmerForConditionalGeneration (image and text), for which AutoModelForCausalLM has "
                          "no entry"),
    ("diffusion_gemma", "a block-diffusion model (DiffusionGemmaForBlockDiffusion), not causal: "
                        "AutoModelForCausalLM has no entry for it"),
)


def model_type(label: str) -> str:
    return LABELS[label][0]


def _fields(config) -> set:
    return set(config.to_dict())


def field(config, cap: str) -> str | None:
    """The config field that holds ``cap`` in this model type, or None where it has none."""
    present = _fields(config)
    return next((f for f in FIELDS[cap] if f in present), None)


def caps_of(config) -> dict[str, float | None]:
    out = {}
    for cap in FIELDS:
        name = field(config, cap)
        value = None if name is None else getattr(config, name, None)
        out[cap] = None if value == OFF else value
    return out


NUMERIC_OFF = ("inkling2_text", "inkling2_loop_text")  # its model reads the final cap once, into a module that divides by it: not None


def off_value(config, cap: str):
    """What switches ``cap`` off in this config: None where its class accepts None (and its model then skips
    the cap), else ``OFF``."""
    name = field(config, cap)
    if config.model_type in NUMERIC_OFF:
        return OFF
    probe = copy.copy(config)
    try:
        setattr(probe, name, None)
    except Exception:  # noqa: BLE001 -- the class's validation refuses None (a strict float field)
        return OFF
    return None


QPAS = {"gemma2+qpas": 64}  # label -> query_pre_attn_scalar where it is not the head size (32)
# The weights' spread: the width's inverse square root (64 ** -0.5), not the classes' 0.02, under which a tiny model's
# sublayers return outputs whose mean square is a few times the norms' epsilon (forward/conditioning.py measures it)
INIT_RANGE = 0.125
OPENED = {  # model type -> parameter name suffix -> the value set after building: paths the class's init closes
    "gemma3n_text": {"altup.correct_output_scale": 1.0},  # 0: the per-layer input path's norm sees exact zeros
    "xlstm": {"igate_preact.bias": 2.0},  # -10: the input gate passes e^-10, its multi-head norm sees 6e-7 ε; 0: 25 ε
}
NORM_SPREAD = 0.5  # each norm's gains drawn from 1 ± 0.5, channel by channel: with one gain for all (the classes'
# init) an engine that exchanges two norms of a layer computes the same model (conditioning.py's norm exchange).
# Measured at seed 0: ± 0.25 left Gemma 2 with query_pre_attn_scalar 64 at fp32 noise 0.52 of its tolerance (over
# conditioning.NOISE_MAX); ± 0.5 keeps every type's noise at most 0.42 and every exchange at least 900 tolerances
SOFT_QUERIES = 0.5  # queries' gain where no attention cap is bound: with q/k-normed scores at full gain the softmax is
# sharp enough that fp32 rounding reaches the whole-model tolerance (Gemma 4; conditioning.py's fp64 comparison)


def tiny_sets(label: str) -> list[str]:
    """The --set fields of the tiny model parity builds for ``label``: its caps, a short sliding window, the
    query scale the engines derive from the head size (another where the label says), and the weights' spread."""
    from transformers import CONFIG_MAPPING

    from softcapgrad.models.tiny import HEAD_DIM

    kind, caps = LABELS[label]
    defaults = CONFIG_MAPPING[kind]()
    present = _fields(defaults)
    fields = {"query_pre_attn_scalar": QPAS.get(label, HEAD_DIM), "initializer_range": INIT_RANGE,
              **{w: WINDOW for w in WINDOWS}}
    for cap in caps:
        name = field(defaults, cap)
        fields[name] = getattr(defaults, name) or DEFAULT_CAP[cap]
    return [f"{k}={v}" for k, v in fields.items() if k in present]
