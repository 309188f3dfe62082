"""train-parity DIR (a saved model's folder, trained as saved) and train-parity --engine X --python PATH.

The folders are parity's tiny Gemma 2 saved to tmp_path: one whose caps bind (parity's binding, done before
saving, on the ids a folder without tokenizer.json is given: seed 0, 16 tokens), one whose caps are set so large
that they never bind on the shipped text. Each live run is cut to one route (the plain loss.backward() route of
the main environment, or peft LoRA in the train-peft environment) on the capped folder alone, to stay within
seconds.
"""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest

pytest.importorskip("transformers")

from softcapgrad.engines.forward import modeltypes  # noqa: E402
from softcapgrad.engines.forward import reference as ref  # noqa: E402
from softcapgrad.engines.training import parity as train_parity  # noqa: E402
from softcapgrad.engines.training import verdict as tv  # noqa: E402
from softcapgrad.models import audit  # noqa: E402

LOOP = next(r for r in train_parity.TRAINER_ROUTES if r.id == "loop-default")


def _tokenizer(folder) -> int:
    """A word-level tokenizer.json over the shipped text's words (ids 4 up; 0-3 pad, eos, bos, unk): its size."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from softcapgrad.models.gate_audit import TEXT

    words = sorted(set(re.findall(r"\w+|[^\w\s]", TEXT)))
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, **{w: i + 4 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))
    return len(vocab)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("saved")
    src = audit.source(None, modeltypes.model_type("gemma2"), ref.tiny_sets("gemma2"))
    model = ref.build(src, 0)
    ids = audit.random_ids(src.config, 1, 16, 0).numpy().reshape(-1)
    ref.bind(model, ids)
    ref.save(model, root / "bound")
    loose = audit.source(None, modeltypes.model_type("gemma2"), ref.tiny_sets("gemma2")
                         + ["final_logit_softcapping=10000.0", "attn_logit_softcapping=10000.0"])
    ref.save(ref.build(loose, 0), root / "loose")
    _tokenizer(root / "loose")
    return root


def _run(cli, *args):
    code, data, out, err = cli("train-parity", *args, "--json")
    assert code in (0, 1), (code, out[-2000:], err[-2000:])
    return data


def _one_route(monkeypatch, route=LOOP):
    """One route, on the capped folder alone: the first-zero folders (sweeps, head rows, attention) are
    test_train_parity.py's, and each adds a step to the route's child."""
    monkeypatch.setattr(train_parity, "routes", lambda engine: (route,))
    monkeypatch.setattr(train_parity, "sweep_folders", lambda *args: [])
    monkeypatch.setattr(train_parity, "attention_folder", lambda *args: [])
    monkeypatch.setattr(train_parity, "row_folder", lambda *args: None)


def test_a_saved_folder_whose_caps_bind_trains_with_both_caps_applied(cli, folders, monkeypatch):
    """No tokenizer.json: 16 ids from seed 0, the ids the folder was bound on, so each cap's measured reach is
    parity's target exactly (the weights were not scaled again); the plain backward route applies both caps."""
    _one_route(monkeypatch)
    data = _run(cli, str(folders / "bound"), "--engine", "transformers")
    verdicts = {r["cap"]: r["verdict"] for r in data["rows"]}
    assert verdicts == {"attention": tv.APPLIED, "final": tv.APPLIED}, data["rows"]
    answer = " ".join(data["answer"])
    assert "16 token ids drawn from seed 0" in answer and "its weights as saved, not scaled" in answer
    assert f"attention {ref.TARGET:.3g}, final {ref.TARGET:.3g}" in answer, answer
    assert data["params"]["model_types"] == [str(folders / "bound")] and data["params"]["seq_len"] == 16


def test_caps_that_never_bind_on_the_prompts_get_no_applied_verdict(cli, folders, monkeypatch, tmp_path):
    """Caps of 10,000 on logits and scores of a few units: switching either off moves nothing beyond fp32's
    tolerance, so each row is not bound, says why, and the answer says the caps do not bind; the prompts are
    read through the folder's tokenizer."""
    _one_route(monkeypatch)
    lines = ["The river was low that autumn.", "", "Children walked out to them at dusk."]
    (tmp_path / "prompts.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    data = _run(cli, str(folders / "loose"), "--engine", "transformers", "--prompts", str(tmp_path / "prompts.txt"),
                "--out", str(tmp_path / "out"))
    rows = data["rows"]
    assert [r["verdict"] for r in rows] == [tv.NOT_BOUND, tv.NOT_BOUND], rows
    written = json.loads((tmp_path / "out" / "train-parity.json").read_text(encoding="utf-8"))
    assert all(r["hint"].startswith(tv.UNBOUND) for r in written["rows"]), written["rows"]
    (model,) = written["models"]
    assert model["scales"] == {} and all(0 < v < 1e-3 for v in model["reach"].values()), model
    from tokenizers import Tokenizer

    n = len(Tokenizer.from_file(str(folders / "loose" / "tokenizer.json")).encode(
        "\n".join(line for line in lines if line)).ids)
    assert model["tokens"] == n and model["inputs"].startswith("2 prompts joined by newlines"), model
    assert data["answer"][0].startswith("No cap was judged applied or not")
    assert "The attention and final caps do not bind there" in data["answer"][1], data["answer"]


def _refused(cli, *args):
    code, _, out, err = cli("train-parity", *args)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, (code, out, err)
    return err


@pytest.fixture
def no_route(monkeypatch):
    def ran(*args, **kwargs):
        pytest.fail("a route ran on bad input")

    monkeypatch.setattr(train_parity, "measure", ran)


def _copy_without(folders, tmp_path, change):
    """The bound folder with its weights rewritten by ``change`` (a dict of tensors -> a dict of tensors)."""
    from safetensors.torch import load_file, save_file

    folder = shutil.copytree(folders / "bound", tmp_path / "changed")
    tensors = change(load_file(str(folder / "model.safetensors")))
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def test_bad_folders_are_one_line_before_any_route(cli, folders, tmp_path, no_route):
    (tmp_path / "empty").mkdir()
    assert "no config.json there" in _refused(cli, str(tmp_path / "empty"), "--engine", "transformers")
    short = _copy_without(folders, tmp_path, lambda t: {k: v for k, v in t.items() if not k.endswith("model.norm.weight")})
    assert "the weights lack 1 tensor(s) of the model (such as model.norm.weight)" in _refused(
        cli, str(short), "--engine", "transformers")
    shutil.rmtree(short)
    wide = _copy_without(folders, tmp_path, lambda t: {k: (v[:, :-1].contiguous() if k.endswith("q_proj.weight") else v)
                                                       for k, v in t.items()})
    assert "has shape" in _refused(cli, str(wide), "--engine", "transformers")
    said = _refused(cli, str(folders / "bound"), "--engine", "torchtune", "--engine", "penzai", "--model-type", "x")
    assert "--model-type does not go with a model directory" in said


def test_a_model_type_no_engine_asked_has_is_refused(cli, tmp_path, no_route):
    src = audit.source(None, modeltypes.model_type("gemma3_text"), ref.tiny_sets("gemma3_text"))
    ref.save(ref.build(src, 0), tmp_path / "g3")
    said = _refused(cli, str(tmp_path / "g3"), "--engine", "torchtune", "--engine", "penzai")
    assert "the folder is gemma3_text, which torchtune, penzai have no model for" in said, said


def test_bad_prompts_files_are_one_line(cli, folders, tmp_path, no_route):
    cases = {"empty.txt": b"", "blank.txt": b"\n  \n", "binary.txt": b"\x89PNG\r\n\x1a\n\x00\x00\xff",
             "nul.txt": b"one\x00two\n"}
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        said = _refused(cli, str(folders / "loose"), "--engine", "transformers", "--prompts", str(tmp_path / name))
        assert f"--prompts {tmp_path / name}: " in said and ("no prompt" in said or "text" in said), said
    said = _refused(cli, str(folders / "bound"), "--engine", "transformers", "--prompts", str(tmp_path / "nul.txt"))
    assert "holds NUL bytes" in said  # read before the folder: a bad file is said first
    (tmp_path / "ok.txt").write_text("hello\n", encoding="utf-8")
    said = _refused(cli, str(folders / "bound"), "--engine", "transformers", "--prompts", str(tmp_path / "ok.txt"))
    assert "has no tokenizer.json, so its prompts cannot be tokenized" in said
    assert "--prompts needs a model directory" in _refused(cli, "--prompts", str(tmp_path / "ok.txt"))


def test_the_inputs_are_the_texts_first_tokens_and_a_foreign_tokenizer_is_refused(folders):
    """--seq-len keeps the first tokens of the tokenized text and says how many there were; a tokenizer whose ids
    pass the model's vocabulary is not this model's."""
    from tokenizers import Tokenizer

    from softcapgrad.engines.training import folder
    from softcapgrad.models.gate_audit import TEXT

    src = audit.source(folders / "loose", None, [])
    every = Tokenizer.from_file(str(folders / "loose" / "tokenizer.json")).encode(TEXT).ids
    ids, said = folder.inputs(folders / "loose", src.config, None, 5, 0)
    assert ids.tolist() == every[:5] and said.endswith(f"({len(every)} tokens, the first 5 kept)"), said
    ids, said = folder.inputs(folders / "loose", src.config, None, None, 0)
    assert ids.tolist() == every[:folder.MAX_TOKENS] and "kept" not in said
    config = type(src.config).from_dict({**src.config.to_dict(), "vocab_size": 64})
    with pytest.raises(folder.InputError, match="beyond the model's vocabulary of 64"):
        folder.inputs(folders / "loose", config, None, None, 0)


def test_bad_python_paths_are_one_line_before_anything_else(cli, folders, tmp_path, monkeypatch):
    def first(*args, **kwargs):
        pytest.fail("the run went past its paths")

    monkeypatch.setattr(audit, "source", first)
    (tmp_path / "folder").mkdir()
    (tmp_path / "plain").write_text("#!/bin/sh\n")
    for what, said in (("missing", "no such file"), ("folder", "is a folder, not an interpreter"),
                       ("plain", "not executable")):
        err = _refused(cli, str(folders / "bound"), "--engine", "transformers", "--python", str(tmp_path / what))
        assert f"--python {tmp_path / what}: {said}" in err, err
    assert "--python" in _refused(cli, str(folders / "bound"), "--engine", "transformers", "--python", "")
    monkeypatch.undo()
    for args, said in ((["--python", os.sys.executable], "give exactly one --engine NAME"),
                       (["--engine", "transformers", "--engine", "peft-trl", "--python", os.sys.executable],
                        "exactly one"),
                       (["--engine", "transformers", "--python", os.sys.executable, "--install"], "--install does not")):
        assert said in _refused(cli, str(folders / "bound"), *args)


def test_the_python_given_is_recorded_without_the_home_folder(cli, folders, monkeypatch):
    """params' python is cleaned as parity cleans its paths (parity.private): an interpreter under the home folder
    is written from ``~/``, so the results name no user's folder. Home is this interpreter's grandparent folder
    here, so the path the test gives is under it; the route runs with it as any --python run does."""
    from pathlib import Path

    _one_route(monkeypatch)
    python = Path(os.sys.executable)
    home = python.parents[2]
    monkeypatch.setattr(Path, "home", classmethod(lambda cls: home))
    data = _run(cli, str(folders / "bound"), "--engine", "transformers", "--python", str(python))
    assert data["params"]["python"] == f"~/{python.relative_to(home)}" != str(python)


@pytest.mark.slow
@pytest.mark.engine_environments("train-peft")
def test_python_runs_the_engine_with_the_interpreter_given_and_records_it(cli, folders, monkeypatch, tmp_path,
                                                                          engine_environment):
    """peft LoRA with the train-peft environment's interpreter passed by path: the route runs there, its row is
    judged as the environment's own run is (both caps applied), and every record names the interpreter."""
    from softcapgrad.engines.forward.parity import private

    env = engine_environment("train-peft")
    _one_route(monkeypatch, next(r for r in train_parity.LIBRARY_ROUTES if r.id == "lora"))
    data = _run(cli, str(folders / "bound"), "--engine", "peft-trl", "--python", str(env.python),
                "--out", str(tmp_path / "out"))
    assert [r["verdict"] for r in data["rows"]] == [tv.APPLIED, tv.APPLIED], data["rows"]
    assert data["params"]["python"] == private(str(env.python))
    written = json.loads((tmp_path / "out" / "train-parity.json").read_text(encoding="utf-8"))
    (route,) = written["routes"]
    shown = private(str(env.python))  # the file writes the engines cache as <engines> (parity.private)
    assert route["interpreter"] == shown and route["environment"] == f"--python {shown}"
    assert route["versions"]["peft"] == env.versions["peft"] and route["python"].split()[0].count(".") == 2
    recorded = written["provenance"]["environments"]["train-peft"]
    assert recorded["given"] and recorded["packages"]["peft"] == env.versions["peft"]
