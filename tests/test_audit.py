"""audit-model on transformers' own model classes: live, dead and refused caps as the installed version behaves.

These pin transformers 5.24.0's behaviour, found by running it: an upgrade that changes which
implementation applies, ignores or refuses a cap fails here.
"""

import json
import struct

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from softcapgrad.models import audit  # noqa: E402

EAGER_SDPA = ("--attn", "eager", "--attn", "sdpa")
GEMMA2 = ("--model-type", "gemma2", "--set", "final_logit_softcapping=30", "--set", "attn_logit_softcapping=50")


def _audit(cli, *args):
    code, data, out, err = cli("audit-model", *args, "--json")
    assert code == 0, err
    return data


def _verdicts(data) -> dict:
    return {r["field"]: (r["status"], {k: r[k] for k in r if k in audit.IMPLEMENTATIONS}) for r in data["config"]}


def _runs(data) -> dict:
    return {r["implementation"]: r["status"] for r in data["implementations"]}


def test_gemma2_both_caps_live_sdpa_refused(cli):
    data = _audit(cli, *GEMMA2, *EAGER_SDPA, "--scale-logits", "400")
    assert _verdicts(data) == {
        "final_logit_softcapping": ("applied", {"eager": "applied", "sdpa": "refused at build"}),
        "attn_logit_softcapping": ("applied", {"eager": "applied", "sdpa": "refused at build"}),
    }
    assert _runs(data) == {"eager": "ran", "sdpa": "refused at build"}
    sdpa = next(r for r in data["implementations"] if r["implementation"] == "sdpa")
    assert "scaled_dot_product_attention" in sdpa["reason"]
    sites = {r["module"]: r for r in data["rows"]}
    assert set(sites) == {"model.layers.0.self_attn", "model.layers.1.self_attn", "Gemma2ForCausalLM"}
    final = sites["Gemma2ForCausalLM"]
    assert (final["caps"], final["cap"], final["dtype"], final["first_zero_grad_input"]) == ("final logits", 30.0, "bfloat16", 104.0)
    assert final["fraction"] == final["saturated"] / final["count"] > 0  # ×400 makes the head confident
    assert final["zero_grad"] > 0 and final["max_abs"] >= 104.0
    assert sites["model.layers.0.self_attn"]["first_zero_grad_input"] == 174.0
    assert "Gemma2ForCausalLM" in data["answer"][0] and "refused by sdpa" in data["answer"][0]


def test_gemma3_attention_cap_is_dead_config(cli):
    data = _audit(cli, "--model-type", "gemma3_text", "--set", "final_logit_softcapping=30",
                  "--set", "attn_logit_softcapping=50", *EAGER_SDPA)
    assert _verdicts(data) == {
        "final_logit_softcapping": ("applied", {"eager": "applied", "sdpa": "applied"}),
        "attn_logit_softcapping": ("dead config", {"eager": "ignored", "sdpa": "ignored"}),
    }
    assert "dead config" in data["answer"][0] and "attn_logit_softcapping = 50" in data["answer"][0]


def test_t5gemma_encoder_final_cap_is_dead_config(cli):
    data = _audit(cli, "--model-type", "t5gemma", *EAGER_SDPA)
    status = {k: v[0] for k, v in _verdicts(data).items()}
    assert status == {"encoder.final_logit_softcapping": "dead config", "encoder.attn_logit_softcapping": "applied",
                      "decoder.final_logit_softcapping": "applied", "decoder.attn_logit_softcapping": "applied"}
    assert _runs(data)["sdpa"] == "refused at build"
    kinds = {(r["module"].split(".")[1] if "." in r["module"] else "root", r["caps"]) for r in data["rows"]}
    assert kinds == {("encoder", "attention"), ("decoder", "attention"), ("root", "final logits")}


def test_vaultgemma_defaults_live(cli):
    data = _audit(cli, "--model-type", "vaultgemma", *EAGER_SDPA)
    assert {k: v[0] for k, v in _verdicts(data).items()} == {"final_logit_softcapping": "applied", "attn_logit_softcapping": "applied"}
    assert _runs(data) == {"eager": "ran", "sdpa": "refused at build"}


def test_llama_has_no_cap(cli):
    data = _audit(cli, "--model-type", "llama", *EAGER_SDPA)
    assert data["config"] == [] and data["rows"] == [] and _runs(data) == {"eager": "ran", "sdpa": "ran"}
    assert "no soft-cap" in data["answer"][0]


def test_sdpa_forced_on_gemma2_raises_on_the_cap():
    """Built eager, then switched to sdpa behind the library's back: its sdpa refuses a soft-cap at run time."""
    config = audit.model_type_config("gemma2", {"attn_logit_softcapping": 50.0})
    torch.manual_seed(0)
    model = audit.build(audit.Source(config, None, False), config, "eager", torch.float32)
    model.config._attn_implementation = "sdpa"
    with pytest.raises(ValueError, match="does not support `softcap`"):
        model(input_ids=torch.ones(1, 4, dtype=torch.long))


def test_autocast_reports_the_format_the_cap_ran_in(cli):
    data = _audit(cli, *GEMMA2, "--attn", "eager", "--dtype", "fp32", "--autocast", "bf16", "--scale-logits", "300")
    assert data["params"]["dtype"] == "float32" and data["params"]["autocast"] == "bfloat16"
    assert {r["dtype"] for r in data["rows"]} == {"bfloat16"}  # fp32 parameters, bf16 caps
    final = next(r for r in data["rows"] if r["caps"] == "final logits")
    assert final["first_zero_grad_input"] == 104.0 and final["fraction"] > 0


def test_flash_attention_reported_absent_when_not_installed(cli):
    if audit.installed("flash_attention_2"):
        pytest.skip("flash-attn is installed here")
    data = _audit(cli, "--model-type", "llama", "--attn", "flash_attention_2")
    assert _runs(data) == {"flash_attention_2": "not installed"}


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*torch.jit.script_method.* is deprecated:DeprecationWarning")
def test_gemma2_flex_attention_applies_the_cap_inside_its_kernel(cli):
    """flex_attention compiles the cap into its kernel (the monitor cannot see it; the probe can), no CPU backward."""
    data = _audit(cli, *GEMMA2, "--attn", "flex_attention")
    assert _verdicts(data) == {
        "final_logit_softcapping": ("applied", {"flex_attention": "applied"}),
        "attn_logit_softcapping": ("applied", {"flex_attention": "hidden"}),
    }
    (run,) = data["implementations"]
    if torch.cuda.is_available():
        pytest.skip("the CPU backward refusal is what this test pins")
    assert run["status"] == "forward only" and "backward on CPU" in run["reason"]
    assert "compiled region" in run["hidden"]
    hidden = [r for r in data["rows"] if r["module"] == "(inside flex_attention) model.layers.*.self_attn"]
    assert [(r["caps"], r["cap"], r["path"]) for r in hidden] == [("attention", 50.0, "flex-attention-cpu")]


def test_local_directory_with_and_without_weights(cli, tmp_path):
    config = audit.model_type_config("gemma2", {"final_logit_softcapping": 30.0})
    torch.manual_seed(3)
    model = audit.build(audit.Source(config, None, False), config, "eager", torch.float32)
    with torch.no_grad():
        model.lm_head.weight.mul_(300.0)  # a saved model whose head is confident
    config.save_pretrained(tmp_path / "config-only")
    model.save_pretrained(tmp_path / "weights")
    ids = torch.randint(0, 256, (1, 10), generator=torch.Generator().manual_seed(4))
    np.save(tmp_path / "ids.npy", ids.numpy())
    with torch.no_grad():
        a = model.lm_head(model.model(input_ids=ids).last_hidden_state).to(torch.bfloat16)
    for folder, random in (("config-only", True), ("weights", False)):
        data = _audit(cli, str(tmp_path / folder), "--attn", "eager", "--inputs", str(tmp_path / "ids.npy"), "--dtype", "fp32")
        assert data["params"]["random_weights"] is random and data["params"]["shape"] == [1, 10]
    (final,) = [r for r in data["rows"] if r["caps"] == "final logits"]
    # fp32 model: its fp32 logits, capped in fp32; same weights as saved
    with torch.no_grad():
        a = model.lm_head(model.model(input_ids=ids).last_hidden_state)
    assert final["dtype"] == "float32" and final["max_abs"] == pytest.approx(float(a.abs().max()), rel=1e-6)


@pytest.mark.parametrize("kind", [".txt", ".pt", ".npy"])
def test_token_id_files(tmp_path, kind):
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    path = tmp_path / f"ids{kind}"
    if kind == ".txt":
        path.write_text("1 2 3\n4 5 6\n")
    elif kind == ".pt":
        torch.save(ids, path)
    else:
        np.save(path, ids.numpy().astype(np.int32))
    assert torch.equal(audit.read_token_ids(path), ids)


def test_answer_leads_and_tables_fit_100_columns(cli):
    code, _, out, err = cli("audit-model", "--model-type", "t5gemma", "--attn", "eager", "--attn", "sdpa",
                            "--scale-logits", "300", env={"COLUMNS": "100"})
    assert code == 0, err
    assert "…" not in out and max(len(line) for line in out.splitlines()) <= 100
    assert out.startswith("T5GemmaForConditionalGeneration (t5gemma, bfloat16")


def test_output_is_deterministic(cli):
    args = ("audit-model", "--model-type", "vaultgemma", "--attn", "eager", "--scale-logits", "300")
    assert cli(*args)[2] == cli(*args)[2]


def test_figure_draws_the_report(cli, tmp_path):
    pytest.importorskip("matplotlib")
    from softcapgrad.ledger import figures

    code, _, _, err = cli("audit-model", *GEMMA2, "--attn", "eager", "--scale-logits", "400", "--plot", str(tmp_path / "a.png"))
    assert code == 0, err
    data = tmp_path.joinpath("a.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", data[16:24]) == (800, 450)
    from softcapgrad.models.audit_report import audit_report

    report = audit_report(audit.audit(audit.source(None, "gemma2", ["final_logit_softcapping=30"]), ["eager"],
                                            audit.Batch(torch.arange(1, 9)[None], 400.0, None, 0, "cpu"),
                                            "bfloat16"), {})
    fig = figures.audit_figure(report)
    rows = report.tables[0].rows
    assert [bar.get_width() for bar in fig.axes[0].patches] == [r["max_abs"] / r["first_zero_grad_input"] for r in rows]
    assert len(rows) == 3 and rows[-1]["fraction"] > 0


def _bad(cli, *args):
    code, _, out, err = cli("audit-model", *args)
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1 and lines[0].startswith("softcapgrad: error:"), err
    return lines[0]


@pytest.mark.parametrize(
    "args, needle",
    [
        (("--model-type", "nosuchmodel"), "--model-type"),
        (("--model-type", "gemma2", "--set", "no_such_field=1"), "no_such_field"),
        (("--model-type", "gemma2", "--set", "hidden_size"), "KEY=VALUE"),
        (("--model-type", "gemma2", "--set", "hidden_size=abc"), "hidden_size"),
        (("--model-type", "t5gemma", "--set", "decoder.nope=1"), "nope"),
        (("--model-type", "gemma2", "--attn", "paged"), "--attn"),
        (("--model-type", "gemma2", "--dtype", "fp8_e4m3fn"), "--dtype"),
        (("--model-type", "gemma2", "--scale-logits", "0"), "--scale-logits"),
        (("--model-type", "gemma2", "--seq-len", "0"), "--seq-len"),
        ((), "model directory"),
        (("--model-type", "gemma2", "--inputs", "ids.txt", "--seq-len", "8"), "--seq-len does not apply"),
        (("--model-type", "gemma2", "--autocast", "bf16"), "--autocast does not apply"),
        (("--model-type", "gemma2", "--device", "tpu"), "--device"),
    ],
)
def test_bad_input_one_line_before_building(cli, monkeypatch, tmp_path, args, needle):
    monkeypatch.setattr(audit, "build", lambda *a, **k: pytest.fail("built a model for bad input"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ids.txt").write_text("1 2 3\n")
    assert needle in _bad(cli, *args)


def test_without_transformers_one_line(cli, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "transformers" else real(name, *a))
    assert "pip install 'softcapgrad[hf]'" in _bad(cli, "--model-type", "gemma2")


def test_bad_files_one_line_before_building(cli, monkeypatch, tmp_path):
    monkeypatch.setattr(audit, "build", lambda *a, **k: pytest.fail("built a model for bad input"))
    assert "no config.json" in _bad(cli, str(tmp_path))
    np.save(tmp_path / "f.npy", np.ones((2, 3), dtype=np.float32))
    assert "integer" in _bad(cli, "--model-type", "gemma2", "--inputs", str(tmp_path / "f.npy"))
    (tmp_path / "t.txt").write_text("1 2 x\n")
    assert "token ids" in _bad(cli, "--model-type", "gemma2", "--inputs", str(tmp_path / "t.txt"))
    (tmp_path / "r.txt").write_text("1 2 3\n4 5\n")
    assert "same number" in _bad(cli, "--model-type", "gemma2", "--inputs", str(tmp_path / "r.txt"))
    (tmp_path / "big.txt").write_text("1 2 999\n")
    assert "[0, 256)" in _bad(cli, "--model-type", "gemma2", "--inputs", str(tmp_path / "big.txt"))
    (tmp_path / "ids.json").write_text(json.dumps([1, 2]))
    assert "unsupported file kind" in _bad(cli, "--model-type", "gemma2", "--inputs", str(tmp_path / "ids.json"))
