"""Multimodal model types the census builds with the family's overrides and inputs: three audited end to end (a
talker fed embeddings, a layout model fed boxes and a page, a vision encoder fed patches), and the vocabulary maps
the image-token models read, checked against the codebooks they were shrunk to."""

import pytest

pytest.importorskip("transformers")

from softcapgrad.models import census, runnable  # noqa: E402
from softcapgrad.models.families import multimodal  # noqa: E402

TYPES = ["qwen3_omni_moe_talker_text", "layoutlmv3", "siglip2_vision_model"]


@pytest.fixture(scope="module")
def rows():
    by = {c.model_type: c for c in census.candidates()}
    return {t: census.census_row(by[t]) for t in TYPES}


def test_each_type_audited_under_both_implementations(rows):
    reasons = {t: r.reason for t, r in rows.items()}
    assert {t: r.status for t, r in rows.items()} == dict.fromkeys(TYPES, "audited"), reasons
    assert {t: r.implementations for t, r in rows.items()} == dict.fromkeys(TYPES, {"eager": "ran", "sdpa": "ran"})


def test_the_talker_gates_its_shared_expert_with_one_sigmoid(rows):
    gates = [g for g in rows["qwen3_omni_moe_talker_text"].gates if g.get("kind", "gate") == "gate"]
    assert [(g["module"], g["fn"]) for g in gates] == [("layers.*.mlp", "sigmoid")]
    assert "shared_expert" in gates[0]["role"]
    assert rows["qwen3_omni_moe_talker_text"].changes == ["shared_expert_intermediate_size = 128 (override)"]


def test_the_vision_encoder_and_the_layout_model_have_no_cap_and_no_gate(rows):
    # their folders' only sigmoid or tanh sits outside the audited class (a docstring, a classification head)
    for t in ("layoutlmv3", "siglip2_vision_model"):
        assert (rows[t].caps, rows[t].gates) == ([], []), t


def test_layoutlmv3_width_splits_into_its_box_embeddings():
    import torch
    from softcapgrad.models import tiny

    config = tiny.tiny_config("layoutlmv3")
    assert 4 * config.coordinate_size + 2 * config.shape_size == config.hidden_size  # 4 × 8 + 2 × 8 = 48
    ids = torch.zeros(3, 7, dtype=torch.long)
    boxes = runnable.inputs(runnable.model_class(config), config, ids, 0).kwargs["bbox"]
    assert boxes.shape == (3, 7, 4)
    assert bool((boxes[..., 2:] >= boxes[..., :2]).all()) and 0 <= int(boxes.min()) and int(boxes.max()) <= 1000


def test_image_token_maps_cover_the_shrunk_codebooks():
    chameleon, emu3 = multimodal.OVERRIDES["chameleon"], multimodal.OVERRIDES["emu3"]
    vocab = 256
    for overrides, size_field, prefix in ((chameleon, "vq_config.num_embeddings", "IMGIMG"),
                                          (emu3, "vq_config.codebook_size", "<|visual token")):
        mapping = overrides["vocabulary_map"]
        codes = sorted(v for k, v in mapping.items() if k.startswith(prefix))
        assert len(codes) == overrides[size_field] == multimodal.CODES  # every code of the codebook has a token
        assert len(set(mapping.values())) == len(mapping) and max(mapping.values()) < vocab
        assert mapping["<image>"] not in codes
    # Chameleon's names spell the code in letters (A = 0), as its model decodes them back
    assert [multimodal._chameleon_name(c) for c in (0, 7, 12)] == ["IMGIMGAZ", "IMGIMGHZ", "IMGIMGBCZ"]
