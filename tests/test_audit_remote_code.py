"""No code from a model directory ever runs: audit-model on a directory that plants code, whatever stdin holds.

The planted configuration_*.py and modeling_*.py write a marker file the moment they are imported.
The command runs in a child process with "y" waiting on stdin (the answer transformers' prompt
would take as consent) and the library's module cache in a folder of the test's own.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]
PLANTED = """import pathlib
pathlib.Path({marker!r}).write_text("ran")
from transformers import PretrainedConfig, PreTrainedModel
class EvilConfig(PretrainedConfig):
    model_type = "evilnet"
class EvilModel(PreTrainedModel):
    config_class = EvilConfig
"""
AUTO_MAP = {"AutoConfig": "configuration_evil.EvilConfig", "AutoModel": "modeling_evil.EvilModel",
            "AutoModelForCausalLM": "modeling_evil.EvilModel"}


def _plant(folder: Path, config: dict) -> Path:
    folder.mkdir()
    marker = folder.parent / "MARKER"
    for name in ("configuration_evil.py", "modeling_evil.py"):
        (folder / name).write_text(PLANTED.format(marker=str(marker)))
    (folder / "config.json").write_text(json.dumps({**config, "auto_map": AUTO_MAP}))
    return marker


def _run(tmp_path: Path, *args: str):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_MODULES_CACHE": str(tmp_path / "modules"),
           "HF_HUB_OFFLINE": "1", "COLUMNS": "100"}
    return subprocess.run([sys.executable, "-m", "softcapgrad", "audit-model", *args], input="y\n", env=env,
                          capture_output=True, text=True, timeout=900, cwd=tmp_path)


@pytest.mark.parametrize("json_out", [False, True])
def test_unknown_type_with_auto_map_refused_and_nothing_runs(tmp_path, json_out):
    marker = _plant(tmp_path / "m", {"model_type": "evilnet", "hidden_size": 64})
    done = _run(tmp_path, str(tmp_path / "m"), *(["--json"] if json_out else []))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
    assert len(lines) == 1 and "auto_map" in lines[0] and "never run" in lines[0], done.stderr
    assert not marker.exists()
    assert not list((tmp_path / "modules").rglob("*.py")) if (tmp_path / "modules").exists() else True


def test_known_type_with_auto_map_builds_the_library_class_and_says_so(tmp_path):
    from softcapgrad.models.source import model_type_config

    config = model_type_config("gemma2", {"final_logit_softcapping": 30.0}).to_dict()
    marker = _plant(tmp_path / "m", config)
    done = _run(tmp_path, str(tmp_path / "m"), "--attn", "eager", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)  # no prompt written into stdout
    assert any("auto_map" in s and "ignored" in s for s in data["answer"]), data["answer"]
    assert data["params"]["model_class"] == "Gemma2ForCausalLM"
    assert not marker.exists()


def test_every_transformers_entry_point_refuses_remote_code(monkeypatch, tmp_path):
    """The model's own from_pretrained (a directory with weights) is called with trust_remote_code=False."""
    import torch

    from softcapgrad.models import runnable

    seen = {}

    class Probe:
        @classmethod
        def from_pretrained(cls, *args, **kwargs):
            seen.update(kwargs)
            return torch.nn.Linear(1, 1)

    runnable.build(Probe, object(), "eager", torch.float32, directory=tmp_path)
    assert seen["trust_remote_code"] is False and seen["local_files_only"] is True


def test_the_command_never_reads_stdin(monkeypatch):
    """Inside the command, stdin is an empty stream: input() ends at once instead of waiting for an answer."""
    from softcapgrad.models.source import no_stdin

    with no_stdin(), pytest.raises(EOFError):
        input()


@pytest.mark.parametrize("command", [("experiment", "--quick", "--model"), ("parity", "--engine", "onnx")])
def test_other_commands_reading_a_model_directory_run_none_of_its_code(tmp_path, command):
    """experiment --model DIR and parity DIR read the directory through the same door: refused, nothing run."""
    marker = _plant(tmp_path / "m", {"model_type": "evilnet", "hidden_size": 64})
    (tmp_path / "m" / "model.safetensors").write_bytes(b"")  # so the refusal is about the code, not the weights
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"}
    argv = [*command, str(tmp_path / "m")] if command[0] == "experiment" else [command[0], str(tmp_path / "m"), *command[1:]]
    done = subprocess.run([sys.executable, "-m", "softcapgrad", *argv], input="y\n", env=env, capture_output=True,
                          text=True, timeout=900, cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
    assert len(done.stderr.strip().splitlines()) == 1 and "evilnet" in done.stderr, done.stderr
    assert not marker.exists()
