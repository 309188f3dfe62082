"""parity builds every capped causal model type: the reference's caps bind on each, the saved folders load the way
an engine loads them, and transformers' own eager path read back from them is judged applied."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")

from softcapgrad.engines.forward import modeltypes, parity, verdict  # noqa: E402
from softcapgrad.engines.forward import reference as ref  # noqa: E402
from softcapgrad.models import audit  # noqa: E402

TOKENS = 16  # the parity default: twice the tiny window (modeltypes.WINDOW)
NEW = ["gemma3_text", "gemma3n_text", "gemma4_text", "gemma4_unified_text", "recurrent_gemma", "nanochat", "beam",
       "xlstm", "inkling2_text", "inkling2_loop_text"]


def _eager(folder, ids):
    import torch
    from transformers import AutoModelForCausalLM

    with audit.quiet():
        model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, trust_remote_code=False,
                                                     attn_implementation="eager", dtype=torch.float32).eval()
    with torch.no_grad():
        return model(input_ids=torch.as_tensor(ids).view(1, -1), use_cache=False).logits[0].double().numpy()


@pytest.mark.parametrize("label", NEW)
def test_each_type_binds_its_caps_and_transformers_eager_applies_them(label, tmp_path):
    src = audit.source(None, modeltypes.model_type(label), ref.tiny_sets(label))
    reference = parity.prepare(src, TOKENS, 0, tmp_path)
    assert reference.caps["final"] is not None
    assert reference.reach["final"] == pytest.approx(ref.TARGET, rel=1e-3)
    window = [getattr(src.config, w) for w in modeltypes.WINDOWS if w in src.config.to_dict()]
    assert all(w == modeltypes.WINDOW < TOKENS for w in window)
    ids = np.load(tmp_path / "ids.npy")
    logits = {v: _eager(tmp_path / parity.FOLDERS[v], ids) for v in ("capped", "final off")}
    rows = {r["cap"]: r for r in verdict.verdicts(logits, reference)}
    assert rows["final"]["verdict"] == "applied"
    assert rows["final"]["max_logit"] <= reference.caps["final"]
    assert np.abs(logits["final off"]).max() > reference.caps["final"]  # the folder without the cap is uncapped


def test_gemma3_text_has_a_label_per_variant():
    """As shipped the attention cap is unset; with it set, transformers never passes it to the attention."""
    caps = {label: ref.caps_of(audit.source(None, "gemma3_text", ref.tiny_sets(label)).config)
            for label in ("gemma3_text", "gemma3_text+attention")}
    assert caps["gemma3_text"] == {"final": 30, "attention": None}
    assert caps["gemma3_text+attention"] == {"final": 30, "attention": 50}


@pytest.mark.parametrize("label, off", [("gemma2", None), ("nanochat", None), ("gemma3n_text", modeltypes.OFF),
                                        ("recurrent_gemma", modeltypes.OFF), ("xlstm", modeltypes.OFF)])
def test_the_off_value_is_none_where_the_config_accepts_it(label, off):
    config = audit.source(None, modeltypes.model_type(label), ref.tiny_sets(label)).config
    assert modeltypes.off_value(config, "final") == off


@pytest.mark.parametrize("label", ["recurrent_gemma", "gemma3n_text"])
def test_the_numeric_off_value_leaves_the_logits_bit_for_bit(label):
    """c = 2**64 computes c·tanh(x/c) = x exactly: the model with it gives its output projection's own logits."""
    import torch

    src = audit.source(None, modeltypes.model_type(label), ref.tiny_sets(label))
    model = ref.build(src, 0)
    ids = audit.random_ids(src.config, 1, TOKENS, 0).numpy().reshape(-1)
    ref.bind(model, ids)
    head = []
    handle = model.get_output_embeddings().register_forward_hook(lambda m, i, out: head.append(out[0].detach()))
    try:
        off = ref.logits(model, ids, off=("final",))
    finally:
        handle.remove()
    assert np.abs(head[0].double().numpy()).max() > src.config.to_dict()[modeltypes.field(src.config, "final")]
    assert np.array_equal(off, head[0].double().numpy())
    assert torch.equal(torch.tanh(head[0] / modeltypes.OFF) * modeltypes.OFF, head[0])


def test_a_type_parity_does_not_build_is_refused_in_one_line():
    from typer.testing import CliRunner

    from softcapgrad.cli.app import app

    result = CliRunner().invoke(app, ["parity", "--model-type", "t5gemma", "--engine", "transformers"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"softcapgrad: error: --model-type t5gemma: parity does not build it: {dict(ref.NOT_YET)['t5gemma']}"]


def test_a_model_type_the_loaded_transformers_does_not_know_is_no_such_architecture(tmp_path, monkeypatch):
    """transformers 4.57.6 has no beam, nanochat or inkling2: its refusal is "no such architecture", not a failure."""
    from softcapgrad.engines.forward import catalog

    for folder in catalog.ADAPTER_PATH:
        monkeypatch.syspath_prepend(str(folder))
    import adapter_protocol as protocol
    import adapter_transformers_load as transformers_load

    folder = tmp_path / "capped"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "no_such_model_type", "architectures": ["NoSuchForCausalLM"]}')
    run = protocol.Run(tmp_path, "default", ["capped"], np.zeros(2, dtype=np.int64))
    with pytest.raises(protocol.NoArchitecture, match="does not recognize this architecture"):
        transformers_load.load(run, "capped")
