"""torchtune with its own Gemma 2 code: ``FullModelHFCheckpointer`` (model_type GEMMA2) converts the folder's
weights, its ``gemma2`` component builder builds the model with the folder's sizes, and the model's own forward
gives the logits in fp32. The architecture registry is torchtune's ``ModelType`` (the checkpointer's model types).

Every named Gemma 2 builder of torchtune (gemma2_2b, _9b, _27b) passes ``hidden_capping_value=30`` (the attention
cap) and ``final_capping_value=50``; the default route takes the caps the way those builders pass them, the
``config-caps`` route from config.json into the arguments their docstrings name."""

from __future__ import annotations

import sys

import numpy as np

import adapter_protocol as protocol

ROUTES = {
    "default": "FullModelHFCheckpointer(GEMMA2), gemma2 builder with the folder's sizes and the caps as torchtune's "
               "named Gemma 2 builders pass them (hidden 30, final 50); fp32, one forward",
    "config-caps": "the same with hidden_capping_value and final_capping_value read from config.json "
                   "(attn_logit_softcapping, final_logit_softcapping)",
}
# routes that may run one after another in one process (catalog.processes): nothing one sets outlives it
PROCESSES = (("default", "config-caps"),)
MODELS_PER_PROCESS = 7  # models one child runs in turn (catalog.models_per_process)
NAMED_CAPS = {"hidden_capping_value": 30.0, "final_capping_value": 50.0}  # as gemma2_2b/_9b/_27b pass them


def caps(run: protocol.Run, config: dict) -> dict:
    if run.route == "default":
        from torchtune.models.gemma2 import _model_builders

        return dict(NAMED_CAPS), _model_builders.__name__
    return {"hidden_capping_value": config.get("attn_logit_softcapping"),
            "final_capping_value": config.get("final_logit_softcapping")}, "config.json"


def build(run: protocol.Run, variant: str):
    """torchtune's Gemma 2 with the folder's weights as the route takes it: (model, caps passed, their source,
    config.json)."""
    import torch
    from torchtune.models.gemma2 import gemma2
    from torchtune.training import FullModelHFCheckpointer, ModelType

    config = run.config(variant)
    kind = config.get("model_type", "?")
    types = {t.value for t in ModelType}
    if kind not in types:
        raise protocol.NoArchitecture(f"torchtune.training.ModelType has no {kind}; it holds "
                                      f"{', '.join(sorted(types))}")
    if kind != "gemma2":
        raise protocol.NoArchitecture(f"this adapter builds torchtune's gemma2 only, not {kind}")
    checkpointer = FullModelHFCheckpointer(checkpoint_dir=str(run.folder(variant)),
                                           checkpoint_files=["model.safetensors"], model_type="GEMMA2",
                                           output_dir=str(run.scratch(variant)))
    state = checkpointer.load_checkpoint()["model"]
    values, source = caps(run, config)
    rope = config.get("rope_parameters") or {}
    torch.set_default_dtype(torch.float32)
    model = gemma2(vocab_size=config["vocab_size"], num_layers=config["num_hidden_layers"],
                   num_heads=config["num_attention_heads"], head_dim=config["head_dim"],
                   num_kv_heads=config["num_key_value_heads"], embed_dim=config["hidden_size"],
                   intermediate_dim=config["intermediate_size"], max_seq_len=config["max_position_embeddings"],
                   norm_eps=config["rms_norm_eps"], rope_base=rope.get("rope_theta", config.get("rope_theta", 10000)),
                   sliding_window_size=config["sliding_window"],
                   query_pre_attn_scalar=config["query_pre_attn_scalar"], **values)
    model.load_state_dict(state)
    return model, values, source, config


def run_variant(run: protocol.Run, variant: str) -> np.ndarray:
    import torch

    model, values, source, _ = build(run, variant)
    model.eval()
    with torch.no_grad():
        out = model(torch.as_tensor(run.ids).view(1, -1))[0].double().numpy()
    run.did = (f"torchtune FullModelHFCheckpointer(GEMMA2) + gemma2 builder, hidden_capping_value="
               f"{values['hidden_capping_value']}, final_capping_value={values['final_capping_value']} "
               f"(from {source}), its Gemma2Attention, fp32, no KV cache")
    run.notes = ["torchtune's Gemma2FinalNorm applies final_capping_value to the normed hidden state, before the "
                 "output projection"]
    run.packages = ("torchtune", "torchao", "torchdata", "torch")
    return out


if __name__ == "__main__":
    sys.exit(protocol.main(ROUTES, run_variant))
