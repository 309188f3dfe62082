"""Engines live from their own environments (the ones that install fastest: about 2 minutes each on 2 cores, once;
reused after from the user's cache): what each does with Gemma 2's caps, measured.

The three environments are built side by side once collection is done (conftest: the engine_environments mark),
and Gemma 2 is measured once for every engine the selected tests name: one reference, their routes two at a time."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from softcapgrad.engines.forward import catalog, parity_run  # noqa: E402
from softcapgrad.engines.forward import reference as ref  # noqa: E402
from softcapgrad.models import audit  # noqa: E402

TOKENS = 12  # longer than the tiny config's sliding window (reference.WINDOW)
OLDER = ("transformers-4", "transformers-5.0")


def _run(names, engine_environment, model_type: str):
    engines = [catalog.engines()[n] for n in names]
    states = {e.environment: engine_environment(e.environment) for e in engines}  # built on the first run, reused
    src = audit.source(None, model_type, ref.tiny_sets(model_type))
    return parity_run.measure_all([(model_type, src, None)], engines, states, TOKENS, 0, 600, jobs=2)[0]


@pytest.fixture(scope="module")
def gemma2(request, engine_environment):
    """Gemma 2 through every engine a selected test of this module names: engine -> (rows, runs)."""
    names = list(dict.fromkeys(n for item in request.session.items if "gemma2" in item.fixturenames
                               and item.get_closest_marker("skip") is None  # left out: its environment is not built
                               for mark in item.iter_markers("engine_environments") for n in mark.args))
    result = _run(names, engine_environment, "gemma2")
    out = {}
    for name in names:
        infos = [e for e in result.engines if e["engine"] == name]
        assert infos and all(info["reason"] is None for info in infos), infos
        rows = {(r["route"], r["cap"]): r for r in result.rows if r["engine"] == name}
        out[name] = rows, {e["route"]: e for e in infos}
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.engine_environments(n)) for n in OLDER])
def test_older_transformers_drop_the_attention_cap_by_default_and_eager_keeps_it(gemma2, name):
    """4.57.6 and 5.0.0 pick sdpa for Gemma 2 when the user passes nothing; sdpa takes no soft-cap."""
    rows, runs = gemma2[name]
    assert "attention sdpa" in runs["default"]["did"] and "attention eager" in runs["eager"]["did"]
    assert rows["default", "attention"]["verdict"] == "ignored"
    assert rows["eager", "attention"]["verdict"] == "applied"
    assert rows["default", "final"]["verdict"] == rows["eager", "final"]["verdict"] == "applied"
    assert rows["eager", "final"]["max_logit"] <= 30.0  # a capped model's logits never exceed c


@pytest.mark.slow
@pytest.mark.engine_environments("transformers-4")
def test_a_folder_an_older_transformers_cannot_fully_load_is_its_reason(engine_environment):
    """4.57.6's Gemma 3n builds key and value projections in its KV-sharing layers that 5.x neither builds nor
    saves: it would run them on random weights."""
    result = _run(["transformers-4"], engine_environment, "gemma3n_text")
    assert {r["verdict"] for r in result.rows if r["cap"] == "final"} == {"could not run"}
    assert all("finds no weights in the folder for" in e["reason"] for e in result.engines)


@pytest.mark.slow
@pytest.mark.engine_environments("kerashub")
def test_keras_hub_from_its_own_environment(gemma2):
    rows, runs = gemma2["kerashub"]
    assert {k: r["verdict"] for k, r in rows.items()} == {(route, cap): "applied" for cap in ("attention", "final")
                                                           for route in ("default", "score", "generate")}


@pytest.mark.slow
@pytest.mark.engine_environments("kerashub")
def test_keras_hub_runs_what_its_loader_claims_and_names_its_registry_for_the_rest(engine_environment):
    """No list of ours decides which types Keras Hub takes: its Hugging Face loader's registry does. It has a
    converter for gemma4_text (whose backbone also takes the positions) and applies its final cap; for
    gemma3n_text it has none, and the row quotes the loader."""
    result = _run(["kerashub"], engine_environment, "gemma4_text")
    rows = {r["cap"]: r for r in result.rows if r["route"] == "default"}
    assert rows["final"]["verdict"] == "applied", rows
    others = [r for r in result.rows if r["route"] != "default"]  # score and generate read GemmaCausalLM alone
    assert others and all(r["verdict"] == "no such architecture" and "GemmaCausalLM" in r["hint"] for r in others)
    refused = _run(["kerashub"], engine_environment, "gemma3n_text")
    assert {r["verdict"] for r in refused.rows} == {"no such architecture"}
    assert all("TransformersPresetLoader" in r["hint"] for r in refused.rows)
