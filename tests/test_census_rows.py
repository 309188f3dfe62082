"""The census describes what ran: overrides and repairs beside the row, one row per gate site, activations and
attention-sink rescales apart from gates, each configuration class once, every capped type built, a budget in CPU time."""

import signal
import time

import pytest

pytest.importorskip("transformers")

from softcapgrad.models import census, repairs  # noqa: E402

TYPES = ["gemma3n", "gpt_oss", "granite_swa", "jev", "openai_privacy_filter", "owlvit_text_model", "paligemma"]


@pytest.fixture(scope="module")
def rows():
    result = census.census(TYPES)
    return result, {r.model_type: r for r in result.rows}


def test_every_row_audited(rows):
    _, by = rows
    assert {m: r.status for m, r in by.items()} == dict.fromkeys(TYPES, "audited"), {m: r.reason for m, r in by.items()}


def test_paligemma_says_its_text_model_was_swapped(rows):
    result, by = rows
    assert by["paligemma"].changes == ["text_config.model_type = 'gemma2' (override)"]
    md = census.markdown(result)
    line = next(x for x in md.splitlines() if x.startswith("| paligemma | text_config.final_logit_softcapping"))
    assert "text_config.model_type = 'gemma2' (override)" in line
    assert any(g == "text_config.model_type = 'gemma2' (override)" for g in census.as_dict(result)["rows"][
        [r.model_type for r in result.rows].index("paligemma")]["changes"])


def test_gemma3n_without_timm_is_its_text_path_and_says_so(rows):
    import importlib.util

    if importlib.util.find_spec("timm") is not None:
        pytest.skip("timm is installed here: the whole model is built")
    row = rows[1]["gemma3n"]
    assert row.changes[0].startswith("built as its text model (gemma3n_text)") and "timm" in row.changes[0]
    assert [(c["field"], c["status"]) for c in row.caps] == [("final_logit_softcapping", "applied")]


def test_jev_softcap_is_built_and_off_at_its_default(rows):
    assert [(c["field"], c["status"]) for c in rows[1]["jev"].caps] == [("softcap", "off")]


def test_one_row_per_gate_site_and_activations_apart(rows):
    result, by = rows
    experts = [g for g in by["openai_privacy_filter"].gates if g["module"] == "layers.*.mlp.experts"]
    assert len(experts) == 1 and experts[0]["kind"] == "activation" and "routed tokens" in experts[0]["shape"]
    for model_type in ("gpt_oss", "owlvit_text_model"):  # the clamped GLU x·σ(αx), QuickGELU x·σ(1.702x)
        assert {g["kind"] for g in by[model_type].gates} == {"activation"}, by[model_type].gates
    sink = by["granite_swa"].gates
    assert [g["kind"] for g in sink] == ["attention-sink rescale"] and "logsumexp" in sink[0]["role"]
    counts = result.counts()
    assert counts["gate sites"] == sum(g["kind"] == "gate" for r in result.rows for g in r.gates)
    assert counts["activation sites (x·σ(αx), not gates)"] >= 3 and counts["attention-sink rescales"] == 1


def test_a_configuration_class_is_one_candidate():
    found = [c.model_type for c in census.candidates()]
    assert "evolla" in found and "EvollaModel" not in found
    assert len(found) == len(set(found))


def test_budget_is_cpu_time_not_wall_clock(monkeypatch):
    """A row that waits (wall-clock time passes, no CPU is used) is not cut; one that computes past the budget is."""
    from softcapgrad.models import audit

    config = audit.model_type_config("gemma2", {})
    monkeypatch.setattr(audit, "model_type_config", lambda *a, **k: config)
    timers = []
    real = signal.setitimer
    monkeypatch.setattr(signal, "setitimer", lambda which, s, *a: (timers.append(which), real(which, s, *a))[1])
    cand = next(c for c in census.candidates() if c.model_type == "gemma2")

    def waits(*a, **k):
        time.sleep(1.5)
        raise audit.InputError("waited")

    monkeypatch.setattr(audit, "audit", waits)
    assert census.census_row(cand, seconds=1.0).reason == "waited"
    assert set(timers) == {signal.ITIMER_PROF}

    def computes(*a, **k):
        start = time.process_time()
        while time.process_time() - start < 5:
            pass

    monkeypatch.setattr(audit, "audit", computes)
    row = census.census_row(cand, seconds=0.5)
    assert row.status == "timed out" and "CPU time" in row.reason


def test_repairs_read_the_message():
    d = {"num_attention_heads": 2, "num_key_value_heads": 1, "per_layer_config": {"0": {"num_key_value_heads": 1}}}
    assert repairs.equal_heads(d) and d["num_key_value_heads"] == 2 and d["per_layer_config"]["0"]["num_key_value_heads"] == 2
    d = {"rope_parameters": {"mrope_section": [16, 24, 24]}}
    assert repairs.rope_sections(d, "split_with_sizes expects split_sizes to sum exactly to 16 (input tensor's size")
    assert sum(d["rope_parameters"]["mrope_section"]) == 16 and len(d["rope_parameters"]["mrope_section"]) == 3
    d = {"sliding_window": None}
    assert repairs.sliding_window(d, "Could not find a `sliding_window` argument") and d["sliding_window"] == repairs.WINDOW
    d = {"text_config": {"model_type": "t"}}
    made = repairs.missing_attribute(d, "'TConfig' object has no attribute 'dropout_rate'", lambda lvl, p: "TConfig" if p else "X")
    assert made and d["text_config"]["dropout_rate"] == 0.0
    d = {"head_dim": 32, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16}
    assert repairs.sums(d, "SWA head_dim must equal qk_nope_head_dim + qk_rope_head_dim") and d["head_dim"] == 48
    assert repairs.repair({"a": 1}, {"a": 1}, "nothing to point at", lambda *a: None, set()) == []


@pytest.mark.slow
def test_rows_are_the_same_in_worker_processes(rows):
    """Shared among fresh processes, the rows and the files come out as in one process."""
    result, _ = rows
    apart = census.census(["gpt_oss", "granite_swa", "paligemma"], workers=2)
    alone = [r for r in result.rows if r.model_type in ("gpt_oss", "granite_swa", "paligemma")]
    assert apart.rows == alone
