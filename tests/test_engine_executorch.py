"""ExecuTorch live from its own environment (``softcapgrad engines install executorch_rt``; skipped until then):
a direct torch.export lowered to the portable kernels, and optimum-executorch's default export, both run by
executorch.runtime on a tiny Gemma 2 whose sliding window (8) is shorter than its input (16 tokens)."""

from __future__ import annotations

import pytest

from softcapgrad.engines.environments import environments as envs
from softcapgrad.engines.forward import parity, runner, verdict

pytest.importorskip("transformers")

pytestmark = pytest.mark.slow  # each export and run is about 45 s of CPU


def installed():
    state = envs.state("executorch_rt")
    if state.state != "installed":
        pytest.skip(f"the executorch_rt environment is {state.state}: softcapgrad engines install executorch_rt")
    return state.python


def inputs(tmp_path):
    from softcapgrad.engines.forward.reference import tiny_sets
    from softcapgrad.models import audit

    src = audit.source(None, "gemma2", tiny_sets("gemma2"))
    folder = tmp_path / "inputs"
    folder.mkdir()
    return parity.prepare(src, 16, 0, folder), folder


def test_direct_export_loaded_eager_on_the_portable_kernels_applies_both_caps(tmp_path):
    python = installed()
    reference, folder = inputs(tmp_path)
    work = runner.prepare(tmp_path / "run", folder, ["capped", "final-off"])
    out = runner.run(python, "executorch_rt", "portable-eager", work, ["capped", "final-off"], timeout=600)
    assert out.reason is None, out.stderr
    assert "attention eager" in out.info["did"] and "portable kernels" in out.info["did"]
    rows = verdict.verdicts({"capped": out.logits["capped"], "final off": out.logits["final-off"]}, reference)
    assert [(r["cap"], r["verdict"]) for r in rows] == [("attention", "applied"), ("final", "applied")]
    assert rows[0]["max_logit"] <= 30.0


def test_optimum_executorch_default_export_fails_at_the_sliding_window_in_its_static_cache(tmp_path):
    python = installed()
    _, folder = inputs(tmp_path)
    work = runner.prepare(tmp_path / "run", folder, ["capped"])
    out = runner.run(python, "executorch_rt", "default", work, ["capped"], timeout=600)
    assert out.code == 1
    # one token a call; the 9th writes cache position 8 into the local layers' 8-long static cache
    assert "at call 9 of 16 (cache position 8" in out.reason and "aten::index_put.out" in out.reason
    assert "sliding_window() = 8," in out.reason
