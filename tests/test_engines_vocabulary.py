"""The stand-in tokenizer: every id is its own piece in both formats, the specials sit where the config says,
and the bytes do not depend on the process that wrote them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from softcapgrad.engines.forward.vocabulary import FILES, vocabulary, write_tokenizer

pytest.importorskip("sentencepiece")
pytest.importorskip("tokenizers")

GEMMA = {"vocab_size": 300, "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}


def test_specials_take_the_config_ids_and_unk_the_first_free_id():
    vocab = vocabulary(GEMMA)
    assert vocab.special == {"pad": 0, "eos": 1, "bos": 2, "unk": 3}
    assert vocab.pieces[:5] == ("<pad>", "<eos>", "<bos>", "<unk>", "<t4>")
    listed = vocabulary({"text_config": {"vocab_size": 10, "eos_token_id": [1, 7], "bos_token_id": 2,
                                         "pad_token_id": 0, "unk_token_id": 9}})
    assert listed.special == {"pad": 0, "eos": 1, "bos": 2, "unk": 9} and listed.pieces[7] == "<t7>"
    shared = vocabulary({"vocab_size": 8, "pad_token_id": 1, "eos_token_id": 1, "bos_token_id": 2})
    assert shared.pieces[1] == "<pad>" and shared.special["unk"] == 0


def test_sentencepiece_model_round_trips_every_id(tmp_path):
    import sentencepiece

    write_tokenizer(tmp_path, GEMMA)
    sp = sentencepiece.SentencePieceProcessor(model_file=str(tmp_path / "tokenizer.model"))
    assert sp.vocab_size() == 300
    assert (sp.pad_id(), sp.eos_id(), sp.bos_id(), sp.unk_id()) == (0, 1, 2, 3)
    assert [sp.piece_to_id(sp.id_to_piece(i)) for i in range(300)] == list(range(300))
    normal = list(range(4, 300))
    assert sp.encode(sp.decode(normal)) == normal
    assert sp.encode("<t12><t4><t299>") == [12, 4, 299]
    assert all(sp.is_control(i) for i in (0, 1, 2)) and sp.is_unknown(3) and not sp.is_control(4)


def test_tokenizer_json_round_trips_every_id_with_transformers(tmp_path):
    from transformers import AutoTokenizer

    write_tokenizer(tmp_path, GEMMA)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    ids = list(range(300))
    assert tok.decode([5, 9, 0]) == "<t5><t9><pad>"
    assert tok(tok.decode(ids), add_special_tokens=False)["input_ids"] == ids
    assert tok("<t5> <t9>", add_special_tokens=False)["input_ids"] == [5, 9]
    assert (tok.pad_token_id, tok.eos_token_id, tok.bos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert tok.convert_ids_to_tokens([5, 299]) == ["<t5>", "<t299>"]


def _write_in_child(folder, seed: str) -> dict:
    code = ("import sys, json; from pathlib import Path; "
            "from softcapgrad.engines.forward.vocabulary import write_tokenizer;"
            "write_tokenizer(Path(sys.argv[1]), json.loads(sys.argv[2]))")
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")}
    env["PYTHONHASHSEED"] = seed
    subprocess.run([sys.executable, "-I", "-c", code, str(folder), json.dumps(GEMMA)], check=True, env=env,
                   cwd=folder, timeout=120)
    return {name: (folder / name).read_bytes() for name in FILES}


def test_bytes_are_the_same_from_two_processes_with_different_hash_seeds(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert _write_in_child(tmp_path / "a", "1") == _write_in_child(tmp_path / "b", "2")
