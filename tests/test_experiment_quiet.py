"""`experiment --quick` prints its answer on stdout and nothing on stderr (no progress off a terminal, no warning).

The natural-confidence run read its loss with ``float(loss)`` on a tensor that needs grad, and torch warned
about it (a UserWarning on stderr) on every quick or full run. The run is the quick design cut to a few steps
of each phase: the natural-confidence run is in it, which a partial run (--steps, --arm) leaves out.
"""

import warnings

import pytest
from typer.testing import CliRunner

from softcapgrad.cli.app import app

pytest.importorskip("transformers")


def test_a_quick_run_writes_nothing_on_stderr(monkeypatch):
    from softcapgrad.experiments import design

    tiny = design.QUICK.with_(seeds=(0,), phase1_steps=2, phase2_steps=2, depths=(0.5,), band_depths=(),
                              shifts=("rotation",), arms=("bf16-eager", "bf16-patch"), side_depths=(),
                              natural_steps=2, natural_every=1, sgd_seeds=(), bootstrap=10)
    monkeypatch.setattr(design, "QUICK", tiny)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # shown, not raised: what a user's terminal would get
        result = CliRunner().invoke(app, ["experiment", "--quick", "--out", "none"])
    assert result.exit_code == 0, result.stderr
    assert "2 hot AdamW steps" in " ".join(result.stdout.split())  # the natural-confidence run ran and answered
    assert [str(w.message) for w in caught] == [] and result.stderr == ""
