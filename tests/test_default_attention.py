"""results/default-attention.{json,md}: consistent with itself and with the code that wrote it, and one release (the
main environment's own transformers) measured again here."""

import json
from importlib import metadata
from pathlib import Path

import pytest

from softcapgrad.engines.releases import ranges, releases

RESULTS = Path(__file__).resolve().parents[1] / "results"


@pytest.fixture(scope="module")
def data() -> dict:
    return json.loads((RESULTS / "default-attention.json").read_text(encoding="utf-8"))


def test_the_ranges_answer_and_markdown_follow_from_the_rows(data):
    """Everything but the rows is recomputed from the rows: the ranges, boundaries, dependents, answer and page."""
    rows = {r["release"]: r for r in data["rows"]}
    again = releases.summary(data["releases"], rows, data["method"] == "every release")
    assert {k: v for k, v in data.items() if k != "answer"} == again
    assert data["answer"] == list(releases.answer(again))
    assert (RESULTS / "default-attention.md").read_text(encoding="utf-8") == releases.markdown(
        again, tuple(data["answer"]))


def test_the_walk_covers_the_pins_and_measures_each_boundary_on_both_sides(data):
    assert data["releases"] == list(releases.RELEASES)
    run = [r["release"] for r in data["rows"]]
    assert set(releases.anchors(data["releases"])) <= set(run)
    assert run == [v for v in data["releases"] if v in run]  # in release order
    order = {v: i for i, v in enumerate(data["releases"])}
    for a, b in data["boundaries"]:
        assert a in run and b in run and order[b] == order[a] + 1
    assert sum(r["releases"] for r in data["ranges"]) == len(data["releases"])
    assert ranges.UNMEASURED not in [r["verdict"] for r in data["ranges"]]


def test_each_verdict_is_the_nearer_reference_by_more_than_its_tolerance(data):
    """ignored: within tolerance of the attention-off reference and far from the capped one; applied: the reverse."""
    for r in data["rows"]:
        for key in ("", "eager_"):
            verdict = r.get(f"{key}verdict")
            near, far = {"ignored": ("to_attention_off", "to_capped"),
                         "applied": ("to_capped", "to_attention_off")}.get(verdict, (None, None))
            if near:
                assert r[f"{key}{near}"] <= r[f"{key}tolerance"] < r[f"{key}{far}"], r
        if r["verdict"] in ("ignored", "applied"):
            assert r["eager_verdict"] == "applied", r  # eager keeps the cap in every release run
            assert r["versions"]["transformers"] == r["release"], r  # the release, not the main environment's


def test_the_main_environments_release_measured_here_agrees(data, tmp_path):
    """The one live run: the main environment's transformers at its default, against its committed row."""
    version = metadata.version("transformers")
    committed = next((r for r in data["rows"] if r["release"] == version), None)
    if committed is None:
        pytest.skip(f"transformers {version} is not among the releases the walk ran")
    from softcapgrad.engines.environments import environments
    from softcapgrad.engines.forward import modeltypes, parity, reference as ref
    from softcapgrad.models import audit

    src = audit.source(None, modeltypes.model_type("gemma2"), ref.tiny_sets("gemma2"))
    reference = parity.prepare(src, 16, 0, tmp_path)
    row = releases.one(version, reference, tmp_path, 300.0, None, lambda line: None, False,
                       environments.main_state())
    assert releases.outcome(row) == releases.outcome(committed)
    assert row["versions"]["transformers"] == version
