"""A model that makes float32 tensors of its own runs in float32 only: the census runs it so and says so."""

import pytest

from softcapgrad.models import audit


@pytest.mark.parametrize("message, mixed", [
    ("RuntimeError: expected scalar type BFloat16 but found Float", True),
    ("RuntimeError: Input type (float) and bias type (c10::BFloat16) should be the same", True),
    ("RuntimeError: mixed dtype (CPU): expect parameter to have scalar type of Float", True),
    ("RuntimeError: mat1 and mat2 shapes cannot be multiplied (21x60 and 64x16)", False),
    ("ValueError: The dimensions for the Mamba head state do not match", False),
])
def test_a_mix_of_formats_is_told_from_other_refusals(message, mixed):
    assert audit.mixes_formats(message) is mixed


def test_a_float32_only_model_is_audited_in_float32_and_the_row_says_so():
    pytest.importorskip("transformers")
    from softcapgrad.models import census
    from softcapgrad.models.census import Candidate

    row = census.census_row(Candidate("qwen2_5_omni_bigvgan", "qwen2_5_omni", ("tanh",)))
    assert row.status == "audited" and row.implementations["eager"] == "ran"
    assert any(c.startswith("run in float32") and "BFloat16" in c for c in row.changes)


def test_weights_the_class_keeps_in_float32_stay_float32_as_loading_keeps_them():
    """``_from_config`` builds every weight in bf16; ``from_pretrained`` keeps ``_keep_in_fp32_modules_strict`` in
    float32 (Dots1's router gate): the audit builds the model as it is loaded, and the router's sigmoid runs in
    float32 there."""
    pytest.importorskip("transformers")
    import torch

    from softcapgrad.models import audit, runnable

    src = audit.source(None, "dots1", [])
    cls = runnable.model_class(src.config)
    model = runnable.build(cls, src.config, "eager", torch.bfloat16)
    kept = {n for n, p in model.named_parameters() if p.dtype == torch.float32}
    assert kept and all(n.endswith("mlp.gate.weight") for n in kept)
    assert {p.dtype for n, p in model.named_parameters() if n not in kept} == {torch.bfloat16}
    assert runnable.keep_float32(model, torch.bfloat16) == []  # already as the plan says
    assert runnable.keep_float32(runnable.build(cls, src.config, "eager", torch.float32), torch.float32) == []
