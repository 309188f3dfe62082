"""audit-model on a directory without weights it can read: GGUF (or TensorFlow, Flax) weights alone are refused, as
pickled ones are (exit 2, one line, before any model is built); a directory with no weights at all runs on random
weights, and the answer says so in its second sentence, in the table view as in --json."""

import json

import pytest
from typer.testing import CliRunner

from softcapgrad.cli.app import app

pytest.importorskip("transformers")

CONFIG = {"model_type": "gemma2", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
          "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8, "max_position_embeddings": 32,
          "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0}


def folder(tmp_path, *files: str):
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    for name in files:
        (tmp_path / name).write_bytes(b"GGUF\x03\x00\x00\x00")  # never opened: the name alone refuses it
    return tmp_path


def audit(*args: str):
    result = CliRunner().invoke(app, ["audit-model", *args, "--attn", "eager", "--batch", "1", "--seq-len", "4"],
                                env={"COLUMNS": "100"})
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("name", ["model-q8_0.gguf", "tf_model.h5", "flax_model.msgpack"])
def test_weights_only_in_a_format_not_read_are_refused(tmp_path, name):
    code, out, err = audit(str(folder(tmp_path, name)))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert f"its only weights are in a format not read here ({name})" in err and "safetensors" in err


def test_no_weights_at_all_says_random_weights_in_the_answer(tmp_path):
    path = folder(tmp_path)
    code, out, err = audit(str(path))
    assert code == 0, err
    assert any(line.startswith("It ran on random weights") for line in out.splitlines()[:4])  # right after the first
    answer = " ".join(out.split("\n\n")[0].split())  # the answer, its wrapped lines joined
    assert f"It ran on random weights (seed 0): {path} holds no weights" in answer
    code, out, err = audit(str(path), "--json")
    answer = json.loads(out)["answer"]
    assert code == 0 and answer[1].startswith("It ran on random weights (seed 0)")


def test_a_model_type_is_not_said_to_be_random_weights(tmp_path):
    code, out, err = audit("--model-type", "gemma2", "--json")
    assert code == 0, err
    assert not any("random weights" in sentence for sentence in json.loads(out)["answer"])
