"""One training step of LitGPT's own Gemma 2 and Gemma 3 as its full fine-tune script takes it.

The model is built as adapter_lit_gpt builds it (``convert_hf_checkpoint`` with the family's named config, the
sizes from config.json, the caps from the named config, whatever the folder says). The step is
``litgpt finetune_full``'s: ``model(input_ids)`` in training mode, ``chunked_cross_entropy(logits[..., :-1, :],
targets[..., 1:])``, its backward, fp32. Each parameter's gradient goes back to transformers' names through
LitGPT's own ``copy_weights_gemma_2`` / ``copy_weights_gemma_3`` (the fused qkv split as the converter splits the
weights); the output projection's output (the final cap's input a) and the gradients at a and at the logits are
kept, for the route's own first zero. LitGPT's converter copies Gemma's tied embedding into an output head of its own, so the step trains two
parameters where transformers has one: their gradients are summed into the embedding's, as the tied model's is at
the first step, and the route says so. Written as adapter_train_transformers writes a step (its ``main``).
"""

import contextlib
import sys

import adapter_protocol as protocol
from adapter_lit_gpt import build
from adapter_train_transformers import attention_array, attention_watch, converted, main

ROUTES = {"default": "litgpt finetune_full's step (chunked_cross_entropy, fp32) on GPT from convert_hf_checkpoint with "
                     "the family's named config, its sizes from config.json",
          "monitor": "two such steps inside softcapgrad's DeadZoneMonitor, beside a brute force (not a matrix route)"}
PACKAGES = ("litgpt", "torch")


def run_variant(run: protocol.Run, variant: str) -> dict:
    import torch
    from litgpt.scripts.convert_lit_checkpoint import copy_weights_gemma_2, copy_weights_gemma_3
    from litgpt.utils import chunked_cross_entropy

    torch.manual_seed(0)
    model, config, named = build(run, variant)
    model.train()
    kept = {}

    def on_head(module, args, out):  # the final cap's input a (GPT caps lm_head's output) and dL/da
        kept["precap"] = out
        out.register_hook(lambda g: kept.__setitem__("precap_grad", g))

    ids = torch.as_tensor(run.ids).view(1, -1)

    def step():
        handle = model.lm_head.register_forward_hook(on_head)
        try:
            logits = model(ids)
        finally:
            handle.remove()
        logits.register_hook(lambda g: kept.__setitem__("logits_grad", g))
        loss = chunked_cross_entropy(logits[..., :-1, :], ids[..., 1:])
        loss.backward()
        return loss, logits, {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}

    watched, calls = {}, {}
    if run.route == "monitor":
        from adapter_monitor_check import monitored_steps

        (loss, logits, grads), watched = monitored_steps(model, step)
        kept = {}  # the second step's: this route's file is the monitor's, not a step to judge
    else:
        with attention_watch(calls) if config.attention_logit_softcapping else contextlib.nullcontext():
            loss, logits, grads = step()
    hf: dict = {}
    copy = copy_weights_gemma_3 if named.lower().startswith("gemma-3") else copy_weights_gemma_2
    copy(config, hf, grads)
    untied = "lm_head.weight" in grads and model.lm_head.weight is not model.transformer.wte.weight
    if untied:  # the converter copies the tied embedding into a head of its own: the tied model's gradient is the sum
        hf["model.embed_tokens.weight"] = hf["model.embed_tokens.weight"] + grads["lm_head.weight"]
    run.did = (f"litgpt GPT({named} with config.json's sizes): attention_logit_softcapping="
               f"{config.attention_logit_softcapping}, final_logit_softcapping={config.final_logit_softcapping}; "
               "one finetune_full step, chunked_cross_entropy, fp32"
               + ("; lm_head is a parameter of its own, a copy of the embedding (training unties them): their "
                  "gradients summed here as the tied model's" if untied else ""))
    run.precision = "fp32"
    return {**converted(loss, logits, hf, **kept), **attention_array(calls), **watched}


if __name__ == "__main__":
    sys.exit(main(routes=ROUTES, run_variant=run_variant, packages=PACKAGES))
