"""One training step of torchtune's Gemma 2 as its full fine-tune recipe takes it, with what the step computed.

The model is built as adapter_torch_tune builds it (``FullModelHFCheckpointer`` converts the folder, the
``gemma2`` component builder with the folder's sizes; route ``default`` passes the caps as torchtune's named
Gemma 2 builders do, ``config-caps`` from config.json). The step is full_finetune_single_device's: the model in
training mode with its output in chunks for ``CEWithChunkedOutputLoss``, the labels the tokens shifted left with
the ignore index last, the loss's backward, fp32. Each parameter's gradient is converted back to transformers'
names (and the query and key rows to its layout) by torchtune's own ``gemma2_tune_to_hf``, as the checkpointer
converts the weights when it saves; the returned logits are the chunks joined. Written as
adapter_train_transformers writes a step (its ``main``); torchtune caps the final norm's output, so no
output-projection input is written.
"""

import sys

import adapter_protocol as protocol
from adapter_torch_tune import build
from adapter_train_transformers import attention_array, attention_watch, converted, main

ROUTES = {
    "default": "full fine-tune step (CEWithChunkedOutputLoss, fp32) on the gemma2 builder with the caps as torchtune's "
               "named Gemma 2 builders pass them (hidden 30, final 50)",
    "config-caps": "the same step with hidden_capping_value and final_capping_value read from config.json",
    "monitor": "two config-caps steps inside softcapgrad's DeadZoneMonitor, beside a brute force (not a matrix route)",
}
PACKAGES = ("torchtune", "torchao", "torch")


def run_variant(run: protocol.Run, variant: str) -> dict:
    import torch
    from torchtune.models.gemma2._convert_weights import gemma2_tune_to_hf
    from torchtune.modules.loss import CEWithChunkedOutputLoss

    torch.manual_seed(0)
    model, values, source, config = build(run, variant)
    loss_fn = CEWithChunkedOutputLoss()
    model.set_num_output_chunks(loss_fn.num_output_chunks)
    model.train()
    tokens = torch.as_tensor(run.ids).view(1, -1)
    labels = torch.hstack((tokens[:, 1:], torch.full((1, 1), loss_fn.ignore_index)))

    def step():
        chunks = model(tokens)
        loss = loss_fn(chunks, labels)
        loss.backward()
        return loss, chunks, {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}

    watched, calls = {}, {}
    if run.route == "monitor":
        from adapter_monitor_check import monitored_steps

        (loss, chunks, grads), watched = monitored_steps(model, step)
    else:
        with attention_watch(calls):  # the attention cap's calls, whatever value the builder gave it
            loss, chunks, grads = step()
    hf = gemma2_tune_to_hf(grads, num_heads=config["num_attention_heads"], num_kv_heads=config["num_key_value_heads"],
                           dim=config["hidden_size"], head_dim=config["head_dim"])
    logits = torch.cat(chunks, dim=1) if isinstance(chunks, list) else chunks
    run.did = (f"torchtune gemma2 builder, hidden_capping_value={values['hidden_capping_value']}, "
               f"final_capping_value={values['final_capping_value']} (from {source}); one full fine-tune step, "
               "CEWithChunkedOutputLoss, fp32")
    run.precision = "fp32"
    return {**converted(loss, logits, hf), **attention_array(calls), **watched}


if __name__ == "__main__":
    sys.exit(main(routes=ROUTES, run_variant=run_variant, packages=PACKAGES))
