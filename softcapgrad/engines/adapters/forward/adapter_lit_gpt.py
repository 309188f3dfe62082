"""LitGPT with its own converter and model code. Its converter (``litgpt convert_to_litgpt``) reads no config.json:
it takes the model's settings from one of its named configs (``Config.from_name``), the folder's name unless
``--model_name`` is given, so a folder named anything else is refused. The route given here is the one a user of
a resized checkpoint has: ``--model_name`` of the family's smallest named config, whose caps, norms and attention
come with it, and the sizes that must follow the weights (layers, widths, heads, vocabulary, window, query scale)
read from config.json; then ``GPT`` from that config, the converted ``lit_model.pth``, fp32, one forward."""

from __future__ import annotations

import shutil
import sys

import numpy as np

import adapter_protocol as protocol

ROUTES = {"default": "litgpt convert_to_litgpt --model_name of the family's named config, its sizes from "
                     "config.json, the caps from the named config; GPT in fp32, one forward without a KV cache"}
MODELS_PER_PROCESS = 7  # models one child runs in turn (catalog.models_per_process)
NAMED = {"gemma2": "gemma-2-2b", "gemma3_text": "gemma-3-1b-it"}  # the smallest of each family


def sizes(config: dict) -> dict:
    """The LitGPT fields that must follow the checkpoint's tensors and layer layout (never its caps)."""
    kinds = config.get("layer_types") or []
    rope = config.get("rope_parameters") or {}
    out = dict(n_layer=config["num_hidden_layers"], n_embd=config["hidden_size"],
               n_head=config["num_attention_heads"], n_query_groups=config["num_key_value_heads"],
               head_size=config["head_dim"], intermediate_size=config["intermediate_size"],
               vocab_size=config["vocab_size"], padded_vocab_size=config["vocab_size"],
               block_size=config["max_position_embeddings"], sliding_window_size=config["sliding_window"],
               attention_scores_scalar=config["query_pre_attn_scalar"], norm_eps=config["rms_norm_eps"])
    if kinds:
        out["sliding_window_indices"] = [int(k == "sliding_attention") for k in kinds]
    if "full_attention" in rope:  # per-layer-type rope (Gemma 3 as transformers 5 writes it)
        out["rope_base"] = rope["full_attention"]["rope_theta"]
        out["rope_local_base_freq"] = rope["sliding_attention"]["rope_theta"]
        out["rope_indices"] = out.get("sliding_window_indices")
    elif "rope_theta" in rope or "rope_theta" in config:
        out["rope_base"] = rope.get("rope_theta", config.get("rope_theta"))
    return out


def build(run: protocol.Run, variant: str):
    """LitGPT's GPT with the folder's weights as the route converts them: (model, its Config, the named config)."""
    import torch
    from litgpt import GPT, Config
    from litgpt.scripts.convert_hf_checkpoint import convert_hf_checkpoint

    config = run.config(variant)
    kind = config.get("model_type", "?")
    if kind not in NAMED:
        raise protocol.NoArchitecture(f"LitGPT's named configs (litgpt.config.configs) hold Gemma, Gemma 2 and "
                                      f"Gemma 3 only (this adapter maps gemma2 and gemma3_text), no {kind}")
    folder = run.scratch(variant)
    for path in run.folder(variant).iterdir():
        if path.is_file():
            shutil.copyfile(path, folder / path.name)
    convert_hf_checkpoint(folder, model_name=NAMED[kind])
    lit_config = Config.from_name(NAMED[kind], **sizes(config))
    torch.set_default_dtype(torch.float32)
    model = GPT(lit_config)
    model.load_state_dict(torch.load(folder / "lit_model.pth", weights_only=True, map_location="cpu"))
    return model, lit_config, NAMED[kind]


def run_variant(run: protocol.Run, variant: str) -> np.ndarray:
    import torch

    model, lit_config, named = build(run, variant)
    model.eval()
    with torch.no_grad():
        out = model(torch.as_tensor(run.ids).view(1, -1))[0].double().numpy()
    run.did = (f"litgpt convert_hf_checkpoint(model_name={named}), GPT({named} with config.json's "
               f"sizes): attention_logit_softcapping={lit_config.attention_logit_softcapping}, "
               f"final_logit_softcapping={lit_config.final_logit_softcapping}, fp32, no KV cache")
    run.notes = ["LitGPT's converter reads no config.json: the caps are its named config's, whatever the folder says"]
    run.packages = ("litgpt", "torch")
    return out


if __name__ == "__main__":
    sys.exit(protocol.main(ROUTES, run_variant))
