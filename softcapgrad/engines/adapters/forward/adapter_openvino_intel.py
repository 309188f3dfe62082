"""OpenVINO through optimum-intel: ``OVModelForCausalLM.from_pretrained(DIR, export=True)``, run on the CPU at
the runtime's default inference precision (bf16 on a CPU with bf16 instructions), and with the documented
``INFERENCE_PRECISION_HINT: f32`` for an fp32 row. Each row records the KV cache's element type as the compiled
model reports it (``KV_CACHE_PRECISION``) and is judged in the coarser of the two.

optimum-intel's install brings a torchvision build that does not load beside CPU torch; the pinned
environment leaves it out (the export of a causal LM does not import it)."""

from __future__ import annotations

import numpy as np

from adapter_protocol import NoArchitecture, Run, main

ROUTES = {
    "default": "OVModelForCausalLM.from_pretrained(DIR, export=True): the runtime's default inference precision",
    "fp32": "the same export compiled with ov_config={'INFERENCE_PRECISION_HINT': 'f32'}",
    "fp32-kv32": "the same with 'KV_CACHE_PRECISION': 'f32' as well (the CPU plugin keeps an f16 cache otherwise)",
}
# routes that may run one after another in one process (catalog.processes): nothing one sets outlives it
PROCESSES = (("default", "fp32", "fp32-kv32"),)
MODELS_PER_PROCESS = 7  # models one child runs in turn (catalog.models_per_process)
OV_CONFIG = {"fp32": {"INFERENCE_PRECISION_HINT": "f32"},
             "fp32-kv32": {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}}
PACKAGES = ("optimum-intel", "optimum", "openvino", "nncf", "transformers", "torch")
PRECISIONS = {"bf16": "bf16", "f16": "fp16", "f32": "fp32", "u8": "int8", "i8": "int8", "u4": "q4_0", "i4": "q4_0"}
COARSER = ("q4_0", "int8", "bf16", "fp16", "fp32")  # by unit roundoff, coarsest first: the row is judged in the first


def judged_in(hint: str, kv: str) -> str:
    """The coarser of the compute precision and the KV cache's element type (OpenVINO's names), in parity's names."""
    formats = [PRECISIONS.get(hint, hint)] + ([PRECISIONS.get(kv, kv)] if kv else [])
    return min(formats, key=lambda f: COARSER.index(f) if f in COARSER else len(COARSER))


def kv_cache_precision(compiled) -> str:
    """The KV cache's element type as the CPU plugin chose it ('' where this runtime does not report it): the
    plugin may store the cache in a lower precision than it computes in."""
    try:
        return compiled.get_property("KV_CACHE_PRECISION").get_type_name()
    except Exception:  # noqa: BLE001 -- a runtime without the property: the row says so
        return ""


def claimed(model_type: str) -> None:
    from optimum.exporters.tasks import TasksManager

    supported = TasksManager.get_supported_model_type_for_task("text-generation", exporter="openvino")
    if model_type.replace("_", "-") not in supported and model_type not in supported:
        raise NoArchitecture(f"{model_type} is not in optimum-intel's OpenVINO exporter registry for "
                             "text-generation (TasksManager)")


def run_variant(run: Run, variant: str) -> np.ndarray:
    import torch
    from optimum.intel import OVModelForCausalLM

    claimed(run.config(variant)["model_type"])
    options = {"ov_config": dict(OV_CONFIG[run.route])} if run.route in OV_CONFIG else {}
    model = OVModelForCausalLM.from_pretrained(run.folder(variant), export=True, **options)
    ids = torch.as_tensor(run.ids).reshape(1, -1)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids))
    compiled = model.request.get_compiled_model()
    hint = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
    kv = kv_cache_precision(compiled)
    run.precision = judged_in(hint, kv)
    run.did = (f"optimum-intel OpenVINO export (stateful KV cache), CPU plugin, as the compiled model reports them: "
               f"INFERENCE_PRECISION_HINT {hint}, KV_CACHE_PRECISION {kv or 'not reported'}; attention: the "
               "exporter's own choice")
    run.packages = PACKAGES
    return out.logits[0].detach().float().numpy()


if __name__ == "__main__":
    raise SystemExit(main(ROUTES, run_variant))
