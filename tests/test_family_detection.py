"""Detection family: three of its model types audit tiny, each through a different kind of repair, and what each
row records is what the repair leaves of the model (the overrides listed, the gates the model itself holds)."""

import functools

import pytest

pytest.importorskip("transformers")

from softcapgrad.models import census  # noqa: E402
from softcapgrad.models.families import detection  # noqa: E402


@functools.cache
def _candidates() -> dict:
    return {c.model_type: c for c in census.candidates()}  # a scan of every modeling source: once


def _row(model_type: str):
    return census.census_row(_candidates()[model_type])


def test_rt_detr_audits_with_its_decoder_fed_the_encoder_width():
    row = _row("rt_detr")
    assert row.status == "audited", row.reason
    assert row.implementations["eager"] == "ran"
    assert "decoder_in_channels = [64, 64, 64] (override)" in row.changes
    # the reference boxes' sigmoid, once where the encoder proposes them and once per decoder step: one box of 4
    # coordinates for each of the 16 queries the override keeps
    assert sorted(g["module"] for g in row.gates) == ["RTDetrModel", "decoder"]
    assert {g["shape"] for g in row.gates} == {"(batch, 16, 4)"}


def test_a_detr_model_audits_on_transformers_own_backbone_instead_of_timm():
    assert set(detection.OVERRIDES["conditional_detr"]) == {"backbone_config"}  # nothing of the DETR part itself
    row = _row("conditional_detr")
    assert row.status == "audited", row.reason
    assert row.model_class == "ConditionalDetrModel" and row.implementations["eager"] == "ran"
    assert any(c.startswith("backbone_config = {'model_type': 'resnet'") for c in row.changes)
    # the decoder's reference points: a sigmoid over 2 coordinates for each of its 300 queries
    assert [(g["module"], g["fn"], g["shape"]) for g in row.gates] == [("decoder", "sigmoid", "(batch, 300, 2)")]


def test_the_table_structure_head_audits_on_the_features_it_is_fed():
    row = _row("slanet")
    assert row.status == "audited", row.reason
    assert row.model_class == "SLANetSLAHead" and row.implementations["eager"] == "ran"
    assert row.changes == ["max_text_length = 8 (override)"]
