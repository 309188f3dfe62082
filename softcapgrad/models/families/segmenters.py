"""Overrides and inputs of the segmenters model types the shrunk defaults do not build or feed (see families/__init__).

Besides segmenters proper, the family feeds the models that read something other than tokens, images,
audio or video: a segmenter's sub-modules that read features, time-series forecasters, vocoders that
read mel frames, a head that reads an encoder's states.
"""

from __future__ import annotations

from typing import Any, Callable

GRID = 4  # side of a feature map fed to a sub-module: 16 positions, past any window of one
MEL_FRAMES = 8  # mel frames of a vocoder's spectrogram: 2048 samples after its 256-fold upsampling


def _width(config, *names: str, default: int = 64) -> int:
    """The first of ``names`` the configuration sets to a positive integer (a width, a length, a count)."""
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return default


def _random(g, *shape: int):
    """Standard normal values of ``shape``, drawn from ``g``."""
    import torch

    return torch.randn(*shape, generator=g)


def features(name: str, width: str, *extra: str) -> Callable:
    """A feed of random features ``(batch, tokens, W)`` under ``name``, W the configuration's ``width`` field
    (a head or a sub-module that reads an encoder's states, not token ids); ``extra`` names masks of ones."""

    def feed(cls, config, ids, g) -> dict:
        import torch

        batch, tokens = ids.shape
        kwargs = {name: _random(g, batch, tokens, _width(config, width))}
        kwargs.update({mask: torch.ones(batch, tokens, dtype=torch.long) for mask in extra})
        return kwargs

    return feed


def series(*, channels: str | None, extra: Callable | None = None) -> Callable:
    """A feed of a random time series ``past_values`` as long as the configuration's ``context_length``:
    ``(batch, length, channels)`` for a forecaster of several channels, else ``(batch, length)``;
    ``extra(config, batch, g)`` adds the inputs the forecaster reads beside it."""

    def feed(cls, config, ids, g) -> dict:
        batch, length = ids.shape[0], _width(config, "context_length")
        shape = (batch, length, _width(config, channels)) if channels else (batch, length)
        return {"past_values": _random(g, *shape), **(extra(config, batch, g) if extra else {})}

    return feed


def _timesfm_extra(config, batch: int, g) -> dict:
    """TimesFM's padding flags (0: every value observed) and its frequency class per series."""
    import torch

    return {"past_values_padding": torch.zeros(batch, _width(config, "context_length")),
            "freq": torch.randint(0, _width(config, "freq_size", default=1), (batch, 1), generator=g)}


def spectrogram(cls, config, ids, g) -> dict:
    """A vocoder's input: random log-mel frames ``(batch, frames, model_in_dim)``."""
    return {"spectrogram": _random(g, ids.shape[0], MEL_FRAMES, _width(config, "model_in_dim", default=80))}


def oneformer(cls, config, ids, g) -> dict:
    """An image and its task prompt: the task's token ids, ``task_seq_len`` of them from the text encoder's
    vocabulary (OneFormer's task encoder reads them as numbers, ``task_inputs.to(dtype)``)."""
    import torch

    side = 2 * max(config.strides)  # a 2 × 2 map at the coarsest stride of its backbone
    vocab = _width(config, "text_encoder_vocab_size", default=256)
    return {"pixel_values": _random(g, ids.shape[0], 3, side, side),
            "task_inputs": torch.randint(0, vocab, (ids.shape[0], _width(config, "task_seq_len")), generator=g)}


def detr_encoder(cls, config, ids, g) -> dict:
    """SAM 3's DETR encoder: one level of vision features and its position encoding ``(batch, W, side, side)``,
    and the prompt's features ``(batch, tokens, W)``. The levels come as one stacked tensor ``(1, batch, W, side,
    side)``, one tensor the audit casts to the model's format like any input: the encoder only indexes and iterates
    them, as it would the list of one level its model passes."""
    import torch

    batch, tokens = ids.shape
    width = _width(config, "hidden_size")
    return {"vision_features": _random(g, 1, batch, width, GRID, GRID), "text_features": _random(g, batch, tokens, width),
            "vision_pos_embeds": _random(g, 1, batch, width, GRID, GRID),
            "text_mask": torch.ones(batch, tokens, dtype=torch.bool)}


def detr_decoder(cls, config, ids, g) -> dict:
    """SAM 3's DETR decoder: the encoder's flattened vision states and position encoding ``(batch, side², W)``, the
    prompt's features, and the one level's shape (which turns on the box-relative position bias, as in its model)."""
    import torch

    batch, tokens = ids.shape
    width = _width(config, "hidden_size")
    return {"vision_features": _random(g, batch, GRID * GRID, width), "text_features": _random(g, batch, tokens, width),
            "vision_pos_encoding": _random(g, batch, GRID * GRID, width),
            "text_mask": torch.ones(batch, tokens, dtype=torch.bool), "spatial_shapes": torch.tensor([[GRID, GRID]])}


def mask_decoder(cls, config, ids, g) -> dict:
    """SAM 3's mask decoder: the DETR decoder's queries, the backbone's levels (one more than its upsampling stages)
    and the encoder's states, whose first side² positions replace the last level. The levels come stacked, all
    ``side × side``, one tensor the audit casts like any input: the pixel decoder indexes, slices and iterates them and interpolates each to the next one's size
    (here the same size), so every one of its stages runs."""
    import torch

    batch, tokens = ids.shape
    width = _width(config, "hidden_size")
    levels = _width(config, "num_upsampling_stages", default=3) + 1
    return {"decoder_queries": _random(g, batch, tokens, width),
            "backbone_features": _random(g, levels, batch, width, GRID, GRID),
            "encoder_hidden_states": _random(g, batch, GRID * GRID, width),
            "prompt_features": _random(g, batch, tokens, width),
            "prompt_mask": torch.ones(batch, tokens, dtype=torch.bool)}


def inference_only(cls, config, ids, g) -> dict:
    """Refuses, with the reason: a video model whose forward transformers runs under ``torch.inference_mode()``.

    An inference session built from tensors alone (the frames, one point prompt for one object) does run a
    tracker's forward in evaluation, but nothing it returns carries a gradient, so the audit's backward has
    nothing to differentiate; a tracker's forward in training mode also reads ``object_score_logits``, which
    only evaluation stores. Feeding it would make a row of refused runs, not an audit."""
    from softcapgrad.core.checks import InputError

    tracker = "" if config.model_type == "sam3_video" else (
        "; in training mode it reads object_score_logits, which only evaluation stores")
    raise InputError(f"Training of {cls.__name__} is impossible: transformers runs its forward under "
                     f"torch.inference_mode() (no gradient reaches a weight, no backward runs){tracker}")


VOCODER = {"upsample_initial_channel": 64}  # a HiFi-GAN's width has a name the shrink does not know: 512 channels
# (12.6 M parameters, the costliest tiny row) where 64 halve alike through its four upsampling stages
OVERRIDES: dict[str, dict[str, Any]] = {
    "speecht5_hifigan": VOCODER,
    "fastspeech2_conformer_hifigan": VOCODER,
}
INPUTS: dict[str, Callable] = {
    **dict.fromkeys(("edgetam_video", "sam2_video", "sam3_tracker_video", "sam3_video"), inference_only),
    "patchtsmixer": series(channels="num_input_channels"),
    "patchtst": series(channels="num_input_channels"),
    "timesfm": series(channels=None, extra=_timesfm_extra),
    "timesfm2_5": series(channels=None),
    "oneformer": oneformer,
    # the word-timestamp head reads the speech encoder's states (its hidden size), not token ids
    "nemotron3_5_transcribe_word_timestamp": features("inputs_embeds", "hidden_size", "attention_mask"),
    "speecht5_hifigan": spectrogram,
    "fastspeech2_conformer_hifigan": spectrogram,
    **dict.fromkeys(("sam3_detr_encoder", "sam3_lite_text_detr_encoder"), detr_encoder),
    **dict.fromkeys(("sam3_detr_decoder", "sam3_lite_text_detr_decoder"), detr_decoder),
    **dict.fromkeys(("sam3_mask_decoder", "sam3_lite_text_mask_decoder"), mask_decoder),
}
