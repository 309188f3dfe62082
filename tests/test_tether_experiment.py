"""tether-experiment: the design's budget, the pairing of the arms, the statistics, and bad input."""

import pytest

pytest.importorskip("transformers")

from softcapgrad.experiments import tether_design as td  # noqa: E402
from softcapgrad.experiments import tether_report  # noqa: E402
from softcapgrad.experiments.tether_loop import batch, gate_rows, run_seed  # noqa: E402

TINY = td.DESIGN.with_(steps_a=6, steps_b=4, seeds=(0,), every=3, bootstrap=50)


def test_the_design_fits_its_time():
    """The default run within 10 minutes of one core at the measured step time, --quick within a minute."""
    assert len(td.DESIGN.seeds) >= 24
    assert td.all_steps(td.DESIGN) * td.STEP_SECONDS <= 600
    assert td.all_steps(td.QUICK) * td.STEP_SECONDS <= 60


def test_batches_are_a_function_of_seed_phase_step():
    x0, y0 = batch(td.DESIGN, 3, 0, 7)
    x1, y1 = batch(td.DESIGN, 3, 0, 7)
    assert (x0 == x1).all() and (y0 == y1).all()
    x, y = batch(td.DESIGN, 3, 1, 0)
    assert (y[:, 0] == -100).all() and (y[:, 1:] == x[:, :-1]).all()


def test_gate_rows_are_the_second_half_of_each_head():
    d = td.DESIGN
    rows = gate_rows(d)
    assert len(rows) == d.heads * d.head_dim and rows[0] == d.head_dim and rows[-1] == d.heads * 2 * d.head_dim - 1


@pytest.fixture(scope="module")
def runs():
    return run_seed(TINY, 0)


def test_arms_are_paired(runs):
    """Same initialisation and batches: the patched model's first loss is the plain one's exactly (equal at step 0),
    and the control shares the plain model's phase A."""
    by = {r.arm: r for r in runs}
    assert list(by) == list(TINY.arms)
    assert by["tether"].loss_a[0] == by["plain"].loss_a[0]
    assert by["reinit"].loss_a == by["plain"].loss_a
    assert by["reinit"].closed_at_switch == by["plain"].closed_at_switch
    assert all(0.0 <= r.closed_at_switch <= 1.0 for r in runs)
    assert all(h.saturated is not None for r in runs for h in r.health)  # the monitor saw the gates' sigmoid


def test_results_and_report(runs):
    res = tether_report.results(runs, TINY)
    assert [p["pair"] for p in res["pairs"]] == ["plain ÷ tether", "plain ÷ reinit", "reinit ÷ tether"]
    assert 1 <= len(res["verdict"]["answer"]) <= 3
    report = tether_report.tether_report(res)
    assert report.command == "tether-experiment" and report.tables[0].rows


def test_difference_interval_brackets_its_mean():
    d = td.DESIGN.with_(bootstrap=200)
    out = tether_report.difference([0.5, 0.4, 0.6, 0.5], [0.1, 0.0, 0.2, 0.1], d)
    assert out["low"] <= out["mean"] <= out["high"] and out["verdict"] == "higher"
    same = tether_report.difference([0.1, 0.2], [0.1, 0.2], d)
    assert same["mean"] == 0 and same["verdict"] == "no difference the interval resolves"


@pytest.mark.parametrize("args, says", [
    (["--seeds", "0"], "--seeds 0"),
    (["--steps", "0"], "--steps 0"),
    (["--seeds", "10000", "--steps", "1000000"], "the budget is"),
])
def test_bad_input_is_one_line_exit_2(cli, args, says):
    code, _, _, err = cli("tether-experiment", *args, "--out", "none")
    assert code == 2 and says in err and "Traceback" not in err


def test_audit_model_patch(cli):
    code, data, _, _ = cli("audit-model", "--model-type", "laguna", "--patch", "tether", "--json")
    assert code == 0 and data["params"]["bit_identical_outputs"] and data["params"]["bit_identical_gradients"]
    assert {r["status"] for r in data["rows"]} >= {"held"}
    code, _, _, err = cli("audit-model", "--model-type", "llama", "--patch", "tether")
    assert code == 2 and "no head gate this patch can hold" in err and err.count("\n") == 1
    code, _, _, err = cli("audit-model", "--model-type", "laguna", "--patch", "sigmoid")
    assert code == 2 and "--patch" in err
