"""OpenVINO through optimum-intel: ``OVModelForCausalLM.from_pretrained(DIR, export=True)``, run on the CPU at
the runtime's default inference precision (bf16 on a CPU with bf16 instructions), and with the documented
``INFERENCE_PRECISION_HINT: f32`` for an fp32 row.

optimum-intel's install brings a torchvision build that does not load beside CPU torch; the pinned
environment leaves it out (the export of a causal LM does not import it)."""

from __future__ import annotations

import numpy as np

from adapter_protocol import NoArchitecture, Run, main

ROUTES = {
    "default": "OVModelForCausalLM.from_pretrained(DIR, export=True): the runtime's default inference precision",
    "fp32": "the same export compiled with ov_config={'INFERENCE_PRECISION_HINT': 'f32'}",
}
PACKAGES = ("optimum-intel", "optimum", "openvino", "nncf", "transformers", "torch")
PRECISIONS = {"bf16": "bf16", "f16": "fp16", "f32": "fp32"}


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
    options = {"ov_config": {"INFERENCE_PRECISION_HINT": "f32"}} if run.route == "fp32" else {}
    model = OVModelForCausalLM.from_pretrained(run.folder(variant), export=True, **options)
    ids = torch.as_tensor(run.ids).reshape(1, -1)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids))
    hint = model.request.get_compiled_model().get_property("INFERENCE_PRECISION_HINT").get_type_name()
    run.precision = PRECISIONS.get(hint, hint)
    run.did = (f"optimum-intel OpenVINO export (stateful KV cache), CPU plugin, INFERENCE_PRECISION_HINT as "
               f"the compiled model reports it: {hint}; attention: the exporter's own choice")
    run.packages = PACKAGES
    return out.logits[0].detach().float().numpy()


if __name__ == "__main__":
    raise SystemExit(main(ROUTES, run_variant))
