"""A model that makes float32 tensors of its own runs in float32 only: the census runs it so and says so, decided by
the tensors the refusing module was given (the same on every CPU), never by the kernel library's wording."""

import pytest

torch = pytest.importorskip("torch")

from softcapgrad.models.mixed import Mix, refused_mix  # noqa: E402


class _OwnFloat32(torch.nn.Module):
    """Makes a float32 tensor itself and hands it to a linear layer of the weights' format."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        self.register_buffer("filter", torch.ones(4))

    def forward(self, x):
        return self.proj(x.float() * self.filter.float())


class _WrongShape(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.proj(x[..., :3])


def test_a_float32_tensor_of_the_models_own_is_named_by_the_module_it_met():
    model = _OwnFloat32().to(torch.bfloat16)
    found = refused_mix(model, lambda m: m(torch.ones(2, 4, dtype=torch.bfloat16)))
    assert found == Mix("proj", "Linear", "float32", "bfloat16")
    assert refused_mix(_OwnFloat32(), lambda m: m(torch.ones(2, 4))) is None  # float32 weights: it runs


def test_another_refusal_is_not_a_mix_of_formats():
    model = _WrongShape().to(torch.bfloat16)
    assert refused_mix(model, lambda m: m(torch.ones(2, 4, dtype=torch.bfloat16))) is None


def test_a_float32_only_model_is_audited_in_float32_and_the_row_says_so():
    """qwen2_5_omni_bigvgan's upsampling filter is float32 whatever the weights: its convolution refuses bfloat16 with a
    message that oneDNN words one way on a CPU with bfloat16 instructions and ATen another elsewhere; the row names the
    module, the same everywhere."""
    pytest.importorskip("transformers")
    from softcapgrad.models import audit, census
    from softcapgrad.models.census import Candidate

    row = census.census_row(Candidate("qwen2_5_omni_bigvgan", "qwen2_5_omni", ("tanh",)))
    assert row.status == "audited" and row.implementations["eager"] == "ran"
    assert [c for c in row.changes if c.startswith("run in float32")] == [
        f"run in float32: {audit.MIXED_FORMATS} (first met in resblocks.*.activations.*.upsample, a "
        "Qwen2_5OmniUpSample1d given float32 beside bfloat16)"]


def test_weights_the_class_keeps_in_float32_stay_float32_as_loading_keeps_them():
    """``_from_config`` builds every weight in bf16; ``from_pretrained`` keeps ``_keep_in_fp32_modules_strict`` in
    float32 (Dots1's router gate): the audit builds the model as it is loaded, and the router's sigmoid runs in
    float32 there."""
    pytest.importorskip("transformers")
    from softcapgrad.models import audit, runnable

    src = audit.source(None, "dots1", [])
    cls = runnable.model_class(src.config)
    model = runnable.build(cls, src.config, "eager", torch.bfloat16)
    kept = {n for n, p in model.named_parameters() if p.dtype == torch.float32}
    assert kept and all(n.endswith("mlp.gate.weight") for n in kept)
    assert {p.dtype for n, p in model.named_parameters() if n not in kept} == {torch.bfloat16}
    assert runnable.keep_float32(model, torch.bfloat16) == []  # already as the plan says
    assert runnable.keep_float32(runnable.build(cls, src.config, "eager", torch.float32), torch.float32) == []
