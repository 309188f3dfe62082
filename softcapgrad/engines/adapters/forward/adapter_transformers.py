"""transformers itself, loaded as its users load it: ``AutoModelForCausalLM.from_pretrained(folder)``.

Route ``default`` passes nothing but the folder (local files only, no remote code), so transformers
picks the attention implementation and the dtype by itself; route ``eager`` passes
``attn_implementation="eager"``, the setting transformers documents for soft-capped models. The
attention implementation reported is the one the loaded model records as in use.
"""


import adapter_protocol as protocol
from adapter_transformers_load import load, precision

ROUTES = {
    "default": "AutoModelForCausalLM.from_pretrained(folder): transformers picks the attention and the dtype",
    "eager": 'AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager")',
}
# routes that may run one after another in one process (catalog.processes): nothing one sets outlives it
PROCESSES = (("default", "eager"),)
MODELS_PER_PROCESS = 7  # models one child runs in turn (catalog.models_per_process)
PACKAGES = ("transformers", "torch", "tokenizers", "huggingface-hub", "safetensors")


def run_variant(run, variant):
    import torch

    model, attention, dtype = load(run, variant)
    run.did = (f"AutoModelForCausalLM.from_pretrained ({type(model).__name__}), attention {attention}, "
               f"weights {dtype}, no KV cache (one forward over every token)")
    run.precision = precision(dtype)
    run.packages = PACKAGES
    with torch.no_grad():
        x = torch.as_tensor(run.ids, dtype=torch.long).reshape(1, -1)
        return model(input_ids=x, use_cache=False).logits[0].float().numpy()


if __name__ == "__main__":
    raise SystemExit(protocol.main(ROUTES, run_variant))
