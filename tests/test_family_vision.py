"""Vision towers the census now builds and feeds: the input a tower reads when it keeps the library's default
``main_input_name``, and three rows (a generic feed, a family feed, family overrides) audited with the sites
their sources hold."""

import pytest

pytest.importorskip("transformers")

from softcapgrad.models import census, runnable  # noqa: E402


def _row(model_type: str):
    found = {c.model_type: c for c in census.candidates()}
    return census.census_row(found[model_type])


def test_a_tower_that_keeps_the_default_input_name_is_fed_the_pixels_its_forward_takes():
    import transformers

    # these keep main_input_name = "input_ids", which their forward does not take; pixel_values comes first
    for name in ("GraniteDoclingVisionModel", "Llama4VisionModel", "MllamaVisionModel"):
        assert runnable.needs(getattr(transformers, name)) == "pixel_values", name
    # a name the forward takes stays; a first input the rules cannot feed (a Qwen-like tower's hidden_states) is
    # not taken for one
    assert runnable.needs(transformers.LlamaForCausalLM) == "input_ids"
    assert runnable.needs(transformers.SamModel) == "pixel_values"
    assert runnable.needs(transformers.Qwen3_5VisionModel) == "input_ids"


def test_step3p5_vision_runs_on_the_generic_image_feed_and_finds_its_quick_gelu():
    r = _row("step3p5_vision")
    assert (r.status, r.reason) == ("audited", ""), r.reason
    assert r.implementations == {"eager": "ran", "sdpa": "ran"}
    assert r.changes == [] and r.caps == []
    (site,) = r.gates  # its MLP's activation, x·σ(αx), in each of the two kept layers
    assert (site["kind"], site["module"], site["count"]) == ("activation", "layers.*.mlp.activation_fn", 2)


def test_dots3_note_vision_runs_on_flat_patches_and_finds_its_expert_router():
    r = _row("dots3_note_vision_encoder")
    assert (r.status, r.reason) == ("audited", ""), r.reason
    assert r.implementations == {"eager": "ran", "sdpa": "ran"}
    (site,) = r.gates  # the sigmoid router of its two sparse layers, over 3 images × 4 × 4 patches = 48 tokens
    assert (site["kind"], site["module"], site["count"]) == ("gate", "blocks.*.mlp.gate", 2)
    assert site["shape"].startswith("(48,") and "router" in site["role"]


def test_sam_runs_with_its_derived_sizes_consistent_and_has_no_sigmoid_site():
    r = _row("sam")
    assert (r.status, r.reason) == ("audited", ""), r.reason
    assert r.implementations == {"eager": "ran", "sdpa": "ran"}
    assert "prompt_encoder_config.image_embedding_size = 2 (override)" in r.changes
    # its one sigmoid sits behind SamFeedForward's sigmoid_output, which SAM's IoU head leaves off (SAM 2 sets it)
    assert r.gates == [] and r.caps == []
