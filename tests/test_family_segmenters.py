"""The segmenters family: types fed features, a time series or mel frames audit; the video trackers are refused
with the reason transformers gives them (an inference-only forward)."""

import inspect
from types import SimpleNamespace

import pytest

pytest.importorskip("transformers")

from softcapgrad.models import census  # noqa: E402
from softcapgrad.models.families import segmenters  # noqa: E402


def _row(model_type: str):
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    # one candidate made directly: the static scan of every folder (seconds) decides nothing a row reports
    return census.census_row(census.Candidate(model_type, model_type_to_module_name(model_type), ()))


def test_timesfm_fed_a_series_audits_its_one_softplus_gate():
    r = _row("timesfm")
    assert r.status == "audited", r.reason
    assert r.implementations == {"eager": "ran", "sdpa": "ran"}
    # TimesFM scales its queries per head dimension by a softplus of a learned vector: one site, in attention
    assert [(g["module"], g["fn"], g["shape"]) for g in r.gates] == [("layers.*.self_attn", "softplus", "(head_dim)")]


def test_sam3_mask_decoder_fed_features_runs_under_both_implementations():
    r = _row("sam3_mask_decoder")
    assert r.status == "audited", r.reason
    assert r.model_class == "Sam3MaskDecoder"
    assert r.implementations == {"eager": "ran", "sdpa": "ran"}
    assert r.changes == []  # the shrunk defaults build it: only its inputs were missing


def test_the_vocoder_width_override_is_listed_on_its_row():
    r = _row("speecht5_hifigan")
    assert r.status == "audited", r.reason
    assert r.changes == ["upsample_initial_channel = 64 (override)"]
    assert r.implementations["eager"] == "ran"


@pytest.mark.parametrize("model_type", ["edgetam_video", "sam2_video", "sam3_tracker_video", "sam3_video"])
def test_video_trackers_are_refused_for_their_inference_only_forward(model_type):
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    forward = getattr(transformers, MODEL_MAPPING_NAMES[model_type]).forward
    # the fact the refusal states: were the decorator gone, the refusal would be wrong and this fails
    assert "@torch.inference_mode()" in inspect.getsource(forward)
    r = _row(model_type)
    assert r.status == "cannot build" and census.refusal_kind(r) == "an inference-only forward (no backward can run)", r.reason
    assert "torch.inference_mode()" in r.reason


def test_features_are_as_wide_as_the_field_names_and_masks_are_ones():
    import torch

    feed = segmenters.features("inputs_embeds", "hidden_size", "attention_mask")
    kwargs = feed(None, SimpleNamespace(hidden_size=48), torch.zeros(3, 7, dtype=torch.long), torch.Generator())
    assert kwargs["inputs_embeds"].shape == (3, 7, 48)
    assert kwargs["attention_mask"].shape == (3, 7) and bool(kwargs["attention_mask"].all())
