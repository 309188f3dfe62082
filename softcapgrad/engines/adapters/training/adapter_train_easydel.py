"""One training step of EasyDeL (JAX) on the folder, as its trainer takes one.

The model is what EasyDeL's own reader of a Hugging Face folder builds (``AutoEasyDeLModelForCausalLM
.from_pretrained``: transformers loads the folder in torch, EasyDeL converts the state dict to its own Flax NNX
modules). The step is the function EasyDeL's ``Trainer`` compiles for each step, ``easydel.trainers.trainer._fn
.training_step``, jitted as the trainer jits it, on the model's state (``to_state``): the model's own
``compute_loss`` (its causal-LM loss, labels the input ids, shifted inside) and ``jax.value_and_grad`` of it.

The gradients are read through the optimizer, where the step hands them over: the state's optimizer is a
transformation that keeps each gradient in its state (in float32, which holds a bf16 or fp32 gradient exactly) and
moves no weight. Each gradient goes back to transformers' names by EasyDeL's own layout: a linear layer's
``kernel`` is the transposed ``weight``, an embedding's ``embedding`` and a norm's ``kernel`` are the ``weight``
itself. Gemma's tied head is the embedding, transposed, at call time (``apply_lm_head``); the separate
``lm_head.kernel`` the module holds is unused, and its gradient is added into the embedding's all the same (it is
0 where the tie holds). The final cap's input a is the head's output without the cap (``apply_lm_head`` on the
model's last hidden state; ``Gemma2ForCausalLM.compute_lm_logits`` caps it), from a forward jitted as the step is:
in bf16 an eager forward's a is not the step's.

Routes: ``default`` (``from_pretrained`` at its defaults: float32 weights and compute, as its signature says),
``fp32`` (the two settings EasyDeL leaves below float32 even then set to float32: the torch dtype the folder is
read in, and the attention's own dtype) and ``bf16`` (``dtype`` and ``param_dtype`` bfloat16, as EasyDeL's
``AutoState`` loader defaults). Written as adapter_train_transformers writes a step (its ``main``).
"""

import os
import re
import sys

import numpy as np

import adapter_protocol as protocol
from adapter_train_transformers import main

ROUTES = {"default": "EasyDeL's Trainer step (training_step, jitted) on AutoEasyDeLModelForCausalLM.from_pretrained "
                     "of the folder at its defaults, JAX on the CPU",
          "fp32": "the same with the folder read in float32 (torch_dtype) and the attention computed in float32 "
                  "(attn_dtype)",
          "bf16": "the same with dtype and param_dtype bfloat16 (EasyDeL's AutoState defaults)"}
PACKAGES = ("easydel", "jax", "jaxlib", "flax", "ejkernel", "eformer", "transformers", "torch")


def keeper():
    """An optax transformation whose state is the last gradient it was given (float32) and whose update is 0."""
    import jax
    import jax.numpy as jnp
    import optax

    def init(params):
        return jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)

    def update(updates, state, params=None):
        return jax.tree.map(jnp.zeros_like, updates), jax.tree.map(lambda g: g.astype(jnp.float32), updates)

    return optax.GradientTransformation(init, update)


def hf_name(path: tuple) -> tuple[str, bool]:
    """A parameter's transformers name from its path in EasyDeL's state, and whether its array is the transpose."""
    import jax

    parts = [a or b for a, b in re.findall(r"\['([^']*)'\]|\[(\d+)\]", jax.tree_util.keystr(path))]  # no .value
    leaf = parts[-1]
    if leaf not in ("kernel", "embedding"):
        raise RuntimeError(f"{'.'.join(parts)}: a parameter EasyDeL's layout was not read for here")
    return ".".join(parts[:-1] + ["weight"]), leaf == "kernel"  # a norm's kernel is 1-D: its transpose is itself


def _named(value) -> str:
    """A setting as a user writes it: a dtype by its name, a dict of them likewise."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_named(v)}" for k, v in value.items()) + "}"
    return str(getattr(value, "__name__", value))


PROBE = "cap_probe"


def probed(model, tokens: int):
    """The step's own dL/da: a parameter of zeros added to the head's output before the cap (its parent class's
    ``compute_lm_logits``, which ``Gemma2ForCausalLM.compute_lm_logits`` caps), in the logits' own dtype, so the
    forward is unchanged (x + 0 is x) and the step's gradient for it is dL/da, computed by the step itself.
    Returns the function that undoes the patch."""
    import jax.numpy as jnp
    from flax import nnx

    parent = next(c for c in type(model).__mro__[1:] if "compute_lm_logits" in vars(c))
    real = vars(parent)["compute_lm_logits"]
    dtype = jnp.dtype(model.dtype)
    setattr(model, PROBE, nnx.Param(jnp.zeros((1, tokens, model.config.vocab_size), dtype)))

    def compute_lm_logits(self, hidden_states):
        out = real(self, hidden_states)
        probe = getattr(self, PROBE, None)
        return out if probe is None else out + probe[...].astype(out.dtype)

    parent.compute_lm_logits = compute_lm_logits
    return lambda: setattr(parent, "compute_lm_logits", real)


def loaded(run: protocol.Run, variant: str):
    import jax.numpy as jnp
    import torch

    import easydel as ed

    kwargs = {}
    if run.route == "fp32":
        kwargs = {"torch_dtype": torch.float32, "config_kwargs": {"attn_dtype": jnp.float32}}
    elif run.route == "bf16":
        kwargs = {"dtype": jnp.bfloat16, "param_dtype": jnp.bfloat16}
    try:
        model = ed.AutoEasyDeLModelForCausalLM.from_pretrained(str(run.folder(variant)), auto_shard_model=False,
                                                               trust_remote_code=False, **kwargs)
    except KeyError as err:  # its registry's own words: "model type X is not defined. (upper task ...)"
        if "is not defined" in str(err):
            raise protocol.NoArchitecture(f"EasyDeL's registry: {err.args[0] if err.args else err}") from err
        raise
    if type(model).__name__ == "EasyDeLBaseModule" or not hasattr(model, "apply_lm_head"):
        raise protocol.NoArchitecture(f"EasyDeL built {type(model).__name__}, no causal LM")
    return model, kwargs


def forward(model, ids):
    """The logits and the head's output before the cap (a), from one jitted forward."""
    import jax.numpy as jnp
    from flax import nnx

    @nnx.jit
    def both(m, ids):
        a = m.apply_lm_head(m.model(input_ids=ids).last_hidden_state)
        return m(input_ids=ids).logits.astype(jnp.float32), a.astype(jnp.float32)

    return both(model, ids)


def run_variant(run: protocol.Run, variant: str) -> dict:
    # ejkernel and EasyDeL turn on JAX's persistent compilation cache in ~/.cache when first imported; it goes to the
    # run's own folder instead, so no executable compiled by an earlier run (or on another CPU) is loaded
    os.environ["COMPILE_FUNC_DIR"] = str(run.scratch("compiled"))
    import jax
    import jax.numpy as jnp

    from easydel.trainers.trainer import _fn

    run.packages = PACKAGES
    model, kwargs = loaded(run, variant)
    ids = jnp.asarray(run.ids.astype(np.int32).reshape(1, -1))
    batch = {"input_ids": ids, "attention_mask": jnp.ones_like(ids)}
    restore = probed(model, ids.shape[1])
    state = model.to_state().init_tx(keeper())
    step = jax.jit(_fn.training_step, static_argnames=("loss_config", "learning_rate_fn", "partition_spec",
                                                        "gradient_accumulation_steps", "straight_through_emulator"))
    with model.mesh:  # the forward jitted as the step is: in bf16 an eager forward rounds each op where XLA's
        # fused one does not, and its a differs from the step's by up to 91 at a ≈ 1400 (tiny Gemma 2, measured)
        logits, precap = (np.asarray(t, np.float64)[0] for t in forward(model, ids))
        new, metrics = step(state, batch)
    restore()
    grads, kept = {}, {}
    for path, g in jax.tree_util.tree_flatten_with_path(new.opt_state)[0]:
        if PROBE in jax.tree_util.keystr(path):
            kept["precap_grad"] = np.asarray(g, np.float64)[0]
            continue
        name, transposed = hf_name(path)
        g = np.asarray(g, np.float64)
        grads[name] = g.T if transposed else g
    head = grads.pop("lm_head.weight", None)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    if head is not None and tied:
        grads["model.embed_tokens.weight"] = grads["model.embed_tokens.weight"] + head
    elif head is not None:
        grads["lm_head.weight"] = head
    config = model.config
    given = ", ".join(f"{k}={_named(v)}" for k, v in kwargs.items()) or "defaults"
    run.did = (f"easydel {type(model).__name__}.from_pretrained({given}); "
               f"dtype {_named(model.dtype)}, attn_dtype {_named(getattr(config, 'attn_dtype', '?'))}, "
               f"attn_mechanism {getattr(config, 'attn_mechanism', '?')}; "
               f"training_step jitted, one step; jax on {jax.default_backend()}")
    run.precision = "bf16" if run.route == "bf16" else "fp32"
    if not np.any(kept.get("precap_grad", 0.0)):  # the step never passed through the probed head (a chunked loss)
        kept.pop("precap_grad", None)
    out = {"loss": np.asarray(float(metrics.loss), dtype=np.float64), "logits": logits, "precap": precap, **kept}
    out.update({f"grad/{k}": v for k, v in grads.items()})
    return out


if __name__ == "__main__":
    sys.exit(main(routes=ROUTES, run_variant=run_variant, packages=PACKAGES))
