"""softcapgrad incidents: the catalogue is consistent, caught and missed are judged as the catalogue says on planted
verdicts, the Markdown follows from the rows, bad input is one line; the live replay of a transformers release pair
runs only in make test-engines (it builds two light release environments)."""

import json
import re
import shlex
import sys
from pathlib import Path

import pytest
import typer

from softcapgrad.cli import app as cli_app
from softcapgrad.engines.incidents import catalog, judge, replay
from softcapgrad.engines.incidents.catalog import INCIDENTS, Incident, Judge, Release

RESULTS = Path(__file__).resolve().parents[1] / "results"
VERSION = re.compile(r"[0-9]+(\.[0-9]+)+")


def _commands(incident: Incident) -> list[str]:
    """The softcapgrad commands an incident names (a GPU recipe may start a server first)."""
    parts = [incident.command] + [catalog.side_command(incident, r) for r in (incident.before, incident.after) if r]
    return sorted({p.strip() for c in parts for p in c.split(", then ") if p.strip().startswith("softcapgrad ")})


def test_the_catalogue_is_consistent():
    ids = [i.id for i in INCIDENTS]
    assert len(ids) == len(set(ids)) >= 8
    for i in INCIDENTS:
        assert i.reach in catalog.REACH and i.replay in catalog.REPLAY, i.id
        assert i.library and i.broke, i.id
        if i.reach in ("cpu", "no fix"):  # reachable: a release to replay, a command, a row that decides
            assert i.before is not None and i.replay and i.judge is not None and _commands(i), i.id
            assert set(i.judge.before).isdisjoint(i.judge.after), i.id
        else:
            assert i.why and not i.replay and i.judge is None, i.id  # the reason it is not replayed
        if i.reach == "cpu":
            assert i.after is not None, i.id  # a release with the fix to replay
        if i.reach == "gpu":
            assert _commands(i), i.id  # the prepared check
        if i.reach == "no fix":
            assert i.after is None or i.after.route, i.id  # none on the index, or the same release used otherwise
        if i.replay == "results":
            assert i.judge.results in ("parity.json", "train-parity.json"), i.id


def test_the_releases_are_well_formed():
    from packaging.version import Version

    for i in INCIDENTS:
        for r in (i.before, i.after):
            if r is not None:
                assert VERSION.fullmatch(r.version) and re.fullmatch(r"[a-z0-9-]+", r.package), (i.id, r)
        if i.before and i.after and not i.after.route:
            assert i.before.package == i.after.package and Version(i.before.version) < Version(i.after.version)


@pytest.mark.parametrize("command", sorted({c for i in INCIDENTS for c in _commands(i)}))
def test_every_command_parses(command):
    """Each command's options parse as its command's parser reads them (callbacks run, nothing computed)."""
    args = shlex.split(command.replace(catalog.PYTHON, sys.executable))[1:]
    group = typer.main.get_command(cli_app._for(args))
    name, cmd, rest = group.resolve_command(group.make_context("softcapgrad", list(args), resilient_parsing=True),
                                            list(args))
    cmd.make_context(name, rest)  # raises on an unknown option or a value its callback refuses


def _side(verdict: str, state: str = "ran", release: str = "x 1.0") -> dict:
    return {"release": release, "state": state, "verdict": verdict, "detail": "", "command": ""}


PLANTED = Incident("planted", "a thread", "lib", "the cap dropped", Release("lib", "1.0"), Release("lib", "1.1"),
                   "cpu", "release", "softcapgrad parity-releases --release 1.0", Judge("e", "default", "gemma2",
                                                                                          "attention", ("ignored",)))


@pytest.mark.parametrize("before, after, outcome, says", [
    (_side("ignored"), _side("applied"), "caught", ""),
    (_side("applied"), _side("applied"), "missed", "before (x 1.0) the tool says 'applied'"),
    (_side("ignored"), _side("ignored"), "missed", "after (x 1.0) the tool says 'ignored'"),
    (_side("", "not built"), _side("applied"), "not replayed", "before (x 1.0): not built"),
    (_side("ignored"), _side("", "could not run"), "not replayed", "after (x 1.0): could not run"),
    (_side("ignored", "from results"), None, "caught", "before side only"),
])
def test_caught_and_missed_on_planted_verdicts(before, after, outcome, says):
    got, why = judge.judge(PLANTED, before, after)
    assert got == outcome and why.startswith(says), (got, why)


def test_reach_decides_before_any_verdict():
    far = Incident("far", "", "lib", "x", Release("lib", "1.0"), Release("lib", "1.1"), "out of reach", "", "", None,
                   "no route calls it")
    gpu = Incident("gpu", "", "lib", "x", None, None, "gpu", "", "softcapgrad knee --cap 30", None, "CUDA only")
    assert judge.judge(far, _side("ignored"), _side("applied")) == ("missed", "out of reach: no route calls it")
    assert judge.judge(gpu, None, None) == ("not checked here", "GPU only: CUDA only")


def test_the_answer_and_markdown_follow_from_the_rows():
    rows = [judge.row(PLANTED, _side("ignored"), _side("applied")),
            judge.row(PLANTED, _side("applied"), _side("applied"))]
    said = judge.answer(rows)
    assert said[0].startswith("Of 2 incidents, the tool caught 1 (planted) and missed 1")
    assert said[-1] == "Missed where the tool ran: planted (the rows say why)."
    text = judge.markdown(rows, said)
    table = [line for line in text.splitlines() if line.startswith("| planted |")]
    assert table == ["| planted | a thread | x 1.0 | ignored | x 1.0 | applied | caught |",
                     "| planted | a thread | x 1.0 | applied | x 1.0 | applied | missed |"]
    odd = judge.markdown([judge.row(PLANTED, _side("a|b"), None)], ()).splitlines()
    assert "| planted | a thread | x 1.0 | a\\|b | none on the index |  | missed |" in odd  # a cell's | escaped


def test_the_committed_results_follow_from_their_rows():
    data = json.loads((RESULTS / "incidents.json").read_text(encoding="utf-8"))
    assert tuple(data["answer"]) == judge.answer(data["incidents"])
    assert (RESULTS / "incidents.md").read_text(encoding="utf-8") == judge.markdown(data["incidents"],
                                                                                    tuple(data["answer"]))
    known = catalog.by_id()
    for r in data["incidents"]:  # each outcome is the judging of its sides as the catalogue says today
        assert (r["outcome"], r["why"]) == judge.judge(known[r["id"]], r["before"], r["after"]), r["id"]


def test_results_replays_read_the_committed_rows():
    rows = {r["id"]: r for r in replay.replay([i for i in INCIDENTS if i.replay == "results"], False)}
    assert rows["cce-missing-softcap"]["outcome"] == "caught"
    gelu = rows["executorch-xnnpack-erf-gelu"]
    assert gelu["outcome"] == "missed" and gelu["before"]["verdict"] == "applied"  # the note names it, not the verdict
    assert "erf" in gelu["before"]["detail"]


def test_a_missing_results_row_is_not_replayed_not_judged(tmp_path):
    (tmp_path / "parity.json").write_text(json.dumps({"rows": []}), encoding="utf-8")
    gelu = catalog.by_id()["executorch-xnnpack-erf-gelu"]
    row = replay.replay([gelu], False, tmp_path)[0]
    assert row["outcome"] == "not replayed" and "holds no row" in row["why"]


def test_a_release_side_without_install_says_not_built(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # an empty cache: no light environment is there
    row = replay.replay([catalog.by_id()["transformers-sdpa-2026"]], False)[0]
    assert row["before"]["state"] == row["after"]["state"] == "not built"
    assert row["before"]["detail"] == "softcapgrad incidents --install --only transformers-sdpa-2026"
    assert row["outcome"] == "not replayed" and not list(tmp_path.iterdir())  # nothing built


def test_an_unknown_incident_is_one_line_and_exit_2(cli, tmp_path):
    code, _, out, err = cli("incidents", "--only", "no-such-incident", "--out", str(tmp_path))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "no such incident" in err and "transformers-sdpa-2024" in err
    assert not list(tmp_path.iterdir())


@pytest.mark.downloads
@pytest.mark.engine_environments("main")
def test_the_2026_sdpa_incident_replays_as_committed():
    """Live: both light release environments built (or reused) and run; the verdicts the committed results hold."""
    row = replay.replay([catalog.by_id()["transformers-sdpa-2026"]], True)[0]
    committed = next(r for r in json.loads((RESULTS / "incidents.json").read_text(encoding="utf-8"))["incidents"]
                     if r["id"] == "transformers-sdpa-2026")
    assert row["outcome"] == "caught"
    assert [row[s]["verdict"] for s in ("before", "after")] == [committed[s]["verdict"] for s in ("before", "after")]


def test_a_light_package_side_is_not_built_without_install(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # an empty cache: no light environment is there
    row = replay.replay([catalog.by_id()["unsloth-zoo-rl-z-tanh"]], False)[0]
    assert row["before"]["state"] == row["after"]["state"] == "not built"
    assert row["before"]["detail"] == "softcapgrad incidents --install --only unsloth-zoo-rl-z-tanh"
    assert row["outcome"] == "not replayed" and not list(tmp_path.iterdir())


@pytest.mark.downloads
@pytest.mark.engine_environments("main")
def test_the_unsloth_zoo_rl_incident_replays_as_committed():
    """Live: unsloth-zoo 2026.4.6 and 2026.4.7 each alone in a light environment, the RL route run with each: the
    wrong form before, applied after, as the committed results hold them."""
    row = replay.replay([catalog.by_id()["unsloth-zoo-rl-z-tanh"]], True)[0]
    committed = next(r for r in json.loads((RESULTS / "incidents.json").read_text(encoding="utf-8"))["incidents"]
                     if r["id"] == "unsloth-zoo-rl-z-tanh")
    assert row["outcome"] == "caught" and row["before"]["verdict"] == "wrong form"
    assert [row[s]["verdict"] for s in ("before", "after")] == [committed[s]["verdict"] for s in ("before", "after")]
