"""ONNX Runtime through optimum-onnx: the model exported by ``ORTModelForCausalLM.from_pretrained(DIR,
export=True)``, run by onnxruntime on the CPU in fp32.

The exporter picks the attention implementation itself (the attention ``transformers`` gives the model
when nothing is asked for); the adapter reads it back from the exported model's config and says so."""

from __future__ import annotations

import numpy as np

from adapter_protocol import NoArchitecture, Run, main

ROUTES = {
    "default": "ORTModelForCausalLM.from_pretrained(DIR, export=True): the documented default, with its KV cache",
    "no-cache": "the same export with use_cache=False (the documented option for a model without past inputs)",
}
# routes that may run one after another in one process (catalog.processes): nothing one sets outlives it
PROCESSES = (("default", "no-cache"),)
MODELS_PER_PROCESS = 7  # models one child runs in turn (catalog.models_per_process)
PACKAGES = ("optimum-onnx", "optimum", "onnxruntime", "onnx", "transformers", "torch")


def claimed(model_type: str) -> None:
    from optimum.exporters.tasks import TasksManager

    supported = TasksManager.get_supported_model_type_for_task("text-generation", exporter="onnx")
    if model_type.replace("_", "-") not in supported and model_type not in supported:
        raise NoArchitecture(f"{model_type} is not in optimum's ONNX exporter registry for text-generation "
                             "(TasksManager)")


def run_variant(run: Run, variant: str) -> np.ndarray:
    import torch
    from optimum.onnxruntime import ORTModelForCausalLM

    claimed(run.config(variant)["model_type"])
    use_cache = run.route == "default"
    model = ORTModelForCausalLM.from_pretrained(run.folder(variant), export=True, use_cache=use_cache)
    ids = torch.as_tensor(run.ids).reshape(1, -1)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids))
    run.did = (f"optimum-onnx export (use_cache={use_cache}), onnxruntime CPUExecutionProvider, fp32; "
               "attention: the exporter's own choice, no attn_implementation passed")
    run.packages = PACKAGES
    return out.logits[0].detach().numpy()


if __name__ == "__main__":
    raise SystemExit(main(ROUTES, run_variant))
