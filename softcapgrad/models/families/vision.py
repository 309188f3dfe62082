"""Overrides and inputs of the vision model types the shrunk defaults do not build or feed (see families/__init__)."""

from __future__ import annotations

from typing import Any, Callable

SAM = {  # SAM and SAM-HQ
    # the prompt encoder's image_embedding_size (image_size // patch_size) and the vision config's scale
    # (hidden_size // 2) are derived, but the shrunk defaults pass the full model's 64 and 384 back in over them
    "prompt_encoder_config.image_embedding_size": 2, "vision_config.scale": 32,
    # the shared positional embedding is 2 · num_pos_feats wide and is added to the mask decoder's keys, which are
    # output_channels wide (2 · 128 = 256 by default)
    "vision_config.num_pos_feats": 32,
    # global attention at layers 2, 5, 8 and 11 of twelve: of the two kept layers the second, so both kinds stay
    "vision_config.global_attn_indexes": [1],
}


def _hiera(prefix: str) -> dict:
    """A tiny SAM 2 Hiera backbone (its fields under ``prefix``) and, for a vision model around it, the neck's view.

    The stage widths are a list the shrink leaves alone, so the first stage (96) no longer matches the shrunk
    hidden_size (64) the patch embedding writes: the stages double from 64 instead. The image is a list too
    (1024²): 32², a multiple of 4 · 8, so the patch grid (stride 4) tiles the first stage's 8-wide window
    embedding, as 1024 does. Blocks 1-2-7-2 with global attention at blocks 5, 7, 9 become 1-1-2-1 with the last
    block of the third stage global: one pooling block per stage change, windowed blocks and a global one."""
    out = {f"{prefix}{k}": v for k, v in {
        "image_size": [32, 32], "embed_dim_per_stage": [64, 128, 256, 512], "blocks_per_stage": [1, 1, 2, 1],
        "global_attention_blocks": [3]}.items()}
    if prefix:  # the neck reads the stages widest last, and the sizes of the three finest feature maps (stride 4, 8, 16)
        neck = prefix.removesuffix("backbone_config.")
        out |= {f"{neck}backbone_channel_list": [512, 256, 128, 64],
                f"{neck}backbone_feature_sizes": [[8, 8], [4, 4], [2, 2]]}
    return out


OVERRIDES: dict[str, dict[str, Any]] = {
    # the connector pixel-shuffles each tile's patch grid by scale_factor 4: a 4 × 4 grid of 16-pixel patches
    # (the shrink's 2 × 2 grid does not divide); its DeepStack taps named layers 3, 7 and 10 of twelve: the last
    # of the two kept layers is tapped instead
    "granite_docling_vision": {"image_size": 64, "deepstack_visual_indexes": [1]},
    # the adapter's first projection reads the pixel-shuffled patches, hidden_size / pixel_shuffle_ratio² wide
    # (1408 / 0.25 = 5632 = intermediate_size by default); its two projections are projector_input_dim and
    # projector_output_dim wide and must agree (4096 each by default, a 4096² matrix, shrunk to the width)
    "llama4_vision_model": {"intermediate_size": 256, "projector_input_dim": 64, "projector_output_dim": 64},
    # the forward stacks the local encoder's hidden states at intermediate_layers_indices (3 … 30 of 32): of the
    # two kept layers, the last; the global encoder's depth and the head count are sizes the shrink's names miss
    "mllama_vision_model": {"intermediate_layers_indices": [1], "num_global_layers": 2, "attention_heads": 2},
    # its encoder's widths are planned from the number of layers: past five layers some layer maps the last,
    # temporal scale to itself, ceil(40² · 3 · 2) · 64 = 614400 channels wide (the default's 24 layers would
    # allocate a 614400² matrix); the layer count is n_layers, a name the shrink does not cut
    "inkling_vision": {"n_layers": 2},
    "sam": SAM,
    "sam_hq": SAM,
    "sam2_hiera_det_model": _hiera(""),
    "sam2_vision_model": _hiera("backbone_config."),
    "sam2": _hiera("vision_config.backbone_config."),
    # the neck scales the ViT's patch grid by 4, 2, 1 (and 0.5): for the shrunk 28-pixel image of 14-pixel patches
    # the three finest maps are 8², 4², 2², not the full model's 288², 144², 72²; global attention at layers 7, 15,
    # 23 and 31 of thirty-two: of the two kept layers the second, so both kinds stay
    "sam3_tracker": {"vision_config.backbone_feature_sizes": [[8, 8], [4, 4], [2, 2]],
                     "vision_config.backbone_config.global_attn_indexes": [1]},
}


def _mllama(cls, config, ids, g) -> dict:
    """One image per sample cut into max_num_tiles tiles, all real, under the aspect ratio that has that many
    (its id counts from 1: 0 is padding); the aspect-ratio embeddings are shaped for max_num_tiles tiles."""
    import torch

    batch, tiles, size = ids.shape[0], config.max_num_tiles, config.image_size
    ratio = 1 + next(i for i, (h, w) in enumerate(config.supported_aspect_ratios) if h * w == tiles)
    return {"pixel_values": torch.randn(batch, 1, tiles, config.num_channels, size, size, generator=g),
            "aspect_ratio_ids": torch.full((batch, 1), ratio, dtype=torch.long),
            "aspect_ratio_mask": torch.ones(batch, 1, tiles, dtype=torch.long)}


def _gemma4(cls, config, ids, g) -> dict:
    """Images already cut into patches (``3 · patch²`` values each) on a square grid of 2 × 2 pooling windows, and
    each patch's (x, y) position: the pooler averages pooling_kernel_size² patches into one soft token."""
    import torch

    batch, side = ids.shape[0], 2 * config.pooling_kernel_size
    ys, xs = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
    positions = torch.stack([xs.flatten(), ys.flatten()], dim=-1)
    return {"pixel_values": torch.rand(batch, side * side, 3 * config.patch_size ** 2, generator=g),
            "pixel_position_ids": positions.expand(batch, -1, -1).clone()}


def _flat_patches(cls, config, ids, g) -> dict:
    """Images cut into flat patches of ``channels · patch²`` values (these towers take no temporal patch, unlike the
    generic feed's), on a 2·merge × 2·merge grid of one frame per image, with that grid."""
    import torch

    batch, side = ids.shape[0], 2 * config.spatial_merge_size
    width = config.num_channels * config.patch_size ** 2
    return {"pixel_values": torch.randn(batch * side * side, width, generator=g),
            "grid_thw": torch.tensor([[1, side, side]] * batch)}


def _inkling2(cls, config, ids, g) -> dict:
    """Per image a 2 × 2 grid of merged tokens (the grid counts tokens after merging), each token a
    ``(patch · merge)² × channels`` block of pixels in [-1, 1]."""
    import torch

    batch, block = ids.shape[0], config.patch_size * config.spatial_merge_size
    pixels = torch.rand(batch * 4, block, block, config.num_channels, generator=g) * 2 - 1
    return {"pixel_values": pixels, "image_grid_thw": torch.tensor([[1, 2, 2]] * batch)}


def _inkling(cls, config, ids, g) -> dict:
    """One video patch per sample, ``temporal × patch × patch × channels``: the encoder folds it to one token."""
    import torch

    patch = config.patch_size
    return {"pixel_values": torch.randn(ids.shape[0], config.temporal_patch_size, patch, patch, config.num_channels,
                                        generator=g)}


INPUTS: dict[str, Callable] = {
    "mllama_vision_model": _mllama, "gemma4_vision": _gemma4, "hy_v4_vl_vision": _flat_patches,
    "dots3_note_vision_encoder": _flat_patches, "inkling2_vision": _inkling2, "inkling_vision": _inkling,
}
