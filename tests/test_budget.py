"""The experiment's budget: refused at once past it, an estimate on stderr before a long legal run."""

import time

import pytest

from softcapgrad.core.checks import InputError
from softcapgrad.experiments.design import BUDGET_STEPS, DESIGN, QUICK, STEP_SECONDS, all_steps, within_budget


def test_the_estimate_counts_every_step_of_the_design():
    # AdamW: 24 seeds × (150 phase-1 steps + 200 steps × (3 core arms × 6 depths + 2 side arms × 2 depths + 3 core
    # arms × 2 band depths)) = 138,000; the SGD pilot 2 seeds × (150 + 3 rates × 3 arms × 150) = 3,000; the SGD
    # setting 8 seeds × 2 depths × 3 arms × 150 = 7,200; the natural run 2,000
    assert all_steps(DESIGN) == 138_000 + 3_000 + 7_200 + 2_000
    steps, seconds = within_budget(DESIGN, "--seeds")
    assert steps == 150_200 and seconds == pytest.approx(150_200 * STEP_SECONDS)
    assert all_steps(QUICK) < all_steps(DESIGN)


def test_past_the_budget_is_refused_naming_it():
    big = DESIGN.with_(seeds=tuple(range(1000)))
    assert all_steps(big) > BUDGET_STEPS
    with pytest.raises(InputError, match=r"^--seeds: [\d,]+ training steps, about \d+ h here; the budget is "
                                         r"5,000,000 steps"):
        within_budget(big, "--seeds")


@pytest.mark.parametrize("args, named", [
    (("--seeds", "1000000000"), "--seeds 1000000000: must lie in 1..10,000"),  # once killed for memory after 35 s
    (("--steps", "1000000000000"), "--steps 1000000000000: must lie in 1..1,000,000"),  # once ran until killed
    (("--seeds", "10000"), "training steps, about"),  # each within its own bound, together past the budget
    (("--steps", "100000", "--arm", "bf16-eager"), "the budget is 5,000,000 steps"),
])
def test_the_cli_refuses_at_once(cli, args, named):
    start = time.perf_counter()
    code, _, out, err = cli("experiment", *args, "--out", "none")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and named in err, err
    assert time.perf_counter() - start < 10  # refused before any model is built, not after a long wait


def test_a_long_legal_run_says_its_estimate_first_on_stderr(cli, monkeypatch):
    from softcapgrad.experiments import runner

    def measured(*args, **kwargs):
        raise InputError("stopped where the measurement would start")

    monkeypatch.setattr(runner, "measure", measured)
    code, _, out, err = cli("experiment", "--seeds", "100", "--out", "none", "--json")
    lines = err.strip().splitlines()
    steps = all_steps(DESIGN.with_(seeds=tuple(range(100))))
    assert code == 2 and out == ""  # the JSON output stays clean: the estimate went to stderr
    assert lines == [f"softcapgrad: experiment: at most {steps:,} training steps, about "
                     f"{steps * STEP_SECONDS / 60:.0f} min here (9 ms a step)",
                     "softcapgrad: error: stopped where the measurement would start"], lines


def test_a_run_of_hours_says_hours(cli, monkeypatch):
    from softcapgrad.experiments import runner

    monkeypatch.setattr(runner, "measure", lambda *a, **k: (_ for _ in ()).throw(InputError("stop")))
    code, _, _, err = cli("experiment", "--seeds", "800", "--out", "none")
    steps = all_steps(DESIGN.with_(seeds=tuple(range(800))))
    assert code == 2 and err.strip().splitlines()[0] == (f"softcapgrad: experiment: at most {steps:,} training "
                                                         f"steps, about {steps * STEP_SECONDS / 3600:.1f} h here "
                                                         "(9 ms a step)")


def test_a_short_run_says_nothing_more(cli, monkeypatch):
    from softcapgrad.experiments import runner

    monkeypatch.setattr(runner, "measure", lambda *a, **k: (_ for _ in ()).throw(InputError("stop")))
    code, _, _, err = cli("experiment", "--quick", "--out", "none")
    assert code == 2 and err.strip().splitlines() == ["softcapgrad: error: stop"]


@pytest.mark.parametrize("seeds", [1, 3, 7, 8, 30])
def test_fewer_seeds_leave_the_sgd_setting_only_seeds_that_ran(seeds):
    """The SGD arms start from the AdamW runs' phase 1, kept only for seeds the run trains: --seeds below the SGD
    setting's count must shrink it, or the reported SGD runs look up a seed that never ran."""
    from softcapgrad.cli.experiments import _design

    design = _design(False, seeds, None, None, None)
    assert design.seeds == tuple(range(seeds))
    assert set(design.sgd_seeds) <= set(design.seeds)
    assert design.sgd_seeds == tuple(s for s in DESIGN.sgd_seeds if s < seeds)


@pytest.mark.parametrize("seeds, said", [([0], "Over 1 seed, "), ([0, 1], "Over 2 seeds, ")])
def test_the_answer_counts_its_seeds_in_words(seeds, said):
    """--seeds 1 is a legal run: its answer must not say "1 seeds"."""
    import json
    from pathlib import Path

    from softcapgrad.experiments.report import answer

    res = json.loads((Path(__file__).resolve().parents[1] / "results" / "experiment.json").read_text())
    res["design"]["seeds"] = seeds
    assert answer(res)[0].startswith(said)
