"""The in-PyTorch serving path: ``torch.export.export`` of the model as ``from_pretrained`` loads it, then the
exported program's module as it is (routes ``default``, ``eager``) or compiled by ``torch.compile`` with
inductor's C++ kernels (``inductor``, ``inductor-eager``). The ``-eager`` routes load with
``attn_implementation="eager"``; the others let transformers pick."""

import os


import adapter_protocol as protocol
from adapter_transformers_load import load, logits_only, precision

ROUTES = {
    "default": "torch.export.export of the model from_pretrained loads; the exported program's module",
    "eager": 'the same, loaded with attn_implementation="eager"',
    "inductor": "torch.export.export, then torch.compile (inductor, C++ kernels) of the exported module",
    "inductor-eager": 'the same, loaded with attn_implementation="eager"',
}
# routes that may run one after another in one process (catalog.processes): nothing one sets outlives it
PROCESSES = (("default", "eager"), ("inductor", "inductor-eager"))
MODELS_PER_PROCESS = 5  # models one child runs in turn (catalog.models_per_process)
PACKAGES = ("torch", "transformers")


def run_variant(run, variant):
    import torch

    model, attention, dtype = load(run, variant)

    x = torch.as_tensor(run.ids, dtype=torch.long).reshape(1, -1)
    module = torch.export.export(logits_only(model), (x,)).module()
    compiled = run.route.startswith("inductor")
    if compiled:
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(run.scratch("inductor")))
        module = torch.compile(module, backend="inductor", dynamic=False)
    run.did = (f"torch.export.export of {type(model).__name__} (attention {attention}, weights {dtype})"
               + (", torch.compile with inductor" if compiled else ", the exported module run as it is"))
    run.precision = precision(dtype)
    run.packages = PACKAGES
    with torch.no_grad():
        return module(x)[0].float().numpy()


if __name__ == "__main__":
    raise SystemExit(protocol.main(ROUTES, run_variant))
