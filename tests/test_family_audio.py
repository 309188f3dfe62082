"""The audio family: types that needed an input of their own kind or a repaired width now audit, and what they
report is what their code holds (VITS's flow gates, CLAP's sigmoid only where its crop fusion is switched on)."""

import pytest

pytest.importorskip("transformers")

from softcapgrad.models import census  # noqa: E402

TYPES = ["vits", "clap_audio_model", "qwen2_5_omni_audio_encoder"]


@pytest.fixture(scope="module")
def by():
    return {r.model_type: r for r in census.census(TYPES).rows}


def test_every_row_audited_and_eager_ran(by):
    assert {m: r.status for m, r in by.items()} == dict.fromkeys(TYPES, "audited"), {m: r.reason for m, r in by.items()}
    assert {m: r.implementations["eager"] for m, r in by.items()} == dict.fromkeys(TYPES, "ran")


def test_vits_runs_its_synthesis_without_labels_and_finds_its_flow_gates(by):
    # VITS refuses labels (no training path) but its forward runs in training mode; its duration flow squashes with a
    # softplus and its WaveNet couplings multiply tanh by sigmoid: two gate sites, no cap
    row = by["vits"]
    assert sorted(g["fn"] for g in row.gates) == ["sigmoid", "softplus"]
    wavenet = next(g for g in row.gates if g["fn"] == "sigmoid")
    assert wavenet["module"].endswith("wavenet") and "scales tanh" in wavenet["role"]
    assert row.caps == []


def test_clap_audio_tower_takes_a_four_dimensional_spectrogram_and_its_patch_width_meets_hidden_size(by):
    row = by["clap_audio_model"]
    assert "patch_embeds_hidden_size = 8 (override)" in row.changes  # 8 · 2^3 = the shrunk hidden_size 64
    assert row.gates == []  # its one sigmoid is the crop fusion's, off at the class's defaults (enable_fusion=False)


def test_qwen_omni_audio_encoder_runs_under_both_implementations(by):
    assert by["qwen2_5_omni_audio_encoder"].implementations == {"eager": "ran", "sdpa": "ran"}


def test_a_model_without_a_vocabulary_draws_ids_below_one_not_below_its_pad_id_zero():
    # a codec has no vocabulary (1: the ids only shape the batch); its semantic encoder's pad id 0 is no bound
    import transformers

    from softcapgrad.models import tiny
    from softcapgrad.models.inputs import text_tokens, vocabulary

    config = transformers.CONFIG_MAPPING["neucodec"](**tiny.tiny_dict("neucodec"))
    assert vocabulary(config) == 1
    assert config.semantic_model_config.pad_token_id == 0
    assert text_tokens(config) == 1
