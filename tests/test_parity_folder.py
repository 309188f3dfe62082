"""parity DIR: the folder as it is (its weights as saved, its tokenizer, real text), --bind, and its refusals.

The live tests run the main environment's engines (no build) on a tiny Gemma 2 saved to a temporary folder with a
byte-level tokenizer.json of its own; bad input is one line and exit 2 before any engine runs."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

pytest.importorskip("transformers")

from softcapgrad.engines.forward import folder, parity, parity_run  # noqa: E402
from softcapgrad.engines.forward import reference as ref  # noqa: E402
from softcapgrad.models import audit  # noqa: E402

TOKENS = "24"  # of the shipped prompts: the live runs stay short


def _tokenizer(path):
    """A byte-level BPE without merges: every byte of the text one token, ids 0..255."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.save(str(path / "tokenizer.json"))


def _folder(path, final=1000.0, attention=1000.0, queries=1.0, head=1.0, dtype="float32", tokenizer=True):
    """A tiny Gemma 2 as a user saves it: transformers' own init, its queries and final norm's gain scaled."""
    import torch
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    config = Gemma2Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=32, query_pre_attn_scalar=32,
                          max_position_embeddings=128, final_logit_softcapping=final, attn_logit_softcapping=attention)
    model = Gemma2ForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(queries)
        model.model.norm.weight.fill_(head - 1)  # Gemma's norm multiplies by (1 + w)
    model.to(getattr(torch, dtype)).save_pretrained(path)
    if tokenizer:
        _tokenizer(path)
    return path


@pytest.fixture
def no_engine(monkeypatch):
    """Refusals come before any engine runs: measuring anything fails the test."""
    def measure_all(*args, **kwargs):
        raise AssertionError("an engine ran")
    monkeypatch.setattr(parity_run, "measure_all", measure_all)


def _refused(cli, *args) -> str:
    code, _, out, err = cli("parity", *args)
    lines = (out + err).strip().splitlines()
    assert code == 2 and len(lines) == 1, (code, out, err)
    return lines[0]


# --- the folder as it is -------------------------------------------------------------------------------------------


def test_caps_that_do_not_bind_on_the_shipped_prompts_are_not_exercised(cli, tmp_path):
    """Caps of 1000 on transformers' own small init: |a/c| stays orders of magnitude below the knees. bf16 weights go
    to the engine as saved; the answer says the caps were not exercised, never applied, and exits 4 (none judged)."""
    model = _folder(tmp_path / "m", dtype="bfloat16")
    code, data, out, err = cli("parity", str(model), "--engine", "transformers", "--seq-len", TOKENS, "--json")
    assert code == 4, (out, err)
    assert {r["verdict"] for r in data["rows"]} == {"not exercised on these inputs"}, data["rows"]
    assert all(r["error"] <= r["tolerance"] for r in data["rows"])  # the engine matches transformers on the model
    assert data["answer"][0].startswith("No cap was exercised on these inputs, so none was judged")
    assert "as saved, on the 5 prompts shipped with softcapgrad" in data["answer"][0]
    assert "matching transformers on the model: transformers (default), transformers (eager)" in data["answer"][1]
    assert data["params"]["seq_len"] == int(TOKENS) and data["params"]["bind"] is False


def test_caps_that_bind_are_judged_and_counted_past_the_first_zero(cli, tmp_path):
    """Caps of 0.5 and 0.05 with the queries and the final gain scaled up: both past the knee, applied by
    transformers; the final logits at or past fp32's first zero of the gradient are counted as a plain forward
    without the final cap counts them."""
    import torch
    from transformers import AutoModelForCausalLM

    model = _folder(tmp_path / "m", final=0.5, attention=0.05, queries=30.0, head=8.0)
    code, data, out, err = cli("parity", str(model), "--engine", "transformers", "--seq-len", TOKENS, "--json")
    assert code == 0, (out, err)
    assert {(r["cap"], r["verdict"]) for r in data["rows"]} == {("attention", "applied"), ("final", "applied")}
    ids = folder.inputs(audit.source(model, None, []), *folder.prompts_given(None, None), int(TOKENS), 0).ids
    loaded = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32, attn_implementation="eager")
    loaded.config.final_logit_softcapping = None
    with torch.no_grad():
        a = loaded(input_ids=torch.as_tensor(ids)[None]).logits[0]
    past = int(((a.abs() / 0.5) >= ref.first_zero()).sum())
    assert past > 0 and f"final {past:,} of {a.numel():,}" in data["answer"][0], data["answer"][0]
    assert float((a.abs() / 0.5).max()) == pytest.approx(data["rows"][1]["reach"], rel=1e-6)


def test_the_engines_get_the_folders_files_unchanged_but_for_the_caps(tmp_path):
    model = _folder(tmp_path / "m", dtype="bfloat16")
    src = audit.source(model, None, [])
    for name, off in (("capped", ()), ("final-off", ("final",)), ("uncapped", ref.CAPS)):
        out = folder.write(src, tmp_path / name, off, tokenizer=True)
        assert (out / "model.safetensors").read_bytes() == (model / "model.safetensors").read_bytes()
        assert (out / "tokenizer.json").read_bytes() == (model / "tokenizer.json").read_bytes()
    configs = {name: json.loads((tmp_path / name / "config.json").read_text()) for name in ("capped", "final-off",
                                                                                          "uncapped")}
    fields = ("final_logit_softcapping", "attn_logit_softcapping")
    assert [(c[fields[0]], c[fields[1]]) for c in configs.values()] == [(1000.0, 1000.0), (None, 1000.0), (None, None)]
    rest = [{k: v for k, v in c.items() if k not in fields} for c in configs.values()]
    assert rest[0] == rest[1] == rest[2] and rest[0]["dtype"] == "bfloat16"


def test_bind_keeps_the_check_bound_by_construction(tmp_path):
    """--bind prepares the folder as every run did before it: random ids, the weights rescaled to |a/c| = 4."""
    src = audit.source(_folder(tmp_path / "m"), None, [])
    bound = folder.Inputs(None, "bound", tokenizer=False, bound=True)
    for name in ("old", "new"):
        (tmp_path / name).mkdir()
    old, new = (parity._prepare(src, 12, 0, tmp_path / w, i)[0] for w, i in (("old", None), ("new", bound)))
    assert new.scales == old.scales and set(new.scales) == {"queries of layer 0", "queries of layer 1", "final norm"}
    assert all(np.array_equal(new.logits[v], old.logits[v]) for v in old.logits)
    assert new.reach == pytest.approx({"attention": ref.TARGET, "final": ref.TARGET}, rel=1e-3)


def test_bind_says_what_it_rescaled(cli, tmp_path):
    code, data, out, err = cli("parity", str(_folder(tmp_path / "m")), "--bind", "--engine", "transformers", "--json")
    assert code == 0, (out, err)
    assert {r["verdict"] for r in data["rows"]} == {"applied"}
    assert "the weights rescaled so that each cap reaches |a/c| = 4 (--bind): rescaled queries of layer 0 ×" \
        in data["answer"][0] and "final norm ×" in data["answer"][0]


def test_the_knees_are_where_the_cap_changes_its_input_by_the_rows_allowance():
    from softcapgrad.engines.forward.judging import FP32, K, knee

    x = knee(K * FP32, relative=False)
    assert x - math.tanh(x) == pytest.approx(K * FP32, rel=1e-9) and x == pytest.approx((3 * K * FP32) ** (1 / 3),
                                                                                       rel=1e-4)
    y = knee(128 * FP32, relative=True)
    assert 1 - math.tanh(y) / y == pytest.approx(128 * FP32, rel=1e-6) and y == pytest.approx((3 * 128 * FP32) ** .5,
                                                                                             rel=1e-4)
    assert knee(1.5, relative=True) == math.inf  # a relative change stays below 1


# --- bad input: one line, exit 2, before any engine runs ----------------------------------------------------------


def test_a_folder_without_config_json(cli, tmp_path, no_engine):
    (tmp_path / "m").mkdir()
    assert "config.json" in _refused(cli, str(tmp_path / "m"), "--engine", "transformers")


def test_a_model_type_parity_does_not_have(cli, tmp_path, no_engine):
    from transformers import LlamaConfig

    LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
                ).save_pretrained(tmp_path / "m")
    assert "parity runs gemma2" in _refused(cli, str(tmp_path / "m"), "--engine", "transformers")


def test_a_folder_without_weights_unless_bound(cli, tmp_path, no_engine):
    model = _folder(tmp_path / "m")
    (model / "model.safetensors").unlink()
    assert "holds no safetensors weights" in _refused(cli, str(model), "--engine", "transformers")
    from softcapgrad.cli import parity_runs

    src = audit.source(model, None, [])
    assert parity_runs.folder_inputs(src, None, True, None, 0).bound  # --bind draws random weights, as before


def _rewritten(model, change):
    from safetensors.torch import load_file, save_file

    tensors = load_file(model / "model.safetensors")
    change(tensors)
    save_file(tensors, model / "model.safetensors", metadata={"format": "pt"})
    return model


def test_weights_missing_a_tensor(cli, tmp_path, no_engine):
    model = _rewritten(_folder(tmp_path / "m"), lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    line = _refused(cli, str(model), "--engine", "transformers")
    assert "lack 1 tensor(s)" in line and "model.layers.1.mlp.up_proj.weight" in line


def test_weights_with_a_tensor_of_the_wrong_shape(cli, tmp_path, no_engine):
    import torch

    model = _rewritten(_folder(tmp_path / "m"), lambda t: t.update({"model.norm.weight": torch.zeros(65)}))
    assert "has shape [65]" in _refused(cli, str(model), "--engine", "transformers")


def test_a_tokenizer_json_that_does_not_load(cli, tmp_path, no_engine):
    model = _folder(tmp_path / "m")
    (model / "tokenizer.json").write_text('{"model": {"type": "nosuch"}}', encoding="utf-8")
    assert "cannot load the tokenizer" in _refused(cli, str(model), "--engine", "transformers")


def test_a_tokenizer_of_another_vocabulary(cli, tmp_path, no_engine):
    from tokenizers import Tokenizer

    model = _folder(tmp_path / "m")
    tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
    tokenizer.add_tokens(["<beyond>"])  # id 256, past the model's vocabulary of 256
    tokenizer.save(str(model / "tokenizer.json"))
    line = _refused(cli, str(model), "--engine", "transformers", "--prompt", "a <beyond> b")
    assert "gives token id 256, beyond the model's vocabulary of 256" in line


def test_a_folder_larger_than_memory(cli, tmp_path, no_engine, monkeypatch):
    from softcapgrad.models import sizes

    model = _folder(tmp_path / "m")
    n, _ = folder.header_size(model)
    monkeypatch.setattr(sizes, "available_bytes", lambda: 4 * n * (1 + folder.COPIES) - 1)  # one byte short
    line = _refused(cli, str(model), "--engine", "transformers")
    assert f"hold {n:,} parameters" in line and "refused before loading" in line


@pytest.mark.parametrize("content, said", [(b"", "holds no prompt"), (b"\n  \n", "holds no prompt"),
                                           (b"text\x00\x01\x02", "not text"), (b"caf\xe9\n", "not UTF-8 text")])
def test_a_prompts_file_that_is_empty_or_not_text(cli, tmp_path, no_engine, content, said):
    model = _folder(tmp_path / "m")
    (tmp_path / "p.txt").write_bytes(content)
    assert said in _refused(cli, str(model), "--engine", "transformers", "--prompts", str(tmp_path / "p.txt"))


def test_prompts_need_a_folder_its_tokenizer_and_no_bind(cli, tmp_path, no_engine):
    assert "without a model directory run as saved" in _refused(cli, "--engine", "transformers", "--prompt", "hi")
    model = _folder(tmp_path / "m", tokenizer=False)
    assert "without a model directory run as saved" in _refused(cli, str(model), "--bind", "--prompt", "hi")
    assert "has no tokenizer.json" in _refused(cli, str(model), "--engine", "transformers", "--prompt", "hi")


def test_a_run_whose_every_cap_is_undecided_or_not_exercised_says_so_first_and_exits_4():
    """A saved model whose final cap is reached just past its knee but undecided in every route's precision, and whose
    attention cap is not exercised: the answer's first sentence says no cap was judged (never "applied every cap"), and
    the exit code is NO_VERDICT, as for a run in which no engine ran."""
    from softcapgrad.cli.parity_report import answer_of, judged

    rows = [{"engine": e, "route": "default", "model": "m", "cap": cap, "verdict": verdict, "hint": ""}
            for e in ("transformers", "torchexport")
            for cap, verdict in (("attention", "not exercised on these inputs"), ("final", "not bound"))]
    data = {"rows": rows, "models": [{"model": "m", "reach": {"attention": 0.0005, "final": 0.0186}}], "engines": []}
    assert not judged(rows)
    first = answer_of(data)[0]
    assert first.startswith("No cap was judged: each was undecided in its route's precision or not exercised"), first
