"""Sizes, caps and nesting that cannot be built are refused in one line (exit 2) from the raw configuration,
before any configuration class sees them: never a build of minutes, never an internal error."""

import json

import pytest

transformers = pytest.importorskip("transformers")

from softcapgrad.models import audit, sizes, source, tiny  # noqa: E402

GIB = 1 << 30


@pytest.fixture(scope="module")
def gemma2():
    return audit.model_type_config("gemma2", {})


@pytest.fixture
def nothing_built(monkeypatch, gemma2):
    """The tiny base is given; from here on no Gemma2Config may be constructed and no model built."""
    monkeypatch.setattr(tiny, "tiny_config", lambda *a, **k: gemma2)
    monkeypatch.setattr(sizes, "available_bytes", lambda: 8 * GIB)  # the same verdict on any machine
    monkeypatch.setattr(type(gemma2), "__init__", lambda *a, **k: pytest.fail("built the configuration"))
    monkeypatch.setattr(audit, "build", lambda *a, **k: pytest.fail("built a model it should have refused"))


def _one_line(cli, *args) -> str:
    code, _, out, err = cli("audit-model", *args)
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1 and lines[0].startswith("softcapgrad: error:"), (code, err)
    return lines[0]


@pytest.mark.parametrize("setting", ["num_hidden_layers=10000000", "num_hidden_layers=1e7", "hidden_size=1000000",
                                     "num_attention_heads=1000000", "intermediate_size=1000000000",
                                     "vocab_size=100000000000", "num_hidden_layers=Infinity"])
def test_huge_sizes_refused_from_the_dictionary(cli, nothing_built, setting):
    assert "refused before building" in _one_line(cli, "--model-type", "gemma2", "--set", setting)


@pytest.mark.parametrize("cap", ["NaN", "Infinity", "-Infinity", "1e-45", "-30", "1e39"])
def test_caps_past_fp32_refused(cli, nothing_built, cap):
    line = _one_line(cli, "--model-type", "gemma2", "--set", f"final_logit_softcapping={cap}")
    assert "final_logit_softcapping" in line and "soft-cap" in line


def _directory(tmp_path, gemma2, **changes):
    d = {**gemma2.to_dict(), **changes}
    (tmp_path / "config.json").write_text(json.dumps(d))  # json writes NaN and Infinity as Python reads them
    return str(tmp_path)


@pytest.mark.parametrize("changes, needle", [
    ({"attn_logit_softcapping": float("nan")}, "attn_logit_softcapping"),
    ({"final_logit_softcapping": 1e-45}, "final_logit_softcapping"),
    ({"num_hidden_layers": 10_000_000}, "refused before building"),
    ({"num_attention_heads": 1_000_000}, "refused before building"),
])
def test_directory_values_refused_before_building(cli, nothing_built, tmp_path, gemma2, changes, needle):
    assert needle in _one_line(cli, _directory(tmp_path, gemma2, **changes))


def test_deeply_nested_config_one_line(cli, nothing_built, tmp_path):
    (tmp_path / "config.json").write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    assert "nested deeper" in _one_line(cli, str(tmp_path))
    deep = 0
    for _ in range(40):
        deep = [deep]
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma2", "x": deep}))
    assert "nested deeper" in _one_line(cli, str(tmp_path))


def test_deep_set_value_one_line(cli, nothing_built):
    line = _one_line(cli, "--model-type", "gemma2", "--set", "final_logit_softcapping=" + "[" * 50 + "]" * 50)
    assert "final_logit_softcapping" in line


def test_a_tiny_cap_answers_or_refuses_never_an_internal_error(cli):
    code, _, _, err = cli("audit-model", "--model-type", "gemma2", "--set", "final_logit_softcapping=1e-30",
                          "--attn", "eager")
    assert code in (0, 2) and "internal error" not in err, err


def test_estimate_of_the_dictionary_and_of_the_object_agree(gemma2):
    assert sizes.estimate_dict(gemma2.to_dict()) == tiny.parameters_estimate(gemma2)


def test_cap_names(gemma2):
    assert source.CAP_NAME.search("final_logit_softcapping") and source.CAP_NAME.search("attention_logit_cap")
    assert not source.CAP_NAME.search("capacity_factor") and not source.CAP_NAME.search("caption_len")
