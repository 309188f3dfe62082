"""Keras Hub's Gemma 3 against transformers: the 67.8-nat difference that remained with the attention cap forced on
is the layer pattern. Keras Hub's Gemma 3 converter passes neither ``layer_types`` nor the rope bases to its
backbone, which makes layer i local when i % 6 < 5 (rope wavelength 10 000) and global otherwise (1 000 000). The
tiny config's layer_types alternate: its layer 1 is global in transformers (no window, rope base 1 000 000) and
local in Keras Hub (the window, rope base 10 000). With layer_types written the way Keras Hub builds them the difference falls by more than three orders of
magnitude, to the rounding of an fp32 model whose inputs drive every cap to |a/c| = 4."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")

from softcapgrad.engines.forward import catalog, parity  # noqa: E402
from softcapgrad.engines.forward import reference as ref  # noqa: E402
from softcapgrad.models import audit  # noqa: E402

TOKENS = 16  # longer than the tiny config's sliding window, so the local layers' window binds
BOOTSTRAP = "import sys, runpy; sys.path[:0] = {0!r}; runpy.run_path({1!r}, run_name='__main__')"


def _keras_pattern(n: int) -> list[str]:
    return ["sliding_attention" if i % 6 < 5 else "full_attention" for i in range(n)]


def _forced(folder: Path, ids: np.ndarray) -> np.ndarray:
    """transformers' fp32 eager log-probabilities with the attention cap applied where its code leaves it unused."""
    import torch
    from transformers import AutoModelForCausalLM

    with audit.quiet():
        model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, trust_remote_code=False,
                                                     attn_implementation="eager", dtype=torch.float32).eval()
    with torch.no_grad(), ref.attention_patch(model, cap_fn=ref.tanh_cap, force=True):
        logits = model(torch.as_tensor(ids).view(1, -1)).logits[0]
    return torch.log_softmax(logits.double(), -1).numpy()


def _inputs(work: Path) -> np.ndarray:
    parity.prepare(audit.source(None, "gemma3_text", ref.tiny_sets("gemma3_text+attention")), TOKENS, 0, work)
    shutil.copytree(work / "final-off", work / "keras-pattern")
    path = work / "keras-pattern" / "config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    assert config["layer_types"] != _keras_pattern(config["num_hidden_layers"])  # the tiny config alternates
    assert config["sliding_window"] < TOKENS
    config["layer_types"] = _keras_pattern(config["num_hidden_layers"])
    path.write_text(json.dumps(config, indent=1), encoding="utf-8")
    return np.load(work / "ids.npy")


def test_the_layer_pattern_moves_transformers_by_nats(tmp_path):
    ids = _inputs(tmp_path)
    moved = np.abs(_forced(tmp_path / "final-off", ids) - _forced(tmp_path / "keras-pattern", ids)).max()
    assert moved > 1.0  # layer 1's window and rope base


@pytest.mark.slow
@pytest.mark.engine_environments("kerashub")
def test_keras_hub_differs_from_transformers_by_the_layer_pattern_only(tmp_path, engine_environment):
    python = engine_environment("kerashub").python  # built side by side with the others (conftest), reused after
    ids = _inputs(tmp_path)
    env = {"PATH": os.environ.get("PATH", ""), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "KERAS_BACKEND": "jax"}
    command = [str(python), "-I", "-c", BOOTSTRAP.format([str(p) for p in catalog.ADAPTER_PATH], str(catalog.script("kerashub"))), str(tmp_path), "default", "final-off",
               "keras-pattern"]
    done = subprocess.run(command, cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                          timeout=300, start_new_session=True)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-400:]
    import torch

    def engine(variant):
        values = torch.as_tensor(np.load(tmp_path / "out" / "default" / f"{variant}.npy"))
        return torch.log_softmax(values, -1).numpy()

    as_written = np.abs(engine("final-off") - _forced(tmp_path / "final-off", ids)).max()
    keras_way = np.abs(engine("keras-pattern") - _forced(tmp_path / "keras-pattern", ids)).max()
    assert as_written > 10.0
    assert keras_way < 1e-3 * as_written
