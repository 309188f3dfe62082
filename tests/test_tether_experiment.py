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


# --- the gates-only scenario (issue 54) and the statistics on planted data ---------------------------------------

def _exact_two_sided(x):
    """Reference: the signed-rank p by enumerating every sign pattern (no ties, no zeros: ranks 1..n)."""
    import itertools

    import numpy as np

    ranks = np.argsort(np.argsort(np.abs(x))) + 1
    t = ranks[np.asarray(x) > 0].sum()
    sums = np.array([sum(r for r, s in zip(ranks, signs) if s) for signs in itertools.product((0, 1), repeat=len(x))])
    return min(1.0, 2 * min((sums <= t).mean(), (sums >= t).mean()))


def test_signed_rank_p_exact_on_planted_data():
    """No ties, no zeros: the exact null distribution, as enumerating all 2^10 sign patterns gives it."""
    from softcapgrad.experiments.stats import signed_rank_p

    for x in ([0.1, -0.2, 0.3, 0.4, 0.5, -0.6, 0.7, 0.8, 0.9, 1.0], [1.5, 2.5, -3.5, 4.5, -5.5, 6.5, 7.5, 8.5, -9.5, 10.5]):
        assert abs(signed_rank_p(x) - _exact_two_sided(x)) <= 5e-7  # rounded to 6 decimals
    assert signed_rank_p([1.0, 2, 3, 4, 5, 6]) == round(2 / 2**6, 6)  # all positive: 2 · P(T+ = 21)
    assert signed_rank_p([0.0, 0.0]) is None


def test_signed_rank_p_normal_approximation_with_ties():
    """Ties (and zeros, dropped): the normal approximation with the tie correction, computed by hand here."""
    import math

    from softcapgrad.experiments.stats import signed_rank_p

    x = [0.0] + [1.0] * 6 + [-1.0] * 2 + [2.0] * 5 + [-2.0] + [3.0] * 4  # n = 18 after the zero; ties of 8, 6, 4
    ranks = {1.0: 4.5, 2.0: 11.5, 3.0: 16.5}  # midranks of |x| = 1 (1–8), 2 (9–14), 3 (15–18)
    t_plus = sum(ranks[v] for v in x if v > 0)
    n = 18
    var = (n * (n + 1) * (2 * n + 1) - sum(t**3 - t for t in (8, 6, 4)) / 2) / 24
    z = (t_plus - n * (n + 1) / 4) / math.sqrt(var)
    assert abs(signed_rank_p(x) - math.erfc(abs(z) / math.sqrt(2))) <= 5e-7


def test_paired_ratios_on_planted_data():
    """Every seed 10 % slower: the geometric mean and both ends of its interval are 1.1, 24 of 24 slower."""
    from softcapgrad.experiments.stats import paired

    p = paired([110] * 24, [100] * 24, 200, 0.95, 0)
    assert abs(p.geomean - 1.1) <= 1e-6 and abs(p.low - 1.1) <= 1e-6 and abs(p.high - 1.1) <= 1e-6
    assert (p.slower, p.tied, p.faster) == (24, 0, 0) and p.wilcoxon_p is not None and p.wilcoxon_p < 1e-4
    out = tether_report.difference([0.3 + 0.01 * i for i in range(12)], [0.0] * 12, td.DESIGN.with_(bootstrap=200))
    assert out["wilcoxon_p"] == round(2 / 2**12, 6)  # 12 positive differences, no ties: 2 · 2^−12


GATES = td.COLLAPSE.with_(steps_a=5, steps_b=3, seeds=(0,), every=2, bootstrap=50)


def test_gates_only_phase_a_moves_the_gates_alone():
    """GatesOnly: after its steps every weight but q_proj's gate rows (and θ) is bit for bit where it started."""
    import torch

    from softcapgrad.experiments.tether_loop import GatesOnly, _step, fresh
    from softcapgrad.training.tether_patch import patch_gates

    model = fresh(GATES, 0)
    model.train()
    tether = patch_gates(model)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    opt = GatesOnly(model, GATES)
    for t in range(3):
        _step(model, opt, tether, *batch(GATES, 0, 0, t), t, GATES)
    rows = torch.from_numpy(gate_rows(GATES))
    moved = []
    for name, value in model.state_dict().items():
        if ".q_proj." in name:
            keep = torch.ones(value.shape[0], dtype=torch.bool)
            keep[rows] = False
            assert torch.equal(value[keep], start[name][keep]), name  # the query rows, held exactly
            moved.append(not torch.equal(value[rows], start[name][rows]))
        elif "tether_gate" not in name:
            assert torch.equal(value, start[name]), name
    assert moved and all(moved)
    after = opt.release()
    assert all(p.requires_grad for p in model.parameters()) and len(after.param_groups[0]["params"]) == len(
        list(model.parameters()))


@pytest.mark.parametrize("observes", [True, False])
def test_phase_b_probe_and_the_ema(observes):
    """The probe forward (a recovered batch: no update) steps the tether gates' EMA only where the design says so."""
    import torch

    from softcapgrad.experiments.tether_loop import _probe_then_step, fresh
    from softcapgrad.training.tether_patch import patch_gates

    d = GATES.with_(probe_observes=observes, recover_loss=1e9)  # every batch counts as recovered: probe only
    model = fresh(d, 0)
    model.train()
    tether = patch_gates(model)
    model(input_ids=torch.from_numpy(batch(d, 0, 0, 0)[0]))  # one training forward: the EMA starts
    before = [g.ema_s.clone() for g in tether.gates]
    loss, stop = _probe_then_step(model, None, tether, *batch(d, 0, 1, 0), 0, d, True)
    assert stop
    same = all(torch.equal(a, g.ema_s) for a, g in zip(before, tether.gates))
    assert same is not observes and all(g.training for g in tether.gates)


def test_gates_only_arms_are_paired():
    by = {r.arm: r for r in run_seed(GATES, 0)}
    assert list(by) == list(GATES.arms)
    assert by["tether"].loss_a[0] == by["plain"].loss_a[0] and by["reinit"].loss_a == by["plain"].loss_a


def test_bad_scenario_is_one_line_exit_2(cli):
    code, _, _, err = cli("tether-experiment", "--scenario", "frozen", "--out", "none")
    assert code == 2 and "--scenario frozen" in err and err.count("\n") == 1


def test_readme_sentence_is_the_committed_results():
    """README's sentence on the experiment: every figure from results/tether-collapse.json and tether-experiment.json."""
    import json
    from pathlib import Path

    import numpy as np

    root = Path(__file__).resolve().parents[1]
    new, old = (json.loads((root / "results" / f"{n}.json").read_text()) for n in ("tether-collapse", "tether-experiment"))
    pair = {p["pair"]: p for p in new["pairs"]}
    first = next(p for p in old["pairs"] if p["pair"] == "plain ÷ tether")["steps"]
    said = (f"(`tether-experiment --scenario gates-only`, {len(new['design']['seeds'])} seeds), the patch left "
            f"{100 * np.mean(new['arms']['tether']['closed_share']):.1f} % shut to their "
            f"{100 * np.mean(new['arms']['plain']['closed_share']):.1f} % (Wilcoxon p = "
            f"{pair['plain ÷ tether']['closed']['wilcoxon_p']:.2g}), recovered "
            f"{100 * (pair['plain ÷ tether']['steps']['geomean'] - 1):.1f} % sooner (p = "
            f"{pair['plain ÷ tether']['steps']['wilcoxon_p']:.2g}) but lost to re-initialised gates (p = "
            f"{pair['reinit ÷ tether']['steps']['wilcoxon_p']:.2g}); where none close, "
            f"{100 * (first['geomean'] - 1):.1f} % sooner (p = {first['wilcoxon_p']:.2g};")
    assert pair["reinit ÷ tether"]["steps"]["high"] < 1 and max(old["arms"]["plain"]["closed_share"]) == 0
    text = " ".join((root / "README.md").read_text(encoding="utf-8").split())
    assert said in text
