"""Engines live from their own environments (the ones that install fastest: about 2 minutes each on 2 cores, once;
reused after from the user's cache): what each does with Gemma 2's caps, measured."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from softcapgrad.engines import catalog, environments, parity  # noqa: E402
from softcapgrad.engines import reference as ref  # noqa: E402
from softcapgrad.models import audit  # noqa: E402

TOKENS = 12  # longer than the tiny config's sliding window (reference.WINDOW)


def _measure(name: str, model_type: str = "gemma2") -> dict:
    engine = catalog.engines()[name]
    state = environments.ready(engine.environment, True)  # built on the first run, reused after
    src = audit.source(None, model_type, ref.tiny_sets(model_type))
    result = parity.measure(src, [engine], {engine.environment: state}, TOKENS, 0, 600, model_type)
    for info in result.engines:
        assert info["reason"] is None, info["reason"]
    return {(r["route"], r["cap"]): r for r in result.rows}, {e["route"]: e for e in result.engines}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["transformers-4", "transformers-5.0"])
def test_older_transformers_drop_the_attention_cap_by_default_and_eager_keeps_it(name):
    """4.57.6 and 5.0.0 pick sdpa for Gemma 2 when the user passes nothing; sdpa takes no soft-cap."""
    rows, runs = _measure(name)
    assert "attention sdpa" in runs["default"]["did"] and "attention eager" in runs["eager"]["did"]
    assert rows["default", "attention"]["verdict"] == "ignored"
    assert rows["eager", "attention"]["verdict"] == "applied"
    assert rows["default", "final"]["verdict"] == rows["eager", "final"]["verdict"] == "applied"
    assert rows["eager", "final"]["max_logit"] <= 30.0  # a capped model's logits never exceed c


@pytest.mark.slow
def test_a_folder_an_older_transformers_cannot_fully_load_is_its_reason():
    """4.57.6's Gemma 3n builds key and value projections in its KV-sharing layers that 5.x neither builds nor
    saves: it would run them on random weights."""
    engine = catalog.engines()["transformers-4"]
    state = environments.ready(engine.environment, True)
    src = audit.source(None, "gemma3n_text", ref.tiny_sets("gemma3n_text"))
    result = parity.measure(src, [engine], {engine.environment: state}, TOKENS, 0, 600, "gemma3n_text")
    assert {r["verdict"] for r in result.rows if r["cap"] == "final"} == {"could not run"}
    assert all("finds no weights in the folder for" in e["reason"] for e in result.engines)


@pytest.mark.slow
def test_keras_hub_from_its_own_environment():
    rows, runs = _measure("kerashub")
    assert {k: r["verdict"] for k, r in rows.items()} == {("default", "attention"): "applied",
                                                           ("default", "final"): "applied"}
