"""Overrides and inputs of the detection model types the shrunk defaults do not build or feed (see families/__init__)."""

from __future__ import annotations

from typing import Any, Callable


def _hgnet_backbone() -> dict[str, Any]:
    """HGNetV2 stages 64 wide or less, one block of two layers each (its stem feeds stage 1, each stage the next)."""
    return {f"backbone_config.{k}": v for k, v in {
        "stem_channels": [3, 16, 16], "stage_in_channels": [16, 32, 64, 64],
        "stage_mid_channels": [16, 16, 32, 32], "stage_out_channels": [32, 64, 64, 64],
        "hidden_sizes": [32, 64, 64, 64], "stage_num_blocks": [1, 1, 1, 1],
        "stage_numb_of_layers": [2, 2, 2, 2]}.items()}


def _rt_detr(backbone: str, **more) -> dict[str, Any]:
    """The RT-DETR line's tiny repairs: the decoder's inputs as wide as the encoder, few queries, a thin backbone.

    The decoder projects the hybrid encoder's feature maps, which are ``encoder_hidden_dim`` (64) wide, from
    ``decoder_in_channels``, a list the shrinking leaves at 256. The queries are the top-k of the encoder's anchors,
    and a small image has fewer than the default 300. The backbone's stage widths are lists the shrinking leaves at
    ResNet-50's (24 M parameters alone): each stage 64 wide or less, one block deep, every stage's input as wide as
    the one before's output.
    """
    out: dict[str, Any] = {"decoder_in_channels": [64, 64, 64], "num_queries": 16, **more}
    if backbone == "resnet":
        out.update({"backbone_config.hidden_sizes": [64, 64, 64, 64], "backbone_config.depths": [1, 1, 1, 1]})
    else:
        out.update(_hgnet_backbone())
    return out


def _lcnet_v4_detector() -> dict[str, Any]:
    """A PP-LCNetV4 backbone laid out for the PP-OCRv6 detectors, stages 16 to 64 wide.

    The necks read all four stages and double each level's height and width onto the one before; the config
    class's default backbone is the text recognizer's (the last stage alone; stages that halve the height only).
    The detector's layout: every stage after the first halves both sides; each block is [kernel, in, out, stride,
    squeeze-excitation]; ``stage_out_channels`` follows the blocks (the shrunk dict would carry the default's).
    """
    blocks = [[[3, 16, 16, 1, True], [3, 16, 16, 1, False]], [[3, 16, 32, 2, False], [3, 32, 32, 1, True]],
              [[3, 32, 64, 2, False], [3, 64, 64, 1, True]], [[3, 64, 64, 2, False], [3, 64, 64, 1, True]]]
    return {f"backbone_config.{k}": v for k, v in {
        "out_features": ["stage1", "stage2", "stage3", "stage4"], "out_indices": [1, 2, 3, 4],
        "stem_channels": [3, 16, 16], "block_configs": blocks,
        "stage_out_channels": [stage[-1][2] for stage in blocks]}.items()}


# The large-kernel neck of the server text detectors builds its intra-class blocks from ``intraclass_block_config``
# and upsamples its four levels by ``scale_factor_list``, both None in the config class (every released checkpoint
# sets them): the released values, each conv [kernel, stride, padding] keeping the size so the branches add up.
_RATIOS = (("longratio", 7), ("midratio", 5), ("shortratio", 3))
_INTRACLASS = {
    "reduce_channel": [1, 1, 0], "return_channel": [1, 1, 0],
    **{f"vertical_long_to_small_conv_{r}": [[k, 1], [1, 1], [k // 2, 0]] for r, k in _RATIOS},
    **{f"horizontal_small_to_long_conv_{r}": [[1, k], [1, 1], [0, k // 2]] for r, k in _RATIOS},
    **{f"symmetric_conv_long_{r}": [[k, k], [1, 1], [k // 2, k // 2]] for r, k in _RATIOS},
}
_LARGE_KERNEL_NECK = {"intraclass_block_config": _INTRACLASS, "scale_factor_list": [1, 2, 4, 8],
                      "neck_out_channels": 64}  # the neck's 256 is a width the shrinking does not know

# A DPT-style neck reassembles four of the ViT backbone's layers (6, 12, 18 and 24 by default); the cut backbone has
# four layers, so the four it has (the generic repair drops the stale choice and leaves one feature map)
_FOUR_LAYERS = {"backbone_config.out_indices": [1, 2, 3, 4],
                "backbone_config.out_features": ["stage1", "stage2", "stage3", "stage4"]}


def _resnet_instead_of_timm(*stages: str) -> dict[str, Any]:
    """transformers' own ResNet as the DETR line's backbone, 16 to 64 wide, one basic block a stage.

    Their configs default to a timm ResNet-50 (the package timm is not installed here); the class takes any
    transformers backbone configuration instead (what ``use_timm_backbone=False`` selects), and the backbone only
    hands the feature maps ``stages`` to the projection and the transformer, whose caps and gates it leaves as
    they are. The DETR models read the last map; Deformable DETR reads three scales (its ``num_feature_levels``).
    """
    return {"backbone_config": {"model_type": "resnet", "embedding_size": 16, "hidden_sizes": [16, 32, 64, 64],
                                "depths": [1, 1, 1, 1], "layer_type": "basic", "out_features": list(stages)}}


OVERRIDES: dict[str, dict[str, Any]] = {
    "rt_detr": _rt_detr("resnet"),
    "rt_detr_v2": _rt_detr("resnet"),
    "d_fine": _rt_detr("hgnet"),
    "deimv2": _rt_detr("hgnet"),
    "pp_doclayout_v2": _rt_detr("hgnet"),
    # its mask branch reads the backbone's first stage, x4_feat_dim wide: the thin backbone's 32
    "pp_doclayout_v3": _rt_detr("hgnet", x4_feat_dim=32),
    "pp_doclayout_v4": _rt_detr("hgnet"),
    "pp_ocrv5_server_det": {**_LARGE_KERNEL_NECK, **_hgnet_backbone()},
    "pp_ocrv6_medium_det": {**_LARGE_KERNEL_NECK, **_lcnet_v4_detector()},
    # its neck reads the backbone's four stages as they come, layer_list_out_channels wide
    "pp_ocrv6_small_det": {**_lcnet_v4_detector(), "layer_list_out_channels": [16, 32, 64, 64]},
    # the table-structure head decodes up to max_text_length + 1 steps one by one (501 by default; random weights
    # rarely emit the end token): 8 steps run every op of a step
    **dict.fromkeys(("slanet", "slanext"), {"max_text_length": 8}),
    # the neck's and the metric head's widths are a list and names the shrinking does not know (20 M parameters)
    "zoedepth": {**_FOUR_LAYERS, "neck_hidden_sizes": [16, 32, 64, 64], "fusion_hidden_size": 64,
                 "bottleneck_features": 64, "bin_embedding_dim": 32},
    # its neck's widths are a list and two names the shrinking does not know (24 M parameters at 128..1024 and 256)
    "chmv2": {**_FOUR_LAYERS, "post_process_channels": [16, 32, 64, 64], "fusion_hidden_size": 64,
              "head_hidden_size": 32},
    # the shrinking leaves a 2 × 2 grid of patches: Swin2SR pads an image to whole windows (8 pixels) by reflection,
    # which needs the image wider than the padding; 16 pixels keep two windows a side, so the shifted windows run
    "swin2sr": {"image_size": 16},
    # Swin V2 halves the grid at each of its three patch mergings: 32 pixels in patches of 4 leave 8, 4, 2, 1 (the
    # shrunk 8 pixels reach a grid of 0, whose relative-position table is an empty range)
    "swinv2": {"image_size": 32},
    # its keypoint detector keeps every point over its threshold (max_keypoints -1); in bf16 the random detector's
    # scores pass it at nearly every pixel (3600 a 64-pixel image, against about 70 in fp32), and the matcher's
    # attention over them costs minutes: the 64 best of each image
    "lightglue": {"keypoint_detector_config.max_keypoints": 64},
    **dict.fromkeys(("detr", "conditional_detr", "table-transformer"), _resnet_instead_of_timm("stage4")),
    "deformable_detr": _resnet_instead_of_timm("stage2", "stage3", "stage4"),
    # built the same way, DAB-DETR then meets a refusal of its own: with no query patterns (its default) its decoder
    # starts from float32 zeros whatever the model's dtype, which its bf16 layers refuse. Query patterns would make
    # it run, but they change the queries the audit measures, so the row keeps that reason
    "dab-detr": _resnet_instead_of_timm("stage4"),
    # its per-layer key/value heads are a list the shrinking cuts to one full-attention layer (16 heads) and one
    # grouped layer (8) while the query heads shrink to 2: the same two kinds, 2 and 1
    "sapiens2": {"num_key_value_heads_per_layer": [2, 1]},
}
INPUTS: dict[str, Callable] = {}


def _image(name: str, size: int) -> Callable:
    """A feed of one random RGB image of ``size`` × ``size`` per batch row, under the keyword ``name``."""

    def feed(cls, config, ids, g) -> dict:
        import torch

        return {name: torch.randn(ids.shape[0], 3, size, size, generator=g)}

    return feed


def _sla_head(cls, config, ids, g) -> dict:
    """The table-structure head's input: a backbone's flattened feature map, 16 positions of
    ``post_conv_out_channels`` (the class audited is the head, which holds the attention's tanh)."""
    import torch

    return {"hidden_states": torch.randn(ids.shape[0], 16, config.post_conv_out_channels, generator=g)}


def _image_pair(cls, config, ids, g) -> dict:
    """A keypoint matcher's input: two random RGB images of 64 × 64 per batch row, (batch, 2, 3, 64, 64) (its
    keypoint detector downsamples by 8, so 64 pixels leave an 8 × 8 grid of candidate keypoints)."""
    import torch

    return {"pixel_values": torch.randn(ids.shape[0], 2, 3, 64, 64, generator=g)}


INPUTS.update({
    # the mobile text detector's bare model reads its image as ``hidden_states`` (its head class as
    # ``pixel_values``); 64 pixels leave its neck's four levels (1/4 to 1/32) 16 to 2 pixels a side
    "pp_ocrv5_mobile_det": _image("hidden_states", 64),
    **dict.fromkeys(("slanet", "slanext"), _sla_head),
    "lightglue": _image_pair,
})
