"""The Keras adapter's declared releases and routes: keras-nlp's own code (0.14.0 to 0.15.1) before Keras Hub
(0.16.1 to 0.32.0); an interpreter outside them is one line and exit 2 before anything is measured (a fake
interpreter that answers the probe with a version, no environment); score and generate are routes of the engine;
the live replay of keras-nlp 0.14.1 / 0.14.2 runs only in make test-engines (it builds two light environments)."""

import json
import runpy
import stat

import pytest
from typer.testing import CliRunner

from softcapgrad.cli.app import app
from softcapgrad.core.checks import InputError
from softcapgrad.engines.forward import catalog, interpreter
from softcapgrad.engines.incidents import catalog as incidents, replay

SPANS = "keras-nlp 0.14.0 to 0.15.1, then keras-hub 0.16.1 to 0.32.0"


@pytest.mark.parametrize("packages, runs", [
    ({"keras-nlp": "0.14.1", "keras": "3.15.1"}, "keras-nlp 0.14.1"),
    ({"keras_nlp": "0.15.1"}, "keras-nlp 0.15.1"),  # a distribution's name as its metadata spells it
    ({"keras-nlp": "0.17.0", "keras-hub": "0.17.0"}, "keras-hub 0.17.0"),  # keras-nlp from 0.16.1 re-exports Hub
    ({"keras-hub": "0.32.0"}, "keras-hub 0.32.0"),
])
def test_the_release_it_speaks_is_the_first_declared(packages, runs):
    assert interpreter.speaks("kerashub", "kerashub", packages, "--python p") == runs


@pytest.mark.parametrize("packages, has", [
    ({"keras-nlp": "0.12.1"}, "keras-nlp 0.12.1"),  # before Gemma 2
    ({"keras-hub": "0.33.0"}, "keras-hub 0.33.0"),  # after the last declared
    ({"keras": "3.15.1"}, "neither"),
])
def test_a_release_outside_the_range_is_named_with_it(packages, has):
    with pytest.raises(InputError) as err:
        interpreter.speaks("kerashub", "kerashub", packages, "--python p")
    assert str(err.value) == f"--python p: engine kerashub speaks {SPANS}; this interpreter has {has}"


def test_an_adapter_without_releases_speaks_what_it_finds():
    assert interpreter.speaks("transformers", "transformers", {"transformers": "0.0.1"}, "--python p") == ""


def test_the_adapter_picks_the_library_by_the_same_range(monkeypatch):
    """The adapter's own check (it runs without softcapgrad) agrees with the probe's on the declared edges."""
    monkeypatch.syspath_prepend(str(catalog.script("protocol").parent))  # adapter_protocol, as children see it
    adapter = runpy.run_path(str(catalog.script("kerashub")), run_name="adapter")
    declared = adapter["RELEASES"]
    assert declared == catalog._literal(catalog.script("kerashub"), "RELEASES")
    for version, inside in (("0.13.9", False), ("0.14.0", True), ("0.15.1", True), ("0.16.1", False)):
        assert adapter["speaks"]("keras-nlp", version) is inside, version
        said = interpreter.speaks("kerashub", "kerashub", {"keras-nlp": version}, "p") if inside else None
        assert said in (None, f"keras-nlp {version}")


def _fake_python(tmp_path, packages: dict):
    """An executable that answers the probe as an interpreter with these distributions would (nothing imported)."""
    answer = {"softcapgrad_probe": 1, "version": "3.11.7 (fake)", "executable": str(tmp_path / "python"),
              "modules": {m: f"/x/{m}/__init__.py" for m in interpreter.modules("kerashub")}, "packages": packages}
    path = tmp_path / "python"
    path.write_text(f"#!/bin/sh\necho '{json.dumps(answer)}'\n", encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_parity_refuses_a_release_outside_the_range_before_any_verdict(tmp_path):
    fake = _fake_python(tmp_path, {"keras-nlp": "0.12.1", "keras": "3.15.1", "jax": "0.10.2"})
    result = CliRunner().invoke(app, ["parity", "--engine", "kerashub", "--python", str(fake), "--model-type",
                                      "gemma2", "--out", "none"])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert SPANS in lines[0] and "keras-nlp 0.12.1" in lines[0]


def test_a_probe_without_either_library_names_both(tmp_path):
    fake = _fake_python(tmp_path, {"keras": "3.15.1"})
    text = fake.read_text(encoding="utf-8").replace('"/x/keras_nlp/__init__.py"', "null").replace(
        '"/x/keras_hub/__init__.py"', "null")
    fake.write_text(text, encoding="utf-8")
    with pytest.raises(InputError, match="no module keras_nlp or keras_hub"):
        interpreter.probe(fake, "kerashub", "kerashub")


def test_score_and_generate_are_routes_of_the_keras_engine():
    engine = catalog.engines()["kerashub"]
    assert [r.id for r in engine.routes] == ["default", "score", "generate"]
    assert list(catalog._literal_routes(catalog.script("kerashub"))) == ["default", "score", "generate"]
    assert all(r.precision == "fp32" for r in engine.routes)  # judged on the whole vocabulary, like default
    j = incidents.by_id()["kerasnlp-score-final"].judge
    assert (j.engine, j.route, j.cap) == ("kerashub", "score", "final")


@pytest.mark.slow
@pytest.mark.downloads
@pytest.mark.engine_environments("main")
def test_the_keras_nlp_score_incident_replays_as_committed():
    """Live: both light keras-nlp environments built (or reused) and run; the verdicts the committed results hold,
    and generation's logits capped on both sides."""
    row = replay.replay([incidents.by_id()["kerasnlp-score-final"]], True, timeout=900.0)[0]
    committed = next(r for r in json.loads((replay.RESULTS / "incidents.json").read_text(encoding="utf-8"))[
        "incidents"] if r["id"] == "kerasnlp-score-final")
    assert row["outcome"] == "caught", row["why"]
    assert [row[s]["verdict"] for s in ("before", "after")] == [committed[s]["verdict"] for s in ("before", "after")]
    for side in ("before", "after"):
        assert "route generate: applied" in row[side]["detail"], row[side]["detail"]
