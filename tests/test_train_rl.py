"""train-parity's RL log-prob route: the final cap inside an RL trainer's log-softmax of the hidden state.

Planted, in this process: the fused-head step (token log-probs, no logits) of parity's tiny Gemma 2 with its final
cap computed as c·tanh(a/c) (applied), as a·tanh(a/c) (unsloth-zoo 2026.4.6's form: "wrong form", never "applied")
and not at all (ignored). The adapter reads unsloth-zoo's function from the installed file without running the
package: a planted file with a decorator that cannot run shows it is compiled alone. Live: the route from the
train-unsloth environment (make test-engines).
"""

from __future__ import annotations

import copy
import sys

import numpy as np
import pytest

pytest.importorskip("transformers")

from softcapgrad.engines.training import reference as tr  # noqa: E402
from softcapgrad.engines.training import verdict as tv  # noqa: E402

sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
from test_train_parity import _adapter, _capped_folder, _fused, _rows, _trained, _with_final, bound  # noqa: E402,F401


def _final(bound, fn) -> dict:
    return _rows(bound, _fused(_with_final(bound, fn), bound[1]))["final"]


def test_the_wrong_form_is_named_wrong_the_right_one_applied_none_ignored(bound):
    import torch

    right = _final(bound, lambda a, c: c * torch.tanh(a / c))
    wrong = _final(bound, tr.z_tanh)
    model = copy.deepcopy(bound[0])
    model.config.final_logit_softcapping = None
    none = _rows(bound, _fused(_trained(bound, model), bound[1]))["final"]
    assert right["verdict"] == tv.APPLIED, right
    assert wrong["verdict"] == tv.WRONG and wrong["form"] == tr.Z_TANH and wrong["forward_cell"] == tr.Z_TANH, wrong
    assert none["verdict"] == tv.IGNORED and none["forward_cell"] == "final off", none
    # the wrong form lies far outside the tolerance of the capped model: a verdict no rounding could give
    far = tv.logit_error(_fused(_with_final(bound, tr.z_tanh), bound[1]), bound[2].steps["capped"], bound[1])
    assert far > 100 * right["forward_tolerance"]


PLANTED = '''raise ImportError("Please install Unsloth via `pip install unsloth`!")
'''
FILE = '''import torch
from .device_type import DEVICE_TYPE

@torch.compile(options = never_defined)
def chunked_hidden_states_selective_log_softmax(hidden_states, lm_head, index, chunks = 4, logit_scale_multiply = 0.0,
                                                logit_scale_divide = 0.0, logit_softcapping = 0.0, temperature = 1.0):
    chunk_logits = hidden_states @ lm_head.t()
    if logit_softcapping != 0.0:
        chunk_logits = {form}
    return torch.log_softmax(chunk_logits, -1).gather(-1, index.unsqueeze(-1)).squeeze(-1)
'''


@pytest.mark.parametrize("form, verdict_", [("chunk_logits * torch.tanh(chunk_logits / logit_softcapping)", tv.WRONG),
                                            ("logit_softcapping * torch.tanh(chunk_logits / logit_softcapping)",
                                             tv.APPLIED)])
def test_the_adapter_runs_the_installed_files_function_alone_and_is_judged(bound, tmp_path, monkeypatch, form,
                                                                           verdict_):
    """A planted unsloth_zoo whose package refuses to import and whose decorator cannot run: the adapter compiles
    the function alone, reports the cap's line, and its step is judged by the cap's form."""
    package = tmp_path / "site" / "unsloth_zoo"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(PLANTED, encoding="utf-8")
    (package / "rl_replacements.py").write_text(FILE.format(form=form), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    adapter = _adapter("train_unsloth_rl")
    fn, path, where = adapter.installed_function()
    assert path.name == "rl_replacements.py" and where == f"line 9: chunk_logits = {form}"
    reference = _capped_folder(bound, tmp_path)

    class Run:
        ids, route, did, precision = bound[1], "grpo", "", ""

        def folder(self, variant):
            return tmp_path / variant

    arrays = adapter.run_variant(Run(), "capped")
    np.savez(tmp_path / "step.npz", **arrays)
    rows = {r["cap"]: r for r in tv.judge(tr.read_step(tmp_path / "step.npz"), reference)}
    assert rows["final"]["verdict"] == verdict_ and rows["attention"]["verdict"] == tv.APPLIED, rows


@pytest.mark.slow
@pytest.mark.engine_environments("train-unsloth")
def test_unsloth_zoo_rl_grpo_route_from_its_environment_could_not_run_and_says_why(bound, tmp_path,
                                                                                    engine_environment):
    """The grpo route live from train-unsloth (unsloth-zoo 2026.10.9): the function read alone from that release's
    file imports unsloth_zoo.fused_losses inside its body (rl_replacements.py:228), and unsloth_zoo's own import
    refuses ('Please install Unsloth'); the route says so in its reason and gives no verdict of the cap (measured;
    the incident's releases, 2026.4.6 and 2026.4.7, run: their replay is in tests/test_incidents.py)."""
    from softcapgrad.engines.training import parity as train_parity

    state = engine_environment("train-unsloth")
    reference = _capped_folder(bound, tmp_path)
    rows, steps, info = train_parity._route("unsloth-zoo-rl", train_parity.UNSLOTH_RL_ROUTES[0], state, reference,
                                            tmp_path, ["capped"], 180.0)
    assert info["reason"] and "Unsloth" in info["reason"] and "\n" not in info["reason"], info
    assert tv.APPLIED not in [r["verdict"] for r in rows], rows
