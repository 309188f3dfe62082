"""One training step of Keras Hub's own Gemma as ``fit`` takes it, on the JAX or the torch backend.

The model is what Keras Hub's Hugging Face loader builds from the folder (``TransformersPresetLoader``, the backbone
class it picks, ``from_preset``), wrapped in the task class whose backbone that is (``GemmaCausalLM`` for Gemma 2),
without a preprocessor. ``compile`` keeps the task's own loss (``loss="auto"``: sparse categorical cross-entropy
on the logits) and ``fit`` runs one step on the first n − 1 token ids with the next token as each one's label, so
the loss is transformers' mean over those positions. (Fed all n with the last position weighted 0, the step's
loss and every gradient came out 15/16 of transformers' at n = 16: Keras's default reduction divides by every
position, the weighted-out one included.)

The step's gradients are read through the optimizer: plain SGD with a learning rate of ``LR`` moves each weight
by LR times its gradient, and (w0 − w1) / LR gives the gradient to fp32's precision relative to each component
(the update is rounded once, at the scale of LR·g). The task's default optimizer (AdamW) would move it by a
normalised step instead, so it is replaced: the forward, the loss and the backward are ``fit``'s own. Each
gradient goes back to transformers' names through Keras Hub's own converter: every ``port_weight`` call it makes
is recorded, and its rearrangement (a reshape and transpose) is applied to the indices of the Hugging Face
tensor, which places each component. The output projection is the tied embedding in reverse, where Keras Hub
applies the final cap: the same projection without the cap gives the final cap's input a.

Routes: ``jax`` and ``torch`` (the backend, ``keras.config.floatx`` float32) and ``jax-mixed-bf16`` and
``torch-mixed-bf16`` (the ``mixed_bfloat16`` dtype policy: bf16 compute, fp32 variables). Keras Hub's ``fit`` turns
array inputs into a grain dataset (or a TensorFlow one): the environment holds grain. Written as
adapter_train_transformers writes a step (its ``main``).
"""

import os
import sys

import numpy as np

import adapter_protocol as protocol
from adapter_kerashub import backbone_class
from adapter_train_transformers import main

ROUTES = {"jax": "Keras Hub CausalLM.fit, one step, JAX backend on the CPU, float32",
          "jax-mixed-bf16": "Keras Hub CausalLM.fit, one step, JAX backend, the mixed_bfloat16 dtype policy",
          "torch": "Keras Hub CausalLM.fit, one step, torch backend on the CPU, float32",
          "torch-mixed-bf16": "Keras Hub CausalLM.fit, one step, torch backend, the mixed_bfloat16 dtype policy"}
PACKAGES = ("keras", "keras-hub", "grain", "jax", "jaxlib", "torch")
LR = 1024.0  # a power of two: LR·g and its quotient are exact scalings


def _task_class(backbone_cls):
    """The CausalLM subclass built on ``backbone_cls`` (Keras Hub names each task's backbone class)."""
    import keras_hub

    todo, seen = [keras_hub.models.CausalLM], []
    while todo:
        cls = todo.pop()
        seen.append(cls)
        if getattr(cls, "backbone_cls", None) is backbone_cls:
            return cls
        todo.extend(c for c in cls.__subclasses__() if c not in seen)
    raise protocol.NoArchitecture(f"Keras Hub has no CausalLM task for {backbone_cls.__name__}")


def _ported(loader_cls):
    """Record every port_weight call of Keras Hub's converter: variable path -> (Hugging Face key, hook, shape)."""
    ports = {}
    real = loader_cls.port_weight

    def port_weight(self, keras_variable, hf_weight_key, hook_fn=None):
        shape = tuple(self.get_tensor(hf_weight_key).shape)
        ports[keras_variable.path] = (hf_weight_key, hook_fn, shape, list(keras_variable.shape))
        return real(self, keras_variable, hf_weight_key, hook_fn)

    loader_cls.port_weight = port_weight
    return ports, lambda: setattr(loader_cls, "port_weight", real)


def to_hf(grad: np.ndarray, hook_fn, hf_shape: tuple, keras_shape: list) -> np.ndarray:
    """A Keras variable's gradient at transformers' layout: the converter's rearrangement applied to indices."""
    index = np.arange(int(np.prod(hf_shape))).reshape(hf_shape)
    placed = np.asarray(hook_fn(index, keras_shape) if hook_fn else index.reshape(keras_shape))
    if placed.size != index.size or not np.array_equal(np.sort(placed.ravel()), index.ravel()):
        raise RuntimeError("the converter's hook is not a rearrangement: its gradient cannot be mapped back")
    out = np.empty(index.size, dtype=np.float64)
    out[placed.ravel()] = np.asarray(grad, dtype=np.float64).reshape(placed.shape).ravel()
    return out.reshape(hf_shape)


def run_variant(run: protocol.Run, variant: str) -> dict:
    backend = run.route.split("-")[0]
    os.environ["KERAS_BACKEND"] = backend  # read once, when keras is first imported
    import keras
    from keras_hub.src.utils.transformers import safetensor_utils

    run.packages = PACKAGES
    if keras.backend.backend() != backend:
        raise RuntimeError(f"Keras runs on {keras.backend.backend()} here, not {backend}")
    keras.config.set_floatx("float32")
    mixed = run.route.endswith("-mixed-bf16")
    keras.mixed_precision.set_global_policy("mixed_bfloat16" if mixed else "float32")
    keras.utils.set_random_seed(0)
    cls, folder, _ = backbone_class(run, variant)
    ports, restore = _ported(safetensor_utils.SafetensorLoader)
    try:
        backbone = cls.from_preset(str(folder))
    finally:
        restore()
    task = _task_class(cls)(backbone=backbone, preprocessor=None)
    task.compile(optimizer=keras.optimizers.SGD(learning_rate=LR), loss="auto", weighted_metrics=[])
    ids = run.ids.astype(np.int32).reshape(1, -1)
    x = {"token_ids": ids, "padding_mask": np.ones_like(ids)}
    fed = {"token_ids": ids[:, :-1], "padding_mask": np.ones_like(ids[:, :-1])}  # the causal model's first n − 1
    before = {v.path: np.asarray(keras.ops.convert_to_numpy(v), np.float64) for v in task.trainable_variables}
    logits = np.asarray(keras.ops.convert_to_numpy(task(x)), np.float64)[0]
    embedding = backbone.token_embedding
    cap = getattr(embedding, "logit_soft_cap", None)
    embedding.logit_soft_cap = None
    try:
        precap = np.asarray(keras.ops.convert_to_numpy(embedding(backbone(x), reverse=True)), np.float64)[0]
    finally:
        embedding.logit_soft_cap = cap
    history = task.fit(fed, ids[:, 1:], batch_size=1, epochs=1, shuffle=False, verbose=0)
    grads = {}
    for v in task.trainable_variables:
        if v.path not in ports:
            raise RuntimeError(f"{v.path} was not loaded by Keras Hub's converter: no transformers name for it")
        key, hook, hf_shape, keras_shape = ports[v.path]
        g = (before[v.path] - np.asarray(keras.ops.convert_to_numpy(v), np.float64)) / LR
        grads[key] = grads.get(key, 0.0) + to_hf(g, hook, hf_shape, keras_shape)
    run.did = (f"keras_hub {type(task).__name__}({cls.__name__}.from_preset of the folder), {backend} backend, CPU, "
               f"{'mixed_bfloat16' if mixed else 'float32'}; compile(loss='auto') and fit, one step, SGD(lr={LR:g}) "
               f"to read the gradients as (w0 − w1)/lr; final_logit_soft_cap={cap}")
    run.precision = "bf16" if mixed else "fp32"
    out = {"loss": np.asarray(float(history.history["loss"][0]), dtype=np.float64), "logits": logits,
           "precap": precap}
    out.update({f"grad/{k}": v for k, v in grads.items()})
    return out


if __name__ == "__main__":
    sys.exit(main(routes=ROUTES, run_variant=run_variant, packages=PACKAGES))
