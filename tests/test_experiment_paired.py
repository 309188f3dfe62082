"""The experiment's paired design in parts: the control arm's backward, the paired statistics and their wording,
the band shift, and the refusal of non-finite states (no quick run needed)."""

import math

import numpy as np
import pytest

from softcapgrad.experiments import stats
from softcapgrad.experiments.design import PREVIOUS_4X, design_seeds
from softcapgrad.experiments.task import Task, band_mapping, mapping

torch = pytest.importorskip("torch")


def _planted():
    """bf16 inputs/c across the live range and past the bf16 horizon (tanh stored as ±1 from |x| ≈ 3.47 on)."""
    x = torch.linspace(-6.0, 6.0, 2001).to(torch.bfloat16)
    g = torch.linspace(-1.0, 1.0, 2001).to(torch.bfloat16).flip(0) + 0.25
    return x, g.to(torch.bfloat16)


def test_control_backward_is_the_patchs_where_live_and_zero_where_eager_is():
    from softcapgrad.experiments.control import _mode_class
    from softcapgrad.training.fp32grad import fp32_tanh_backward

    x, g = _planted()
    grads = {}
    for name, mode in (("patch", fp32_tanh_backward), ("control", _mode_class()), ("eager", None)):
        leaf = x.clone().requires_grad_(True)
        if mode is None:
            y = torch.tanh(leaf)
        else:
            with mode():
                y = torch.tanh(leaf)
        y.backward(g)
        grads[name] = leaf.grad
        stored = y.detach()
    dead = stored.abs() == 1
    assert 0 < int(dead.sum()) < dead.numel()
    assert torch.equal(grads["control"][~dead], grads["patch"][~dead])  # bit for bit where live
    assert torch.all(grads["control"][dead] == 0) and torch.all(grads["eager"][dead] == 0)
    assert torch.all(grads["patch"][dead & (g != 0)] != 0)  # the patch keeps what both others drop


def test_paired_ratio_on_the_previous_run_and_its_wording():
    eager, patched = PREVIOUS_4X
    p = stats.paired(list(eager), list(patched), 2000, 0.95, 0)
    logs = np.log(np.asarray(eager, float) / np.asarray(patched, float))
    assert p.geomean == pytest.approx(math.exp(logs.mean()), abs=1e-6)  # rounded to 6 places
    assert (p.slower, p.tied, p.faster) == (3, 5, 0)
    assert p.low > 1 and p.verdict.startswith("costs ")
    tied = stats.paired([10] * 6, [10] * 6, 200, 0.95, 0)
    assert tied.low == tied.high == 1 and tied.wilcoxon_p is None
    assert tied.verdict.startswith("no cost larger than 0.0 %") and "difference" not in tied.verdict
    assert stats.paired([5, 6, 5], [20, 21, 22], 300, 0.95, 0).verdict.startswith("faster by ")


def test_seed_count_follows_from_the_previous_spread():
    sd, need = design_seeds(0.01)
    logs = np.log(np.asarray(PREVIOUS_4X[0], float) / np.asarray(PREVIOUS_4X[1], float))
    assert sd == pytest.approx(float(np.std(logs, ddof=1)))
    assert need == math.ceil((2.8 * sd / math.log(1.01)) ** 2) and need <= 24


def test_band_shift_picks_the_token_nearest_the_aim_inside_the_band():
    task = Task(vocab=8, seq=4, batch=2, shift_fraction=0.5)
    m = mapping(task, 0)
    logits = np.zeros((8, 8))
    shifted = np.flatnonzero(m.shifted)
    t, u = shifted[0], shifted[1]
    logits[t, :] = [-200, -140, -125, -111, -90, 0, 10, 20]
    logits[t, m.before[t]] = -131  # the old successor is never the new one
    out, found = band_mapping(m, logits, (-150.0, -110.0), -130.0)
    assert out.after[t] == (2 if m.before[t] != 2 else 1) and found == 1  # only t has tokens in the band
    assert out.after[u] == m.after[u]  # no token in the band: the rotation's target stays


def test_a_non_finite_state_is_refused_in_one_line():
    from softcapgrad.core.checks import InputError
    from softcapgrad.experiments.runner import _finite

    _finite({"w": torch.ones(3)}, 1.0, "fine")
    with pytest.raises(InputError, match="non-finite") as err:
        _finite({"w": torch.tensor([1.0, float("inf")])}, 1.0, "--depth 1e30")
    assert "\n" not in str(err.value)
    with pytest.raises(InputError, match="largest pre-cap logit nan"):
        _finite({"w": torch.ones(3)}, float("nan"), "--depth 1e30")
