"""A model of any type, built and fed: the class that holds its caps, and inputs of the kind it reads.

The class is the language-model head where transformers has one (causal, then sequence-to-sequence,
then image-text-to-text), else the model itself (a vision or audio encoder, an embedding model):
the module that holds the caps. Its inputs follow its ``main_input_name``: token ids, or random
features, images or videos of the sizes its configuration names. The output compared and
differentiated is the logits where there are logits, else the last hidden state.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from softcapgrad.core.checks import InputError

HEADS = ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
         "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES", "MODEL_MAPPING_NAMES")
FRAMES = 16  # audio frames and video frames of a random input: small, past any convolution's kernel
SAMPLES = 19200  # samples of a random waveform: 1.2 s at 16 kHz, 60 frames of a speech encoder's stride 320,
# 10 of an audio tokenizer's 1920
QUESTIONS = {  # a decision head's questions (JEV): one question, its mark after the last token, two options
    "marks": lambda ids: ids.new_full((1, 1), ids.shape[1]),
    "num_options": lambda ids: ids.new_full((1, 1), 2),
    "question_type_ids": lambda ids: ids.new_zeros((1, 1)),
}


def _patches(config, required: set, grid: str, name: str, batch: int, g) -> dict:
    """Flattened image patches and their grid (temporal, height, width) per image, for encoders that take both:
    a 2·merge × 2·merge grid of one frame each, every patch ``channels × temporal × patch²`` values."""
    import torch

    merge = _first(config, "spatial_merge_size", "merge_size", default=2)
    patch = _first(config, "patch_size", default=14)
    temporal = _first(config, "temporal_patch_size", default=2)
    channels = _first(config, "in_channels", "num_channels", "in_chans", default=3)
    side = 2 * merge
    thw = torch.tensor([[1, side, side]] * batch)
    main = "hidden_states" if "hidden_states" in required else name
    return {main: torch.randn(batch * side * side, channels * temporal * patch * patch, generator=g), grid: thw}


def model_class(config):
    """The transformers class to audit ``config`` with (see the module docstring)."""
    import transformers
    from transformers.models.auto import modeling_auto

    for mapping in HEADS:
        name = getattr(modeling_auto, mapping).get(config.model_type)
        if isinstance(name, (list, tuple)):
            name = name[0]
        if name and hasattr(transformers, name):
            cls = getattr(transformers, name)
            wants = getattr(cls, "config_class", None)
            if isinstance(wants, type) and not isinstance(config, wants):
                continue  # a head of the text model alone (it reads a text configuration): the next kind of class
            return cls
    found = _declared(type(config))
    if found is not None:
        return found
    raise InputError(f"model type {config.model_type!r} has no model class in transformers (a configuration only)")


def _declared(config_class):
    """A model class of the library whose ``config_class`` is exactly this one (a sub-model: a vision or audio tower)."""
    import importlib

    module = config_class.__module__.replace(".configuration_", ".modeling_")
    try:
        modeling = importlib.import_module(module)
    except ImportError:
        return None
    found = [c for _, c in sorted(vars(modeling).items()) if isinstance(c, type)
             and getattr(c, "config_class", None) is config_class and hasattr(c, "_from_config")
             and "PreTrained" not in c.__name__]
    return min(found, key=lambda c: (not c.__name__.endswith("Model"), len(c.__name__), c.__name__), default=None)


def headless(cls) -> bool:
    """``cls`` is a bare model or encoder: no language-model head of its own."""
    from transformers.models.auto import modeling_auto

    heads = set()
    for mapping in HEADS[:-1]:
        heads |= {v for v in getattr(modeling_auto, mapping).values() if isinstance(v, str)}
    return cls.__name__ not in heads


KNOWN = ("input_ids", "pixel_values", "pixel_values_videos", "input_features", "input_values", "audio_mel")


def entry(cls):
    """The method a forward of ``cls`` runs: ``forward``, or ``encode`` for a tokenizer that has no forward of its own
    (an image tokenizer: its encoder, quantizer and codes are what a model that uses it runs)."""
    import torch

    if cls.forward is torch.nn.Module.forward and callable(getattr(cls, "encode", None)):
        return cls.encode
    return cls.forward


def call(model, kwargs: dict):
    """One forward of ``model`` (its ``encode`` where it has no forward: see ``entry``)."""
    return model.encode(**kwargs) if entry(type(model)) is not type(model).forward else model(**kwargs)


def needs(cls) -> str:
    """The input ``cls`` reads: its ``main_input_name``; where that is a name its forward does not take (a vision
    tower that keeps the library's default ``input_ids``), its forward's first required input of a kind fed here."""
    name = getattr(cls, "main_input_name", "input_ids")
    params = inspect.signature(entry(cls)).parameters
    if not isinstance(name, str) or name in params:
        return name
    first = next(iter(_required(params)), None)
    return first if first in KNOWN else name


def _required(params) -> list[str]:
    """The parameters a call must name (no default, not ``self``, not ``*args``/``**kwargs``), in order."""
    return [n for n, p in params.items() if p.default is inspect.Parameter.empty and n != "self"
            and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]


def _first(config, *names, default: int) -> int:
    """The first of ``names`` set in the configuration, else in a sub-configuration (a vision or audio one)."""
    from transformers import PreTrainedConfig

    subs = [v for v in vars(config).values() if isinstance(v, PreTrainedConfig)]
    for c in (config, *subs):
        for name in names:
            value = getattr(c, name, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
            if isinstance(value, (list, tuple)) and value and isinstance(value[0], int):
                return value[0]
    return default


@dataclass(frozen=True)
class Inputs:
    """The keyword arguments of one forward (tensors on the CPU), and whether ``labels`` give a loss."""

    kwargs: dict
    labels: bool


def inputs(cls, config, ids, seed: int) -> Inputs:
    """Inputs of the kind ``cls`` reads; ``ids`` are the token ids when it reads tokens."""
    import torch

    from softcapgrad.models.families import INPUTS

    name = needs(cls)
    g = torch.Generator().manual_seed(seed)
    feed = INPUTS.get(config.model_type)
    if feed is not None:  # a model type whose inputs the rules below miss
        kwargs = feed(cls, config, ids, g)
        return Inputs(kwargs, "labels" in kwargs)
    params = inspect.signature(entry(cls)).parameters
    required = set(_required(params))
    batch = ids.shape[0]
    if required & set(QUESTIONS):  # a decision head over one prompt: its questions' marks, options and types
        return Inputs({"input_ids": ids, **{k: make(ids) for k, make in QUESTIONS.items() if k in params}}, False)
    grid = next((n for n in ("grid_thw", "image_grid_thw") if n in required), None)
    if grid is not None:
        return Inputs(_patches(config, required, grid, name, batch, g), False)
    if name == "input_ids" and cls.__name__.endswith("Decoder") and "encoder_hidden_states" in params:
        width = _first(config, "hidden_size", "d_model", default=64)  # a decoder alone: an encoder's output to attend to
        return Inputs({"input_ids": ids, "encoder_hidden_states": torch.randn(batch, ids.shape[1], width, generator=g)},
                      False)
    vision = getattr(config, "vision_config", None)  # a dual encoder (CLIP-like) embeds an image and a text
    if name == "input_ids" and "pixel_values" in params and vision is not None and hasattr(cls, "get_text_features"):
        size, channels = _first(vision, "image_size", default=32), _first(vision, "num_channels", default=3)
        return Inputs({"input_ids": ids, "pixel_values": torch.randn(batch, channels, size, size, generator=g)}, False)
    if name == "input_ids":
        return Inputs({"input_ids": ids, **({"labels": ids} if "labels" in params else {})}, "labels" in params)
    if name == "input_values" and not _first(config, "num_mel_bins", "n_mels", "input_feat_size", default=0):
        codec = _first(config, "upsampling_ratios", "downsampling_ratios", "strides", "hop_length", default=0)
        shape = (batch, 1, SAMPLES) if codec and not _first(config, "conv_kernel", default=0) else (batch, SAMPLES)
        decoder = {"decoder_input_ids": ids} if "decoder_input_ids" in params else {}  # a speech-to-text decoder's
        return Inputs({name: torch.randn(*shape, generator=g), **decoder}, False)  # a waveform (a codec's: one channel)
    if name in ("input_features", "audio_mel", "input_values"):
        bins = _first(config, "input_feat_size", "num_mel_bins", "feature_size", "n_mels", default=128)
        x = torch.randn(batch, 4 * FRAMES, bins, generator=g)
        kwargs = {name: x}
        for mask in ("audio_mel_mask", "input_features_mask", "attention_mask"):
            if mask in params:
                kwargs[mask] = torch.ones(batch, 4 * FRAMES, dtype=torch.bool) if "features" in mask or mask == "attention_mask" \
                    else torch.zeros(batch, 4 * FRAMES, dtype=torch.bool)  # Gemma 3n's mask marks padding
        return Inputs(kwargs, False)
    if name in ("pixel_values", "pixel_values_videos"):
        size = _first(config, "image_size", default=32)
        channels = _first(config, "num_channels", default=3)
        shape = (batch, channels, size, size) if name == "pixel_values" else \
            (batch, _first(config, "num_frames", default=2), channels, size, size)
        kwargs = {name: torch.randn(*shape, generator=g)}
        if "input_ids" in params:  # an image-text model (CLIP-like, a segmenter with a text prompt): text beside
            kwargs["input_ids"] = ids
        return Inputs(kwargs, False)
    raise InputError(f"{cls.__name__} reads {name!r}; the audit feeds token ids, audio features, images or videos only")


def output(out):
    """The tensor compared between runs: the logits, else the last hidden state, else the first tensor."""
    import torch

    if isinstance(out, torch.Tensor) and out.is_floating_point():  # a head that returns its scores alone
        return out
    for name in ("logits", "last_hidden_state", "logits_per_video", "audio_embeds", "pooler_output"):
        value = getattr(out, name, None)
        if isinstance(value, torch.Tensor):
            return value
    stack = [out]
    while stack:  # the first floating-point tensor, depth first (a backbone's feature maps, an encoder's codes)
        value = stack.pop(0)
        if isinstance(value, torch.Tensor):
            if value.is_floating_point():
                return value
        elif isinstance(value, (tuple, list)):
            stack[:0] = list(value)
        elif hasattr(value, "values") and callable(value.values):
            stack[:0] = list(value.values())
    raise InputError(f"{type(out).__name__}: no floating-point output to compare")


def loss(out, has_labels: bool):
    """The model's loss with labels, else the mean square of its output (something to differentiate)."""
    value = getattr(out, "loss", None) if has_labels else None
    return value if value is not None else output(out).float().square().mean()


def build(cls, config, implementation: str, dtype, state: dict | None = None, directory=None):
    """The model on the CPU, under ``implementation``; ``state`` (same weights) or the directory's weights."""
    import copy

    config = copy.deepcopy(config)
    if directory is not None:
        return cls.from_pretrained(directory, config=config, attn_implementation=implementation, dtype=dtype,
                                   local_files_only=True, trust_remote_code=False)
    kwargs: dict[str, Any] = {"attn_implementation": implementation, "dtype": dtype}
    model = cls._from_config(config, **kwargs)
    keep_float32(model, dtype)
    if state is not None:
        model.load_state_dict(state, strict=False)
    return model


def keep_float32(model, dtype) -> list[str]:
    """The weights the class keeps in float32 whatever the format (``_keep_in_fp32_modules_strict``: a router's
    gate, a layer norm), cast as ``from_pretrained`` casts them; ``_from_config`` alone builds every weight in
    ``dtype``. The names cast (matched as loading matches them, with the library's own glob alternation)."""
    import torch

    plan = model._get_dtype_plan(dtype) if hasattr(model, "_get_dtype_plan") else {}
    if not plan:
        return []
    from transformers.core_model_loading import build_glob_alternation

    pattern, groups, _ = build_glob_alternation(list(plan))
    cast = []
    for name, tensor in model.state_dict(keep_vars=True).items():
        found = pattern.search(name)
        if found and tensor.is_floating_point() and tensor.dtype != (target := plan[groups[found.lastgroup]]):
            with torch.no_grad():
                tensor.data = tensor.data.to(target)
            cast.append(name)
    return cast
