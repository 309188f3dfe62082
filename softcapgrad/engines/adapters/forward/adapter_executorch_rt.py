"""ExecuTorch: a transformers folder exported to a ``.pte`` program and run by ExecuTorch's own runtime
(``executorch.runtime``) on the CPU, in fp32.

``default`` is optimum-executorch's documented export, ``main_export(DIR, task="text-generation",
recipe="xnnpack")`` (what ``optimum-cli export executorch --model DIR --recipe xnnpack`` calls), with its
defaults: the attention implementation it asks transformers for (sdpa), a static KV cache, dynamic shapes
where the exporter allows them. ``custom`` adds the two options its README gives for CPUs
(``--use_custom_sdpa --use_custom_kv_cache``); ``eager`` passes ``attn_implementation="eager"``, an option
its text-generation task documents. The program is fed as ExecuTorch's LLM runner feeds it: the whole prompt
with its cache positions when the program takes that many tokens, else in chunks of the most it takes (one
token a call for a program exported with one-token inputs).

``direct`` is ``torch.export.export`` of the model as ``from_pretrained`` loads it (no attention
implementation asked for, no cache), lowered by ``to_edge_transform_and_lower`` with the XNNPACK
partitioner and run whole; ``direct-eager`` loads it with ``attn_implementation="eager"``.
``portable`` and ``portable-eager`` lower the same exports without a partitioner, to ExecuTorch's portable
kernels: their fp32 logits stay within 1.4e-4 of the exported module's where XNNPACK's differ by up to 7e-3
(measured on the tiny Gemma 2, logits up to 30).

The runtime reports a failed kernel on the process's stderr, not in its exception: the adapter reads those
lines back and puts them in the reason."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile

import numpy as np

from adapter_protocol import NoArchitecture, Run, main

ROUTES = {
    "default": "optimum-executorch main_export(DIR, recipe='xnnpack') with its defaults (sdpa, static KV cache), "
               "run by executorch.runtime as its generate feeds it",
    "custom": "the same with use_custom_sdpa and use_custom_kv_cache, the options its README gives for CPUs",
    "eager": "the same export with attn_implementation='eager', an option its text-generation task documents",
    "direct": "torch.export.export of the model from_pretrained loads, to_edge_transform_and_lower with the XNNPACK "
              "partitioner, run by executorch.runtime",
    "direct-eager": "the same, loaded with attn_implementation='eager', the documented setting for soft-capped models",
    "portable": "the direct export lowered by to_edge and to_executorch alone: ExecuTorch's portable kernels",
    "portable-eager": "the same, loaded with attn_implementation='eager'",
}
# routes that may run one after another in one process (catalog.processes): nothing one sets outlives it
PROCESSES = (("default", "custom", "eager", "direct", "direct-eager", "portable", "portable-eager"),)
MODELS_PER_PROCESS = 3  # models one child runs in turn (catalog.models_per_process)
PACKAGES = ("executorch", "optimum-executorch", "optimum", "torch", "torchao", "transformers")
LOG = ("Check failed", "KernelCall failed", "Missing operator", "Attempted to resize")


@contextlib.contextmanager
def runtime_log(lines: list):
    """File descriptor 2 copied to a file for the duration; its kernel-failure lines appended to ``lines``."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as log:
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            log.seek(0)
            text = log.read().decode("utf-8", "replace")
            sys.stderr.write(text)
            lines += [line.split("] ", 1)[-1].strip() for line in text.splitlines() if any(k in line for k in LOG)]


def load(run: Run, variant: str):
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    torch.set_num_threads(1)
    logging.set_verbosity_error()
    options = {"attn_implementation": "eager"} if run.route.endswith("eager") else {}
    model = AutoModelForCausalLM.from_pretrained(str(run.folder(variant)), local_files_only=True,
                                                 trust_remote_code=False, **options).eval()
    return model, getattr(model.config, "_attn_implementation", None) or "not recorded"


def claimed(model_type: str) -> None:
    """Both routes load the folder with AutoModelForCausalLM (optimum-executorch's text-generation task does)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise NoArchitecture(f"{model_type} is not in transformers' causal-LM mapping, which "
                             "optimum-executorch's text-generation task loads through")


def export_optimum(run: Run, variant: str) -> str:
    from optimum.exporters.executorch import main_export

    options = {"custom": {"use_custom_sdpa": True, "use_custom_kv_cache": True},
               "eager": {"attn_implementation": "eager"}}.get(run.route, {})
    out = run.scratch(variant)
    main_export(str(run.folder(variant)), task="text-generation", recipe="xnnpack", output_dir=str(out),
                local_files_only=True, **options)
    return str(out / "model.pte")


def export_direct(run: Run, variant: str) -> tuple[str, str]:
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge, to_edge_transform_and_lower

    model, attention = load(run, variant)

    class LogitsOnly(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids):
            return self.inner(input_ids=input_ids, use_cache=False).logits

    x = torch.as_tensor(run.ids, dtype=torch.long).reshape(1, -1)
    with torch.no_grad():
        program = torch.export.export(LogitsOnly(model), (x,))
    if run.route.startswith("portable"):
        lowered = to_edge(program).to_executorch()
    else:
        lowered = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()]).to_executorch()
    path = run.scratch(variant) / "model.pte"
    path.write_bytes(lowered.buffer)
    return str(path), attention


def execute(path: str, ids: np.ndarray) -> tuple[np.ndarray, str]:
    """Logits [tokens, vocab] from the program at ``path``, and how it was fed."""
    import torch
    from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401 -- registers llama::custom_sdpa
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(path)
    method = program.load_method("forward")
    meta = method.metadata
    x = torch.as_tensor(ids, dtype=torch.long).reshape(1, -1)
    if meta.num_inputs() == 1:
        return _run(program, method, [(x,)], ids.size), "the whole sequence in one call"
    width = meta.input_tensor_meta(0).sizes()[-1]  # a dynamic input's upper bound, else its fixed size
    if ids.size <= width:
        steps = [(x, torch.arange(ids.size, dtype=torch.long))]
        how = "the whole prompt with its cache positions in one call"
    else:  # as ExecuTorch's own LLM runner prefills a prompt longer than the program takes
        steps = [(x[:, i:i + width], torch.arange(i, min(i + width, ids.size), dtype=torch.long))
                 for i in range(0, ids.size, width)]
        how = (f"{len(steps)} calls of at most {width} token(s) with their cache positions "
               f"(the program takes at most {width})")
    return _run(program, method, steps, ids.size), how


def _constants(program) -> str:
    """What the exporter recorded beside ``forward`` about the cache (its constant methods)."""
    names = [n for n in ("sliding_window", "get_max_seq_len", "use_sdpa_with_kv_cache") if n in program.method_names]
    return ", ".join(f"{n}() = {program.load_method(n).execute([])[0]}" for n in names)


def _run(program, method, steps, tokens: int) -> np.ndarray:
    rows = []
    for i, inputs in enumerate(steps):
        lines: list = []
        try:
            with runtime_log(lines):
                out = method.execute(inputs)
        except RuntimeError as err:
            start = int(inputs[1][0]) if len(inputs) > 1 else 0
            where = f" at call {i + 1} of {len(steps)} (cache position {start}, {tokens} tokens)" \
                if len(steps) > 1 else ""
            said = [line for line in lines if line.startswith(("KernelCall", "Attempted"))][:1] + \
                   [line for line in lines if line.startswith("Check failed") and ":" in line.rstrip(":")][:1]
            raise RuntimeError(f"forward failed{where}: {err}; the program: {_constants(program)}; "
                               f"the runtime: {' | '.join(said) or 'said nothing'}") from None
        rows.append(out[0].float().reshape(-1, out[0].shape[-1]).numpy().copy())
    return np.concatenate(rows)[-tokens:]


def run_variant(run: Run, variant: str) -> np.ndarray:
    config = run.config(variant)
    run.packages = PACKAGES
    claimed(config["model_type"])
    if run.route.startswith(("direct", "portable")):
        path, attention = export_direct(run, variant)
        lowering = "to_edge, to_executorch (portable kernels)" if run.route.startswith("portable") else \
            "to_edge_transform_and_lower with XnnpackPartitioner"
        did = f"torch.export.export of the model as from_pretrained loads it (attention {attention}), {lowering}, " \
              "executorch.runtime"
    else:
        path = export_optimum(run, variant)
        attention = {"custom": "custom_sdpa", "eager": "eager"}.get(run.route, "sdpa, optimum-executorch's default")
        did = (f"optimum-executorch main_export recipe xnnpack (attention {attention}, static KV cache"
               + (", custom KV cache" if run.route == "custom" else "") + "), executorch.runtime")
    logits, how = execute(path, run.ids)
    run.did = f"{did}; fed {how}"
    window = config.get("sliding_window")
    if window and run.ids.size > window:
        run.notes = [f"{run.ids.size} tokens, sliding_window {window}: the local layers' window binds"]
    return logits


if __name__ == "__main__":
    raise SystemExit(main(ROUTES, run_variant))
