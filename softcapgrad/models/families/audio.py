"""Overrides and inputs of the audio model types the shrunk defaults do not build or feed (see families/__init__)."""

from __future__ import annotations

from typing import Any, Callable

FRAMES = 64  # mel frames of a random spectrogram: past every stem's stride (8 at most here), a few tokens after it
SAMPLES = 19200  # waveform samples: 1.2 s at 16 kHz, 60 frames of a speech encoder's stride of 320
HOPS = 12  # frames of a codec's waveform (a hop of samples each): in training mode the semantic encoder masks spans of
# 10 frames (mask_time_length), so it needs more


def _prefixed(prefix: str, fields: dict) -> dict:
    """``fields`` set inside the sub-configuration ``prefix`` (a composite model holds the same parts)."""
    return {f"{prefix}.{k}": v for k, v in fields.items()}


# CLAP's audio tower is a Swin over the spectrogram folded into a spec_size² image; its last stage is
# patch_embeds_hidden_size · 2^(stages - 1) wide and the projection reads hidden_size: 96 · 8 = 768 no longer meets
# the shrunk 64, so the patch width is 64 / 8. Two Swin blocks per stage (a plain and a shifted window, the two kinds
# every stage alternates) instead of 2, 2, 6, 2. The image stays 256² (the window of 8 must fit the last stage's
# 256 / 32 patches).
_CLAP = {"patch_embeds_hidden_size": 8, "depths": [2, 2, 2, 2]}
# A HiFi-GAN vocoder starts at upsample_initial_channel (512, a width the shrinking misses) and halves it at each of
# its four upsamplings, on 256 samples per frame: nearly all the compute and parameters (14 of VITS's 16 M, 14 of
# FastSpeech 2 with HiFi-GAN's 27 M); 32 leaves 2 channels after the last one.
_HIFIGAN = {"upsample_initial_channel": 32}
# Qwen2.5-Omni's DiT has 22 layers by default, layer 0 and 20 looking one block back, layer 10 one block ahead;
# the cut to two layers keeps neither index 10 nor 20, so the tiny copy keeps one layer of each kind instead.
# Its code book (8193 entries of 512, 4.2 M parameters) is a size the shrinking misses: 255 (+1) entries of 64.
_DIT = {"num_hidden_layers": 3, "look_backward_layers": [0], "look_ahead_layers": [1], "num_embeds": 255,
        "emb_dim": 64}
# BigVGAN halves its channels at each of its six upsamplings from upsample_initial_channel (1536, unshrunk: 115 M
# parameters); 128 leaves 2 channels after the last one.
_BIGVGAN = {"upsample_initial_channel": 128}

OVERRIDES: dict[str, dict[str, Any]] = {
    # DAC's widths are named apart from the shrink's: its encoder starts at 64 channels and doubles at each of its 4
    # strides (to 1024), its decoder starts at 1536 and halves; on the census's 1.2 s waveform that is minutes of
    # CPU in bf16 where the CPU has no bf16 instructions. 8 and 64 keep every stride, block and activation
    "dac": {"encoder_hidden_size": 8, "decoder_hidden_size": 64},
    "clap": _prefixed("audio_config", _CLAP),
    "clap_audio_model": _CLAP,
    # the convolution stem's width (480) is a size the shrinking misses: 4.6 M of its 4.8 M parameters and most of
    # the compute; the class derives the linear layer after the stem from that width (width · ceil(128 mel bins / 8)),
    # but the shrunk dictionary hands back the old product (480 · 16), which wins over the derived one: set both
    "dots3_note_audio_encoder": {"downsample_hidden_size": 32, "conv_output_size": 32 * ((128 + 7) // 8)},
    # the quantizer's width is the acoustic (hidden_size) and the semantic encoders' widths side by side, 1024 +
    # 1024 by default, unshrunk; the acoustic encoder doubles encoder_hidden_size at each of its five downsamplings
    # (48 · 32 = 1536 channels, 34 M parameters): 4 · 32 = 128 channels (0.8 M in all)
    "neucodec": {"quantization_dim": 128, "encoder_hidden_size": 4},
    "xcodec2": {"quantization_dim": 128, "encoder_hidden_size": 4},
    # the same unshrunk stem width of 480 (its linear layer is derived from it at build time, nothing to set beside)
    "qwen3_omni_moe_audio_encoder": {"downsample_hidden_size": 32},
    "vits": _HIFIGAN,
    "fastspeech2_conformer_with_hifigan": _prefixed("vocoder_config", _HIFIGAN),
    "qwen2_5_omni_dit": _DIT,
    "qwen2_5_omni_bigvgan": _BIGVGAN,
    "qwen2_5_omni_token2wav": {**_prefixed("dit_config", _DIT), **_prefixed("bigvgan_config", _BIGVGAN)},
}


def _randn(g, *shape):
    import torch

    return torch.randn(*shape, generator=g)


def _clap_audio(cls, config, ids, g) -> dict:
    """A log-mel spectrogram as CLAP's feature extractor gives a short clip: (batch, 1, frames, mel bins), one crop,
    and ``is_longer`` false (it marks clips cut into crops; only the crop fusion, off by default, reads it)."""
    import torch

    batch = ids.shape[0]
    return {"input_features": _randn(g, batch, 1, FRAMES, config.num_mel_bins),
            "is_longer": torch.zeros(batch, 1, dtype=torch.bool)}


def _clap(cls, config, ids, g) -> dict:
    """CLAP embeds a text (the token ids) and a clip (as its audio tower reads it)."""
    return {"input_ids": ids, **_clap_audio(cls, config.audio_config, ids, g)}


def _dots3(cls, config, ids, g) -> dict:
    """Mel frames (batch, bins, frames) and each chunk's length in waveform samples (hop_length per frame)."""
    import torch

    batch = ids.shape[0]
    return {"input_features": _randn(g, batch, config.feature_size, FRAMES),
            "chunk_sample_lengths": torch.full((batch,), FRAMES * config.hop_length, dtype=torch.long)}


def _inkling(cls, config, ids, g) -> dict:
    """Quantized mel frames: per frame, each bin's level below ``mel_vocab_size`` (one code book per bin)."""
    import torch

    return {"audio_input_ids": torch.randint(0, config.mel_vocab_size, (ids.shape[0], FRAMES, config.n_mel_bins),
                                             generator=g)}


def _codec(cls, config, ids, g) -> dict:
    """A waveform (batch, 1, samples) and the semantic encoder's features of it: one frame per hop of the acoustic
    encoder (the product of its downsampling ratios), each as wide as the semantic model's feature projection."""
    import math

    batch = ids.shape[0]
    hop = math.prod(config.downsampling_ratios)
    width = config.semantic_model_config.feature_projection_input_dim
    return {"input_values": _randn(g, batch, 1, HOPS * hop), "input_features": _randn(g, batch, HOPS, width)}


def _qwen_audio(cls, config, ids, g) -> dict:
    """Qwen-Omni's audio towers take every clip's mel frames side by side, (bins, batch · frames), and each clip's
    number of frames."""
    import torch

    batch = ids.shape[0]
    return {"input_features": _randn(g, config.num_mel_bins, batch * FRAMES),
            "feature_lens": torch.full((batch,), FRAMES, dtype=torch.long)}


def _bigvgan(cls, config, ids, g) -> dict:
    """A log-mel spectrogram (batch, bins, frames), the vocoder's only input."""
    return {"mel_spectrogram": _randn(g, ids.shape[0], config.mel_dim, FRAMES // 4)}


def _dit(cls, config, ids, g) -> dict:
    """One denoising step of the DiT: the noisy mel (batch, frames, bins), a reference mel, the speaker embedding per
    frame, the speech codes (each repeated ``repeats`` times to the frames) and a time in [0, 1]."""
    import torch

    batch, codes = ids.shape[0], FRAMES // 8
    frames = codes * config.repeats
    return {"hidden_states": _randn(g, batch, frames, config.mel_dim),
            "condition_vector": _randn(g, batch, frames, config.mel_dim),
            "speaker_embedding": _randn(g, batch, frames, config.enc_emb_dim),
            "quantized_code": torch.randint(0, config.num_embeds, (batch, codes), generator=g),
            "time_step": torch.rand(batch, generator=g)}


def _token2wav(cls, config, ids, g) -> dict:
    """Speech codes, the speaker's conditioning vector and a reference mel: the DiT samples a mel, BigVGAN voices it."""
    import torch

    batch, dit = ids.shape[0], config.dit_config
    return {"code": torch.randint(0, dit.num_embeds, (batch, FRAMES // 8), generator=g),
            "conditioning": _randn(g, batch, dit.enc_emb_dim),
            "reference_mel": _randn(g, batch, FRAMES // 4, dit.mel_dim)}


def _speecht5(cls, config, ids, g) -> dict:
    """SpeechT5's bare model has neither prenet (the speech and text prenets belong to its task heads): its encoder
    and decoder read hidden states, (batch, frames, hidden) each, not a waveform nor the mel bins its configuration
    names for the text-to-speech decoder."""
    batch, width = ids.shape[0], config.hidden_size
    return {"input_values": _randn(g, batch, FRAMES // 4, width),
            "decoder_input_values": _randn(g, batch, ids.shape[1], width)}


def _vits(cls, config, ids, g) -> dict:
    """Token ids alone: VITS refuses ``labels`` (no training path), and its forward is the synthesis."""
    return {"input_ids": ids}


def _fastspeech2(cls, config, ids, g) -> dict:
    """In training mode FastSpeech 2 regulates the length by the given durations and predicts against the given
    pitch, energy and spectrogram: each token lasts 2 frames, so the spectrogram has 2 · tokens frames."""
    import torch

    batch, tokens = ids.shape
    model = getattr(config, "model_config", config)
    duration = 2
    return {"input_ids": ids,
            "duration_labels": torch.full((batch, tokens), duration, dtype=torch.long),
            "pitch_labels": _randn(g, batch, tokens, 1),
            "energy_labels": _randn(g, batch, tokens, 1),
            "spectrogram_labels": _randn(g, batch, tokens * duration, model.num_mel_bins)}


INPUTS: dict[str, Callable] = {
    "clap": _clap,
    "clap_audio_model": _clap_audio,
    "dots3_note_audio_encoder": _dots3,
    "inkling_audio": _inkling,
    "neucodec": _codec,
    "xcodec2": _codec,
    "qwen2_5_omni_audio_encoder": _qwen_audio,
    "qwen3_omni_moe_audio_encoder": _qwen_audio,
    "qwen2_5_omni_bigvgan": _bigvgan,
    "qwen2_5_omni_dit": _dit,
    "qwen2_5_omni_token2wav": _token2wav,
    "speecht5": _speecht5,
    "vits": _vits,
    "fastspeech2_conformer": _fastspeech2,
    "fastspeech2_conformer_with_hifigan": _fastspeech2,
}
