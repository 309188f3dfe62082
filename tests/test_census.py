"""Caps and gates found by running, on transformers 5.24's own model types (tiny, random weights, CPU).

These pin what the installed transformers does: a field is a cap when moving it moves a tanh's
divisor, off when its 0 or None switches the cap out, dead config when named like one and moving
nothing. The sample is the issue's (gemma2, gemma3_text, recurrent_gemma, laguna, gemma4's text
model, paligemma, t5gemma, nanochat) plus the model types whose caps are not called "softcap".
"""

import json
import os

import pytest
import torch

pytest.importorskip("transformers")

from softcapgrad.models import audit, census, tiny  # noqa: E402

SAMPLE = ["gemma2", "gemma3_text", "recurrent_gemma", "laguna", "gemma4_text", "paligemma", "t5gemma", "nanochat"]


_RUNS: dict = {}  # audit-model's arguments -> (exit code, stdout, stderr): the same tiny audit is run once here


def _run(cli, *args) -> tuple[int, str, str]:
    """``audit-model ARGS --json`` in-process; an invocation another test of this file already made is not repeated
    (the output is deterministic: tests/test_audit.py runs one twice and compares)."""
    if args not in _RUNS:
        code, _, out, err = cli("audit-model", *args, "--json")
        _RUNS[args] = (code, out, err)
    return _RUNS[args]


def _audit(cli, *args):
    code, out, err = _run(cli, *args)
    assert code == 0, err
    return json.loads(out)


def _caps(data) -> dict:
    return {r["field"]: r["status"] for r in data["config"]}


@pytest.mark.parametrize("model_type, caps", [
    ("recurrent_gemma", {"logits_soft_cap": "applied"}),
    ("xlstm", {"gate_soft_cap": "applied", "output_logit_soft_cap": "applied"}),
    ("gemma3n_audio", {"conf_attention_logit_cap": "applied"}),
    ("gemma4_audio", {"attention_logit_cap": "applied"}),
    ("gemma3_text", {"final_logit_softcapping": "off", "attn_logit_softcapping": "unused"}),
    ("gemma4_text", {"final_logit_softcapping": "off"}),
    ("laguna", {"moe_router_logit_softcapping": "off"}),
    ("nanochat", {"final_logit_softcapping": "applied"}),
    ("paligemma", {"text_config.final_logit_softcapping": "applied", "text_config.attn_logit_softcapping": "applied"}),
])
def test_caps_by_behaviour_whatever_the_field_is_called(cli, model_type, caps):
    data = _audit(cli, "--model-type", model_type, "--attn", "eager")
    assert _caps(data) == caps
    applied = [r for r in data["config"] if r["status"] == "applied"]
    assert all(r["cap"] == r["divisor"] and r["modules"] for r in applied)  # the tanh divides by the field's value


def test_laguna_router_cap_off_at_zero_applied_when_set(cli):
    """0.0 is Laguna's default and its code skips the cap: off, never 'applied … = 0'; set, it runs in the router."""
    (off,) = _audit(cli, "--model-type", "laguna", "--attn", "eager")["config"]
    assert (off["status"], off["cap"], off["applied_by"]) == ("off", 0.0, "")
    data = _audit(cli, "--model-type", "laguna", "--set", "moe_router_logit_softcapping=20", "--attn", "eager")
    (on,) = data["config"]
    assert (on["status"], on["cap"], on["modules"], on["eager"]) == ("applied", 20.0, "model.layers.*.mlp.gate", "applied")
    assert {r["module"].split(".")[-1] for r in data["rows"]} == {"gate"} and {r["cap"] for r in data["rows"]} == {20.0}


def test_inkling2_eager_cap_is_one_row(cli):
    data = _audit(cli, "--model-type", "inkling2_text", "--attn", "eager")
    final = [r for r in data["rows"] if r["field"] == "final_logit_softcapping"]
    assert [(r["module"], r["dtype"], r["path"]) for r in final] == [("logit_softcap", "float32", "torch-eager-cpu")]
    assert not [r for r in data["rows"] if r["module"].startswith("(inside")]
    assert _caps(data) == {"mlp_gate_softcap": "applied", "mlp_up_softcap": "applied", "final_logit_softcapping": "applied"}


LAGUNA_GATE = {
    "module": "model.layers.*.self_attn", "fn": "softplus", "source": "linear model.layers.*.self_attn.g_proj.weight",
    "shape": "(batch, tokens, heads)", "broadcast": "head_dim", "runs_in": "float32", "cast_to": "bfloat16",
    "consumer": "mul → (batch, tokens, heads, head_dim)", "reader": "model.layers.*.self_attn.o_proj.weight",
}


def test_laguna_gate_contract_as_the_document_gives_it(cli):
    gates = _audit(cli, "--model-type", "laguna", "--attn", "eager")["gates"]
    (gate,) = [g for g in gates if g["fn"] == "softplus"]
    assert {k: gate[k] for k in LAGUNA_GATE} == LAGUNA_GATE
    (router,) = [g for g in gates if g["fn"] == "sigmoid"]
    assert router["reader"] == "topk" and router["shape"] == "(batch·tokens, experts)"
    per_element = _audit(cli, "--model-type", "laguna", "--set", "gating=per-element", "--attn", "eager")["gates"]
    (gate,) = [g for g in per_element if g["fn"] == "softplus"]
    assert gate["broadcast"] == "" and gate["consumer"] == f"mul → {gate['shape']}"  # one value per channel
    assert gate["shape"] == "(batch, tokens, channels)" and gate["cast_to"] == "bfloat16"


def test_gemma4_text_has_no_gate(cli):
    """The document's control case: hybrid attention like Laguna's, no softplus (nor sigmoid) gate."""
    data = _audit(cli, "--model-type", "gemma4_text", "--attn", "eager")
    assert data["gates"] == []


def test_missing_package_is_one_line(cli):
    import importlib.util

    if importlib.util.find_spec("timm") is not None:
        pytest.skip("timm is installed here")
    code, _, out, err = cli("audit-model", "--model-type", "edgetam_vision_model")  # its backbone is timm's alone
    assert code == 2 and out == "" and err.strip().count("\n") == 0 and "timm" in err


@pytest.mark.parametrize("sets, needle", [
    (("num_hidden_layers=10000000",), "refused before building"),
    (("hidden_size=1000000000",), "refused before building"),
    (("hidden_size=-3",), "hidden_size"),
])
def test_sizes_and_bad_sets_refused_before_building(cli, monkeypatch, sets, needle):
    monkeypatch.setattr(audit, "build", lambda *a, **k: pytest.fail("built a model it should have refused"))
    args = [x for s in sets for x in ("--set", s)]
    code, _, out, err = cli("audit-model", "--model-type", "gemma2", *args)
    assert code == 2 and out == "" and needle in err and err.strip().count("\n") == 0


def test_size_estimate_is_an_upper_order():
    config = audit.model_type_config("gemma2", {})
    model = audit.build(audit.Source(config, None, False), config, "eager", torch.float32)
    real = sum(p.numel() for p in model.parameters())
    assert real <= tiny.parameters_estimate(config) <= 4 * real


def test_unreadable_weights_exit_2(cli, tmp_path):
    config = audit.model_type_config("gemma2", {})
    config.save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    code, _, out, err = cli("audit-model", str(tmp_path), "--attn", "eager")
    assert code == 2 and out == "" and "not a safetensors file" in err and len(err.strip().splitlines()) == 1


def test_census_of_the_sample(tmp_path):
    """The issue's sample through the census: every one audited, the caps as found above, the files deterministic."""
    result = census.census(SAMPLE)
    rows = {r.model_type: r for r in result.rows}
    assert {m: r.status for m, r in rows.items()} == dict.fromkeys(SAMPLE, "audited")
    caps = {m: {c["field"]: (c["status"], c["eager"], c["sdpa"]) for c in r.caps} for m, r in rows.items()}
    assert caps["gemma2"] == {"final_logit_softcapping": ("applied", "applied", "refused at build"),
                              "attn_logit_softcapping": ("applied", "applied", "refused at build")}
    assert caps["t5gemma"]["encoder.final_logit_softcapping"] == ("dead config", "ignored", "refused at build")
    assert caps["laguna"] == {"moe_router_logit_softcapping": ("off", "off", "off")}
    assert caps["nanochat"]["final_logit_softcapping"] == ("applied", "applied", "applied")  # sdpa: not in attention
    first = {m: [c["first_zero_grad_input"] for c in r.caps if c["status"] == "applied"] for m, r in rows.items()}
    assert first["gemma2"] == [104.0, 174.0]  # bf16 eager: c = 30 and c = 50
    assert not rows["gemma4_text"].gates and [g["fn"] for g in rows["laguna"].gates] == ["softplus", "sigmoid"]
    assert result.counts()["caps dead config"] == 1 and result.dead() == [("t5gemma", "encoder.final_logit_softcapping", 30.0)]
    text = census.markdown(result)
    assert "| laguna | moe_router_logit_softcapping | 0 | off |" in text
    again = census.census(["laguna"])
    assert json.dumps(census.as_dict(again)["rows"]) == json.dumps([census.as_dict(result)["rows"][SAMPLE.index("laguna")]])


# The model types run without an internal error (exit 3) in the suite: the census's cap types and a spread
# of gate types (MoE routers, linear attention, state-space, vision, audio). `make census` runs all of them.
NO_INTERNAL_ERROR = SAMPLE + ["gemma3n_text", "gemma3n", "t5gemma2", "inkling2", "muse_spark_text", "muse_glimmer",
                              "diffusion_gemma", "jev", "xlstm", "vaultgemma", "beam", "qwen3_next", "mamba2",
                              "deepseek_v3", "siglip", "clap", "llama4"]
SLOW = ["videoprism", "mistral_large4", "muse_spark", "inkling2_loop"]  # 10 to 60 s each here: with the census


@pytest.mark.parametrize("model_type", NO_INTERNAL_ERROR)
def test_no_internal_error(cli, model_type):
    code, out, err = _run(cli, "--model-type", model_type, "--attn", "eager")
    assert code in (0, 2), err
    if code == 2:
        assert out == "" and err.startswith("softcapgrad: error:") and err.strip().count("\n") == 0


@pytest.mark.slow
@pytest.mark.parametrize("model_type", SLOW)
def test_no_internal_error_slow(cli, model_type):
    test_no_internal_error(cli, model_type)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("SOFTCAPGRAD_EVERY_MODEL_TYPE"),
                    reason="about 2 minutes: set SOFTCAPGRAD_EVERY_MODEL_TYPE=1 (the census runs them all too)")
def test_every_candidate_model_type_without_an_internal_error(cli):
    """audit-model on every model type the census runs (all 322 with transformers 5.24.0): an answer or one line."""
    bad = []
    for candidate in census.candidates():
        code, _, out, err = cli("audit-model", "--model-type", candidate.model_type, "--attn", "eager", "--attn", "sdpa")
        if code not in (0, 2) or (code == 2 and err.strip().count("\n") != 0):
            bad.append((candidate.model_type, code, err.strip()[-300:]))
    assert bad == []
