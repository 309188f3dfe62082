"""One training step of a transformers model whose loss is a fused linear cross-entropy: the final cap inside the loss.

A fused loss takes the final hidden state h and the output projection's weight W and never builds the logits; the
final cap is one of its arguments, so a user who leaves it out trains without the cap while the model's own
forward would apply it. The model is loaded as adapter_transformers_load loads it, with eager attention (so the
attention cap is transformers' own), fp32. The step takes h from the model's base (``model.model``, its final
norm applied) and W from ``get_output_embeddings()`` (Gemma's tied embedding), and the loss over the first n − 1
positions against the next token, mean-reduced, then its backward.

Routes:
- ``cce``: Cut Cross-Entropy's ``linear_cross_entropy(h, W, targets, softcap=c, impl="torch_compile")``, c the
  config's ``final_logit_softcapping``: its implementation for machines without a GPU (a ``torch.compile``d
  matmul, ``softcap·tanh(z/softcap)`` and cross-entropy).
- ``cce-no-softcap``: the same call without ``softcap``, as its README's example makes it.
- ``cce-default``: the call with its default implementation (``impl="cce"``, Triton kernels), as on a GPU.
- ``liger``: Liger-Kernel's ``_apply_liger_kernel_to_instance(model=...)`` at its defaults (for Gemma 2: its
  rotary, RMSNorm and GeGLU kernels and the fused linear cross-entropy, which receives the config's final cap),
  then ``model(input_ids, labels=input_ids)``, the usual step. A model type it has no kernels for (it would log
  that and patch nothing) is "no such architecture", not a step of transformers' own code.

The step returns no logits: each position's log-prob of its next token is read from the same loss with
``reduction="none"`` (its negative), and written as ``token_log_probs``, as trl's fused head is. Written as
adapter_train_transformers writes a step (its ``main``).
"""

import sys

import numpy as np

import adapter_protocol as protocol
from adapter_train_transformers import main
from adapter_transformers_load import load

ROUTES = {"cce": "Cut Cross-Entropy linear_cross_entropy(h, W, targets, softcap=final_logit_softcapping, "
                 "impl='torch_compile'), fp32, eager attention",
          "cce-no-softcap": "the same call without softcap, as Cut Cross-Entropy's README example makes it",
          "cce-default": "the same call with its default implementation (Triton kernels)",
          "liger": "Liger-Kernel's _apply_liger_kernel_to_instance(model) at its defaults, then model(ids, labels=ids)"}
PACKAGES = ("transformers", "torch", "cut-cross-entropy", "liger-kernel", "triton")


class _Loaded:
    def __init__(self, run):
        self.route, self.folder = "eager", run.folder


def _cce(model, ids, route: str):
    import torch
    from cut_cross_entropy import linear_cross_entropy

    c = model.config.final_logit_softcapping if route != "cce-no-softcap" else None
    impl = {"cce-default": "cce"}.get(route, "torch_compile")
    x = torch.as_tensor(ids, dtype=torch.long).view(1, -1)
    base = getattr(model, model.base_model_prefix)
    h = base(input_ids=x, use_cache=False).last_hidden_state[0, :-1]
    w = model.get_output_embeddings().weight
    targets = x[0, 1:]
    loss = linear_cross_entropy(h, w, targets, softcap=c, impl=impl)
    loss.backward()
    with torch.no_grad():
        each = linear_cross_entropy(h.detach(), w.detach(), targets, softcap=c, impl=impl, reduction="none")
    return loss, -each, f"linear_cross_entropy(impl={impl!r}, softcap={c})"


def _liger(model, ids):
    import torch
    from liger_kernel.transformers import _apply_liger_kernel_to_instance
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

    kind = model.config.model_type
    if kind not in MODEL_TYPE_TO_APPLY_LIGER_FN:  # it would log this and patch nothing: the model's own loss would run
        raise protocol.NoArchitecture(f"Liger-Kernel has no kernels for model_type {kind} "
                                      "(liger_kernel.transformers.monkey_patch.MODEL_TYPE_TO_APPLY_LIGER_FN)")
    _apply_liger_kernel_to_instance(model=model)
    x = torch.as_tensor(ids, dtype=torch.long).view(1, -1)
    out = model(input_ids=x, labels=x, use_cache=False)
    out.loss.backward()
    logits = getattr(out, "logits", None)
    if logits is None:
        raise RuntimeError("Liger's forward returned no logits and no per-position loss to judge")
    z = logits.detach()[0, :-1].double()
    each = torch.log_softmax(z, -1).gather(-1, x[0, 1:, None])[:, 0]
    return out.loss, each, "_apply_liger_kernel_to_instance(model) at its defaults"


def run_variant(run: protocol.Run, variant: str) -> dict:
    import torch

    torch.manual_seed(0)
    model, attention, dtype = load(_Loaded(run), variant)
    model.train()
    loss, log_probs, how = _liger(model, run.ids) if run.route == "liger" else _cce(model, run.ids, run.route)
    run.did = f"{type(model).__name__}, attention {attention}, weights {dtype}; loss {how}; one backward, fp32"
    run.precision = "fp32"
    out = {"loss": np.asarray(float(loss.detach()), dtype=np.float64),
           "token_log_probs": log_probs.detach().double().cpu().numpy().copy()}
    out.update({f"grad/{n}": p.grad.detach().double().cpu().numpy().copy() for n, p in model.named_parameters()
                if p.grad is not None})
    return out


if __name__ == "__main__":
    sys.exit(main(routes=ROUTES, run_variant=run_variant, packages=PACKAGES))
