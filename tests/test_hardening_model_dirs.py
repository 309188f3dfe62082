"""A model directory that cannot be used is refused in one line, exit 2, before anything is built from it.

The reader (models/source.py, models/source_weights.py) is the one ``audit-model DIR``, ``parity DIR`` and
``experiment --model DIR`` share: each bad directory is checked through it, and through the commands.
"""

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from softcapgrad.core.checks import InputError
from softcapgrad.models import source as reader

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    from transformers import Gemma2Config, Gemma2ForCausalLM

    config = Gemma2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=32,
                          final_logit_softcapping=30.0, attn_logit_softcapping=50.0)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("model") / "good"
    Gemma2ForCausalLM(config).save_pretrained(folder)
    return folder


def _variant(saved: Path, where: Path, tensors=None, config=None) -> Path:
    from safetensors.torch import load_file, save_file

    folder = where / "m"
    shutil.copytree(saved, folder)
    if tensors is not None:
        save_file(tensors(load_file(saved / "model.safetensors")), folder / "model.safetensors")
    if config is not None:
        d = json.loads((folder / "config.json").read_text())
        d.update(config)
        (folder / "config.json").write_text(json.dumps(d))
    return folder


def _header(size: int, body: bytes) -> bytes:
    return size.to_bytes(8, "little") + body


def _nan(state):
    return {k: v.clone().fill_(float("nan")) if "embed" in k else v for k, v in state.items()}


def _inf(state):
    return {k: v.clone().index_fill_(0, torch.tensor([0]), float("inf")) if "q_proj" in k else v
            for k, v in state.items()}


BAD = {
    "nan": (dict(tensors=_nan), "non-finite values"),
    "inf": (dict(tensors=_inf), "non-finite values"),
    "zero": (dict(tensors=lambda s: {k: torch.zeros_like(v) for k, v in s.items()}), "every weight is zero"),
    "shape": (dict(tensors=lambda s: {k: torch.ones(3, 5) if "q_proj" in k else v for k, v in s.items()}),
              "has shape [3, 5], while config.json makes it [16, 16]"),
    "quantized": (dict(config={"quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True}}),
                  "quantization_config (bitsandbytes)"),
    "vocabulary of 2": (dict(config={"vocab_size": 2, "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 1}),
                        "a vocabulary of 2"),
}


def _refusal(folder: Path) -> str:
    with pytest.raises(InputError) as caught:
        reader.directory_config(folder, {})
    return str(caught.value)


@pytest.mark.parametrize("name", list(BAD))
def test_weights_or_config_that_cannot_be_audited_are_refused_by_the_shared_reader(saved, tmp_path, name):
    changes, needle = BAD[name]
    folder = _variant(saved, tmp_path, **changes)
    assert needle in _refusal(folder)


@pytest.mark.parametrize("header, needle", [(_header(1 << 40, b"{}"), "header too large"),
                                            (_header(12, b"{not json!!}"), "not a safetensors file"),
                                            (b"", "not a safetensors file")])
def test_a_bad_or_huge_safetensors_header_is_refused(saved, tmp_path, header, needle):
    folder = _variant(saved, tmp_path)
    (folder / "model.safetensors").write_bytes(header)
    assert needle in _refusal(folder)


def test_weights_linked_to_a_device_are_refused_not_replaced_by_random_ones(saved, tmp_path, cli):
    folder = _variant(saved, tmp_path)
    os.unlink(folder / "model.safetensors")
    os.symlink(os.devnull, folder / "model.safetensors")
    assert "is a character device, not a regular file" in _refusal(folder)
    code, _, out, err = cli("audit-model", str(folder), "--attn", "eager")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "character device" in err


def test_a_pickled_shard_an_index_names_is_never_opened(saved, tmp_path, monkeypatch):
    folder = _variant(saved, tmp_path)
    os.unlink(folder / "model.safetensors")
    (folder / "pytorch_model.bin").write_bytes(b"a pickle")
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"lm_head.weight": "pytorch_model.bin"}}))
    real_open = open

    def watched(path, *args, **kwargs):
        assert not str(path).endswith(".bin"), "a .bin file was opened"
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", watched)
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load was called"))
    assert "names the pickled shard 'pytorch_model.bin'; pickled .bin files are never opened" in _refusal(folder)


def test_pickled_weights_alone_are_refused(saved, tmp_path):
    folder = _variant(saved, tmp_path)
    os.unlink(folder / "model.safetensors")
    (folder / "pytorch_model.bin").write_bytes(b"a pickle")
    assert "its only weights are pickled (pytorch_model.bin)" in _refusal(folder)


@pytest.mark.parametrize("command", ["audit-model", "experiment"])
def test_each_command_reading_a_directory_refuses_in_one_line(saved, tmp_path, cli, command):
    folder = _variant(saved, tmp_path, tensors=_nan)
    args = (str(folder), "--attn", "eager") if command == "audit-model" else ("--model", str(folder), "--out", "none")
    code, _, out, err = cli(command, *args)
    assert code == 2 and out == "", err
    assert len(err.strip().splitlines()) == 1 and "non-finite values" in err and "0.00%" not in err


def test_a_good_directory_loads_silently_and_integer_caps_are_read_as_floats(saved, tmp_path, cli):
    folder = _variant(saved, tmp_path, config={"final_logit_softcapping": 30, "attn_logit_softcapping": 0})
    code, data, _, err = cli("audit-model", str(folder), "--attn", "eager", "--json")
    assert code == 0 and err == ""  # no loading bar: a one-line error stays one line
    assert data["params"]["random_weights"] is False
    statuses = {r["field"]: (r["cap"], r["status"]) for r in data["config"]}
    assert statuses["final_logit_softcapping"] == (30.0, "applied")
    assert statuses["attn_logit_softcapping"][1] == "off"


def test_an_attention_cap_without_attention_layers_is_said_so(cli):
    code, data, _, err = cli("audit-model", "--model-type", "gemma2", "--set", "num_hidden_layers=0", "--attn", "eager",
                             "--json")
    assert code == 0, err
    statuses = {r["field"]: r["status"] for r in data["config"]}
    assert statuses["attn_logit_softcapping"] == "no attention here"
    assert "no attention layer to apply it in: attn_logit_softcapping = 50" in data["answer"][0]


class Planted:
    def __reduce__(self):
        return (os.system, ("echo planted",))


def test_a_blocked_pickle_in_inputs_is_one_line(tmp_path, cli):
    path = tmp_path / "ids.pt"
    torch.save(Planted(), path)
    code, _, out, err = cli("audit-model", "--model-type", "gemma2", "--inputs", str(path))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "never run" in err, err
    assert "planted" not in out + err


@pytest.mark.parametrize("args, needle", [(("--batch", "4096", "--seq-len", "1048576"), "4,294,967,296 token ids"),
                                          (("--batch", "1024", "--seq-len", "1024"), "GiB of float32 logits")])
def test_a_batch_too_big_is_refused_before_it_is_allocated(cli, monkeypatch, args, needle):
    from softcapgrad.models import tiny

    monkeypatch.setattr(tiny, "available_bytes", lambda: 1 << 30)
    code, _, out, err = cli("audit-model", "--model-type", "gemma2", *args)
    assert code == 2 and out == "" and needle in err, err


def test_token_ids_in_a_file_count_toward_the_batch(tmp_path, cli):
    path = tmp_path / "ids.npy"
    np.save(path, np.zeros((2, (1 << 20) // 2 + 1), dtype=np.int64))
    code, _, _, err = cli("audit-model", "--model-type", "gemma2", "--inputs", str(path))
    assert code == 2 and "token ids in one batch" in err
