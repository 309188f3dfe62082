"""One training step of mlx-lm's own model on the MLX CPU build, as ``mlx_lm.lora`` trains it.

The model is ``mlx_lm.load(folder)`` (mlx-lm's reading of config.json and the safetensors, its own model class).
The step is mlx-lm's: ``nn.value_and_grad`` of ``mlx_lm.tuner.trainer.default_loss`` (the model on
``batch[:, :-1]``, cross-entropy against ``batch[:, 1:]`` under the length mask, summed in fp32 and divided by the
unmasked count). The batch is the n token ids and one more, with the lengths masking that last target out, so
the model runs on exactly the n ids and the loss is the mean over the n − 1 next-token predictions, transformers'.

What ``mlx_lm.lora`` does before its first step, done here the same way: ``model.freeze()``, then for
``--fine-tune-type full`` every transformer block unfrozen (the embedding and the final norm stay frozen, so they
get no gradient), and for ``lora`` its ``linear_to_lora_layers`` with the CLI's defaults (rank 8, scale 20,
dropout 0, every linear layer of the blocks); the full step names what stays frozen (``frozen/<name>``), which the
check leaves out. ``num_layers`` is -1 (every block): the CLI's default of 16 is
refused on a model with fewer blocks. A LoRA step's gradients are those of each adapted layer's ``lora_b``,
written as peft lays them out (dL/dB [out, r] under the base weight's name, A [r, in] as ``lora_A/<weight>``,
the scale as ``lora_scale``): mlx-lm's ``lora_a`` [in, r] and ``lora_b`` [r, out] are their transposes.

Gradients at the final cap's input a and at the logits z come from MLX's own autodiff: two zero arrays are added,
one to the output projection's output (``embed_tokens.as_linear`` where the embedding is tied, where mlx-lm's
Gemma applies the final cap to it) and one to the returned logits, and their gradients are dL/da and dL/dz.
Routes ``full`` (the weights' dtype, fp32 here), ``full-bf16`` (``model.set_dtype(mx.bfloat16)`` first: weights,
activations and the cap in bf16, as an MLX checkpoint in bf16 trains) and ``lora``. Written as
adapter_train_transformers writes a step (its ``main``).
"""

import sys

import numpy as np

import adapter_protocol as protocol
from adapter_mlxlm import module_for
from adapter_train_transformers import main

ROUTES = {"full": "mlx_lm.lora --fine-tune-type full's step (default_loss, every block unfrozen), the weights' dtype",
          "full-bf16": "the same step after model.set_dtype(mx.bfloat16): weights and activations in bf16",
          "lora": "mlx_lm.lora's LoRA step at its CLI defaults (rank 8, scale 20, dropout 0, every block)"}
PACKAGES = ("mlx", "mlx-cpu", "mlx-lm")
LORA = {"rank": 8, "dropout": 0.0, "scale": 20.0}  # mlx_lm.lora's CONFIG_DEFAULTS["lora_parameters"]


def _probed(model, n: int, vocab: int):
    """``model`` inside a module that adds two zero arrays: at the output projection's output and at the logits."""
    import mlx.core as mx
    import mlx.nn as nn

    class Probed(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model
            self.at_logits = mx.zeros((1, n, vocab), dtype=mx.float32)
            self.at_precap = mx.zeros((1, n, vocab), dtype=mx.float32)

        def __call__(self, inputs, cache=None):
            return model(inputs, cache) + self.at_logits.astype(model_dtype(model))

    probed, seen = Probed(), {}  # seen: outside the module, whose dicts and arrays would be parameters
    inner = getattr(model, "model", None)
    embedding = getattr(inner, "embed_tokens", None)
    tied = embedding is not None and not hasattr(model, "lm_head")
    if tied:
        real = embedding.as_linear

        def as_linear(x):
            a = real(x) + probed.at_precap.astype(x.dtype)
            seen["precap"] = a
            return a

        embedding.as_linear = as_linear
    return probed, tied, seen


def model_dtype(model):
    from mlx.utils import tree_flatten

    return tree_flatten(model.parameters())[0][1].dtype


def _names(folder) -> set:
    from safetensors import safe_open

    names = set()
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="numpy") as f:
            names |= set(f.keys())
    return names


def run_variant(run: protocol.Run, variant: str) -> dict:
    import mlx.core as mx
    import mlx.nn as nn
    import mlx_lm
    from mlx.utils import tree_flatten
    from mlx_lm.tuner.trainer import default_loss
    from mlx_lm.tuner.utils import linear_to_lora_layers

    mx.set_default_device(mx.cpu)
    mx.random.seed(0)
    name = module_for(run.config(variant).get("model_type", "?"))
    model, _ = mlx_lm.load(str(run.folder(variant)))
    if run.route == "full-bf16":
        model.set_dtype(mx.bfloat16)
    model.freeze()
    if run.route == "lora":
        linear_to_lora_layers(model, -1, dict(LORA))
    else:
        for block in model.layers:
            block.unfreeze()
    ids = run.ids.astype(np.int32)
    n = ids.size
    batch = mx.array(np.concatenate([ids, ids[:1]]).reshape(1, -1))  # one more target, masked out by the lengths
    lengths = mx.array([[1, n - 1]])
    probed, tied, seen = _probed(model, n, int(run.config(variant)["vocab_size"]))
    logits = probed(mx.array(ids.reshape(1, -1)))
    precap = seen.get("precap")
    (loss, _), grads = nn.value_and_grad(probed, default_loss)(probed, batch, lengths)
    flat = dict(tree_flatten(grads))
    out = {"loss": np.asarray(float(loss.astype(mx.float32)), dtype=np.float64),
           "logits": np.array(logits.astype(mx.float32), dtype=np.float64)[0],
           "logits_grad": np.array(flat.pop("at_logits"), dtype=np.float64)[0]}
    at_precap = flat.pop("at_precap")
    if tied and precap is not None:
        out["precap"] = np.array(precap.astype(mx.float32), dtype=np.float64)[0]
        out["precap_grad"] = np.array(at_precap, dtype=np.float64)[0]
    known = _names(run.folder(variant))
    modules = dict(model.named_modules())
    for key, g in flat.items():
        key = key.removeprefix("model.")
        g = np.array(g.astype(mx.float32), dtype=np.float64)
        if key.endswith(".lora_b"):
            base = key.removesuffix(".lora_b")
            hf = base + ".weight"
            out[f"grad/{hf}"] = g.T
            out[f"lora_A/{hf}"] = np.array(modules[base].lora_a.astype(mx.float32), dtype=np.float64).T
            continue
        if key.endswith(".lora_a"):  # at B = 0 its gradient is 0: the check reads B's
            continue
        hf = key.replace(".linear.weight", ".weight")
        if hf not in known:
            raise RuntimeError(f"mlx-lm's parameter {key} has no tensor {hf} in the folder: no transformers name "
                               "for it")
        out[f"grad/{hf}"] = g
    if run.route == "lora":
        out["lora_scale"] = np.asarray(LORA["scale"], dtype=np.float64)
    else:  # what mlx-lm's full fine-tune leaves frozen, named so that the check leaves it out
        trained = {k for k, _ in tree_flatten(model.trainable_parameters())}
        out.update({f"frozen/{k}": np.zeros(0) for k, _ in tree_flatten(model.parameters()) if k not in trained})
    dtypes = sorted({str(p.dtype).rsplit(".", 1)[-1] for _, p in tree_flatten(model.parameters())})
    run.precision = "bf16" if run.route == "full-bf16" else "fp32"
    cap = getattr(model, "final_logit_softcapping", getattr(getattr(model, "args", None), "final_logit_softcapping",
                                                            None))
    run.did = (f"mlx_lm.load, mlx_lm.models.{name}.Model on mx.cpu, weights {'/'.join(dtypes)}; model.freeze(), "
               + ("linear_to_lora_layers(rank 8, scale 20, every block)" if run.route == "lora" else
                  "every block unfrozen (embedding and final norm frozen)")
               + f"; one value_and_grad of default_loss; final_logit_softcapping={cap}"
               + ("" if tied else "; untied output head: the final cap's input is not probed"))
    return out


if __name__ == "__main__":
    sys.exit(main(routes=ROUTES, run_variant=run_variant, packages=PACKAGES))
