"""Overrides and inputs of the multimodal model types the shrunk defaults do not build or feed (see families/__init__)."""

from __future__ import annotations

from typing import Any, Callable

CODES = 8  # a tiny image codebook: its codes are the vocabulary's ids just below the image placeholders
TOP = 255  # the image placeholder: the tiny vocabulary's top id


def _chameleon_name(code: int) -> str:
    """Chameleon's tokenizer name of an image code: IMGIMG, its digits as letters (0 -> A), one closing letter."""
    return "IMGIMG" + "".join(chr(ord("A") + int(d)) for d in str(code)) + "Z"


OVERRIDES: dict[str, dict[str, Any]] = {
    # PaliGemma reads the cap from its text model's config: PaliGemma 2's Gemma 2 text model has one
    "paligemma": {"text_config.model_type": "gemma2"},
    # the model maps image codes to token ids through the tokenizer's vocabulary, which a config's defaults leave
    # None: a tiny map of the placeholder and one id per code of a codebook shrunk to match. The image tokenizer's
    # 128 base channels (27 M parameters) cut to 32, the least its 32-group norms take; its resolution to the
    # images fed (it decides nothing but where attention runs, and it runs nowhere here as in the defaults)
    "chameleon": {"vocabulary_map": {"<image>": TOP, **{_chameleon_name(c): TOP - CODES + c for c in range(CODES)}},
                  "vq_config.num_embeddings": CODES, "vq_config.base_channels": 32, "vq_config.resolution": 32},
    # as Chameleon, and Emu3 also reads its end-of-line token from the map; its image tokenizer (241 M parameters
    # at 256 base channels) cut to 32, and the width of its attention block, which the defaults tie to its last
    # level's channels (256 × 4 = 1024), to 32 × 4
    "emu3": {"vocabulary_map": {"<image>": TOP, "<|extra_200|>": TOP - 1 - CODES,
                                **{f"<|visual token {c:06d}|>": TOP - CODES + c for c in range(CODES)}},
             "vq_config.codebook_size": CODES, "vq_config.base_channels": 32, "vq_config.hidden_size": 128},
    # the same image tokenizer alone (audited through its encode: it has no forward of its own)
    "emu3_vqgan": {"codebook_size": CODES, "base_channels": 32, "hidden_size": 128},
    # the talker's sparse block builds a shared expert of this width, which its config class never declares
    # (checkpoints write it in config.json): the tiny intermediate width
    "qwen3_omni_moe_talker_text": {"shared_expert_intermediate_size": 128},
    # and the talker reads the vision encoder's merge size (2 by its defaults) from its own config, which never
    # declares it. Built, the model is refused all the same: its top class only generates (no forward of its own);
    # its thinker is audited as its own type
    "qwen3_omni_moe": {"talker_config.text_config.shared_expert_intermediate_size": 128,
                       "talker_config.spatial_merge_size": 2},
    # Llama 4's head builds its output object from an attribute (``image_outputs``) its text model's output lacks,
    # so only its tuple path returns; the head takes that path when its config says so (and the feed keeps the
    # decorator around the head from converting the tuple a second time). Its text model's layers are one each of
    # four kinds in the defaults' pattern: the list of MoE layers names every layer, so the cut kept all 48; the
    # class derives the lists again for 4. Its vision adapter's widths are sized so that they chain as in a
    # checkpoint: the pixel shuffle (ratio 1/2) gives 4 × 64 features, the MLP's input, then 64 throughout
    "llama4": {"return_dict": False, "text_config.num_hidden_layers": 4, "text_config.moe_layers": None,
               "text_config.no_rope_layers": None, "text_config.layer_types": None,
               "vision_config.intermediate_size": 256, "vision_config.projector_input_dim": 64,
               "vision_config.projector_output_dim": 64, "vision_config.vision_output_dim": 64},
    # the vision adapter's input width must equal the vision width (its class checks it); both were 1536, but the
    # shrink met 1536 first as an intermediate width and took 128 for it
    "dots3_note": {"vision_config.adapter_in_dim": 64},
    # the vision tower plans its layers' widths from its patch (40 × 40 × 2 frames × 3 channels) and depth (24, a
    # field the cut does not know): most of its 24 layers land on the last scale, 614 400 channels wide, and the
    # build asks for terabytes. A 4 × 4 × 2 patch over 3 layers keeps each kind of fold (2 × 2 space twice, then 2
    # frames) and its widths 64
    "inkling_mm_model": {"vision_config.patch_size": 4, "vision_config.n_layers": 3},
    # LiLT embeds a box as six parts of hidden_size // 6 each and adds them to a hidden_size-wide sum: the width
    # must be a multiple of 6 (768 = 6 × 128), which 64 is not; 48 is, and of its 2 heads and its layout stream's
    # shrink ratio 4
    "lilt": {"hidden_size": 48},
    # LayoutLMv3 concatenates four coordinate and two shape embeddings into the hidden width (4 × 128 + 2 × 128 =
    # 768): the same 48 split alike; its image side (224 pixels, 196 patches of 16) to a 2 × 2 grid of patches
    "layoutlmv3": {"hidden_size": 48, "coordinate_size": 8, "shape_size": 8, "input_size": 32},
    # two-stage Grounding DINO keeps the num_queries best of its encoder's proposals, one per pixel of its feature
    # maps: 900 needs a page of about 240 × 240; a 64 × 64 image gives 85 (8², 4², 2², 1, 1), so 16 queries.
    # Its Swin backbone keeps its stage depths (2, 2, 6, 2: the cut reads no list of depths) and widths doubling
    # from 64 (12 M parameters, most of the build): two blocks a stage (a plain and a shifted window each) from 32
    "grounding-dino": {"num_queries": 16, "backbone_config.depths": [2, 2, 2, 2], "backbone_config.embed_dim": 32},
    "mm-grounding-dino": {"num_queries": 16, "backbone_config.depths": [2, 2, 2, 2], "backbone_config.embed_dim": 32},
    # Janus's image tokenizer decodes what it encodes and checks the code grid against num_patches² (32² = 1024
    # codes of a 512-pixel image): a 2 × 2 grid of a 32-pixel image (its 5 levels halve 4 times); its 128 base
    # channels (72 M parameters) cut to 32, the least its 32-group norms take
    "janus_vqgan": {"num_patches": 2, "base_channels": 32},
}


def _with_image(ids, count: int, text_below: int):
    """Token ids with ``count`` image placeholders after the first token of each row, text ids below the codebook's
    ids (the head masks those out of its logits), and labels of the text only."""
    input_ids = ids % text_below
    input_ids[:, 1:1 + count] = TOP
    return input_ids, input_ids.masked_fill(input_ids == TOP, -100)


def _chameleon(cls, config, ids, g) -> dict:
    """One image per row, 2 × 2 codes (its tokenizer downsamples by 2 per level after the first), beside text."""
    import torch

    side = 2 * 2 ** (len(config.vq_config.channel_multiplier) - 1)
    input_ids, labels = _with_image(ids, 4, TOP - CODES)
    pixels = torch.randn(ids.shape[0], config.vq_config.in_channels, side, side, generator=g)
    return {"input_ids": input_ids, "pixel_values": pixels, "labels": labels}


def _emu3(cls, config, ids, g) -> dict:
    """One image per row, one row of 2 codes and its end-of-line token (3 tokens), beside text."""
    import torch

    input_ids, labels = _with_image(ids, 3, TOP - 1 - CODES)
    return {"input_ids": input_ids, **_emu3_image(config.vq_config, ids.shape[0], g), "labels": labels}


def _emu3_image(vq, batch: int, g) -> dict:
    """One image per row whose code grid is 1 × 2 (each level after the first halves the side), with its size."""
    import torch

    factor = 2 ** (len(vq.channel_multiplier) - 1)
    pixels = torch.randn(batch, vq.in_channels, factor, 2 * factor, generator=g)
    return {"pixel_values": pixels, "image_sizes": torch.tensor([[factor, 2 * factor]] * batch)}


def _embeds(cls, config, ids, g) -> dict:
    """Input embeddings of the model's width, one per token: a module its parent feeds embeddings, not token ids."""
    import torch

    return {"inputs_embeds": torch.randn(*ids.shape, config.hidden_size, generator=g)}


def _llama4(cls, config, ids, g) -> dict:
    """One image per row (a 2 × 2 grid of patches, one token after the pixel shuffle) beside text, without labels:
    the output is a tuple (see the override), whose first tensor is then the logits.

    The decorator around Llama 4's head pops ``return_dict`` (the config's when absent) and converts the output to
    a tuple when it ``is False``: the head's own tuple would fail there. ``return_dict=True`` keeps it as it is.
    """
    import torch

    vision = config.vision_config
    pixels = torch.randn(ids.shape[0], vision.num_channels, vision.image_size, vision.image_size, generator=g)
    return {"input_ids": _one_token(ids, config.image_token_id), "pixel_values": pixels,
            "return_dict": True}


def _inkling(cls, config, ids, g) -> dict:
    """One patch per row (frames × height × width × channels, one token each) beside text, labels the text's."""
    import torch

    vision = config.vision_config
    input_ids = _one_token(ids, config.image_token_id)
    pixels = torch.randn(ids.shape[0], vision.temporal_patch_size, vision.patch_size, vision.patch_size,
                         vision.num_channels, generator=g)
    labels = input_ids.masked_fill(input_ids == config.image_token_id, -100)
    return {"input_ids": input_ids, "pixel_values": pixels, "labels": labels}


def _boxes(ids, g):
    """One box per token (x0, y0, x1, y1) in the 0-1000 range layout models read, every corner after its origin."""
    import torch

    start = torch.randint(0, 500, (*ids.shape, 2), generator=g)
    return torch.cat([start, start + torch.randint(0, 500, (*ids.shape, 2), generator=g)], dim=-1)


def _lilt(cls, config, ids, g) -> dict:
    """Token ids and their boxes (the layout stream's input)."""
    return {"input_ids": ids, "bbox": _boxes(ids, g)}


def _layoutlmv3(cls, config, ids, g) -> dict:
    """Token ids, their boxes and a page image (its patches join the sequence after the text)."""
    import torch

    pixels = torch.randn(ids.shape[0], config.num_channels, config.input_size, config.input_size, generator=g)
    return {"input_ids": ids, "bbox": _boxes(ids, g), "pixel_values": pixels}


def _grounding(cls, config, ids, g) -> dict:
    """A 64 × 64 image (the backbone's shrunk image size, 8, leaves fewer proposals than queries) and a text prompt."""
    import torch

    channels = config.backbone_config.num_channels
    return {"pixel_values": torch.randn(ids.shape[0], channels, 64, 64, generator=g), "input_ids": ids}


def _siglip2_patches(vision, batch: int, g) -> dict:
    """SigLIP 2's image input: already cut into patches (a 4 × 4 grid of ``channels × patch²`` values each), the
    grid's shape per image and the mask of real patches (all of them)."""
    import torch

    width = vision.num_channels * vision.patch_size * vision.patch_size
    return {"pixel_values": torch.randn(batch, 16, width, generator=g),
            "pixel_attention_mask": torch.ones(batch, 16, dtype=torch.long),
            "spatial_shapes": torch.tensor([[4, 4]] * batch)}


def _siglip2(cls, config, ids, g) -> dict:
    """A text and an image (patches, see ``_siglip2_patches``) for the dual encoder."""
    return {"input_ids": ids, **_siglip2_patches(config.vision_config, ids.shape[0], g)}


def _siglip2_vision(cls, config, ids, g) -> dict:
    """An image (patches, see ``_siglip2_patches``) for the vision encoder alone."""
    return _siglip2_patches(config, ids.shape[0], g)


def _janus_vqgan(cls, config, ids, g) -> dict:
    """An image whose code grid is num_patches × num_patches (each level after the first halves the side)."""
    import torch

    side = config.num_patches * 2 ** (len(config.channel_multiplier) - 1)
    return {"pixel_values": torch.randn(ids.shape[0], config.in_channels, side, side, generator=g)}


def _one_token(ids, token: int):
    """Token ids with one placeholder (an image's one token) after each row's first token."""
    out = ids.clone()
    out[:, 1] = token
    return out


INPUTS: dict[str, Callable] = {
    "chameleon": _chameleon,
    "emu3": _emu3,
    "emu3_vqgan": lambda cls, config, ids, g: _emu3_image(config, ids.shape[0], g),  # its encode, alone
    "qwen3_omni_moe_talker_text": _embeds,
    "qwen3_omni_moe_talker_code_predictor": _embeds,
    "llama4": _llama4,
    "inkling_mm_model": _inkling,
    "lilt": _lilt,
    "janus_vqgan": _janus_vqgan,
    "siglip2": _siglip2,
    "siglip2_vision_model": _siglip2_vision,
    "grounding-dino": _grounding,
    "mm-grounding-dino": _grounding,
    "layoutlmv3": _layoutlmv3,
}
