"""The committed census (results/census.json): every model type that can be audited here is, and each one that
is not says why in a kind that no repair or input of ours could change."""

import json
from pathlib import Path

import pytest

from softcapgrad.models import census_kinds

CENSUS = Path(__file__).resolve().parents[1] / "results" / "census.json"
LIMIT = 35  # refusals: the configurations without a model class and the few models nothing here can run
LEGITIMATE = {
    "a configuration without a model class",  # transformers holds the configuration alone
    "a package not installed here",  # timm, whose torchvision has no CPU wheel for the pinned torch
    "a class without a forward of its own (a tokenizer, a generate-only wrapper)",
    "an inference-only forward (no backward can run)",  # the video trackers' forward is under inference_mode
    "no eager attention (the audit's tracing runs eager)",
    "an output of integer codes only (nothing to differentiate)",
}


@pytest.fixture(scope="module")
def committed():
    return json.loads(CENSUS.read_text(encoding="utf-8"))


def test_at_most_the_limit_of_model_types_is_refused(committed):
    refused = [r["model_type"] for r in committed["rows"] if r["status"] != "audited"]
    assert len(refused) <= LIMIT, refused
    assert committed["counts"]["not audited"] == len(refused)


def test_every_refusal_is_of_a_kind_nothing_here_could_change(committed):
    class Row:  # refusal_kind reads a row's status and reason
        def __init__(self, r):
            self.status, self.reason = r["status"], r["reason"]

    kinds = {r["model_type"]: census_kinds.refusal_kind(Row(r)) for r in committed["rows"] if r["status"] != "audited"}
    assert {t: k for t, k in kinds.items() if k not in LEGITIMATE} == {}
    assert sum(committed["not_audited_by_kind"].values()) == len(kinds)


def test_a_row_run_in_float32_says_so_beside_it(committed):
    float32 = [r for r in committed["rows"] if any(c.startswith("run in float32") for c in r["changes"])]
    assert float32 and all(r["status"] == "audited" for r in float32)


def test_a_row_run_in_float32_names_the_module_not_the_kernels_words(committed):
    """The kernel library words a refusal of mixed formats differently per CPU: the committed rows name the module that
    met the float32 tensor, which is the same on every CPU."""
    said = [c for r in committed["rows"] for c in r["changes"] if c.startswith("run in float32")]
    assert said and all("first met in " in c and "Error" not in c and "type (" not in c for c in said)
