"""audit-model DIR --gates: a tiny Laguna and Qwen3-Next saved as config.json + model.safetensors, read back and run
on the shipped text; each gate's quantiles and inputs past its format's first zero against the same forward counted
by hand (hooks on the projections that feed the gates, the gate applied as the modeling code applies it).

Laguna's g_proj is scaled by 3000 so that its fp32 softplus gate has inputs past its first zero on the shut side
(σ(x) = 0 in fp32 from x ≈ −103.97; the inputs reach −3000·|g_proj(h)|); Qwen3-Next runs in bf16, its sigmoid gate on
q_proj's gate half, unscaled (inputs of order 0.1: nothing past either first zero)."""

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from softcapgrad.models import gate_audit  # noqa: E402
from softcapgrad.stacks.watch import gate_first_zero  # noqa: E402
from tests.test_tether_patch import laguna, qwen3_next  # noqa: E402

F = torch.nn.functional


def _inputs(model, proj, take):
    """Each layer's gate input on the text's ids, through a hook on ``proj`` of each full-attention layer."""
    seen = []
    attns = [layer.self_attn for layer in model.model.layers if hasattr(layer, "self_attn")]
    hooks = [getattr(a, proj).register_forward_hook(lambda m, args, out: seen.append(take(out)) and None) for a in attns]
    ids, _ = gate_audit.text_ids(model.config, None)
    with torch.no_grad():
        model.eval()(input_ids=ids)
    for h in hooks:
        h.remove()
    return seen


def _saved(tmp_path, model):
    model.save_pretrained(tmp_path, safe_serialization=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "generation_config.json", "model.safetensors"]
    return tmp_path


@pytest.mark.slow
def test_laguna_gates_read_back_from_safetensors(tmp_path, cli):
    model = laguna()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.g_proj.weight.mul_(3000.0)
    code, data, _, err = cli("audit-model", str(_saved(tmp_path, model)), "--gates", "--dtype", "fp32", "--json")
    assert code == 0, err
    assert data["params"]["random_weights"] is False and "bytes as token ids" in data["params"]["text"]
    rows = {r["module"]: r for r in data["gates"] if r["fn"] == "softplus"}
    xs = _inputs(model, "g_proj", lambda out: out.detach().float().double().reshape(-1))
    zone = gate_first_zero("softplus", "float32", "cpu")
    for i, x in enumerate(xs):
        r = rows[f"model.layers.{i}.self_attn"]
        y = F.softplus(x.float()).double().numpy()
        assert r["dtype"] == "float32" and r["count"] == x.numel()
        assert [r[f"q{q}"] for q in (0, 1, 10, 50, 90, 99, 100)] == np.quantile(y, gate_audit.QUANTILES).tolist()
        assert r["past_shut_share"] == int((x <= zone.shut_from).sum()) / x.numel()
        assert r["past_open_share"] is None and r["stuck_shut_from"] == zone.shut_from
    assert all(r["past_shut_share"] > 0 for r in rows.values())  # the scale did put inputs there
    assert "had inputs past the first zero" in data["answer"][1]


@pytest.mark.slow
def test_qwen3_next_bf16_gates_read_back_and_nothing_past_the_first_zero(tmp_path, cli):
    model = qwen3_next().to(torch.bfloat16)
    code, data, _, err = cli("audit-model", str(_saved(tmp_path, model)), "--gates", "--json")
    assert code == 0, err
    (r,) = [r for r in data["gates"] if r["module"] == "model.layers.0.self_attn"]
    gate = _inputs(model, "q_proj", lambda out: out.detach().view(*out.shape[:-1], -1, 16)[..., 8:].reshape(-1))[0]
    y = torch.sigmoid(gate).double().numpy()
    assert (r["fn"], r["dtype"], r["count"]) == ("sigmoid", "bfloat16", gate.numel())
    assert r["q50"] == float(np.quantile(y, 0.5)) and r["past_open_share"] == r["past_shut_share"] == 0.0
    assert data["answer"][1] == "No gate input lay past the first zero of its format's gradient."
    code, _, _, err = cli("audit-model", str(tmp_path), "--gates", "--batch", "2")
    assert code == 2 and "--gates" in err and len(err.strip().splitlines()) == 1


def test_a_tokenizer_json_that_does_not_load_is_one_line_and_exit_2(tmp_path, cli):
    folder = _saved(tmp_path, laguna())
    (folder / "tokenizer.json").write_text('{"version": "1.0", "model": 3}')
    code, _, out, err = cli("audit-model", str(folder), "--gates")
    assert code == 2 and "cannot load the tokenizer" in err and len(err.strip().splitlines()) == 1, (out, err)
