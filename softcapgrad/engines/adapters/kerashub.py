"""Keras Hub on JAX: its own conversion of a transformers folder (``<Backbone>.from_preset(folder)``), the
backbone's hidden states, then its tied embedding in reverse (where Keras Hub applies the final cap), fp32.
Keras Hub's registry here is the backbone class each model type converts to."""

import os

import numpy as np

import protocol

ROUTES = {"default": "Keras Hub's Backbone.from_preset of the transformers folder, JAX backend, fp32"}
PACKAGES = ("keras-hub", "keras", "jax", "jaxlib")


def run_variant(run, variant):
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import keras
    import keras_hub

    if keras.backend.backend() != "jax":
        raise RuntimeError(f"Keras runs on {keras.backend.backend()} here, not JAX")
    keras.config.set_floatx("float32")
    kind = run.config(variant).get("model_type")
    classes = {"gemma2": "GemmaBackbone", "gemma3_text": "Gemma3Backbone"}
    if kind not in classes:
        raise protocol.NoArchitecture(f"keras_hub.models converts gemma2 and gemma3_text checkpoints to "
                                      f"GemmaBackbone / Gemma3Backbone; {kind} is not among them")
    backbone = getattr(keras_hub.models, classes[kind]).from_preset(str(run.folder(variant)), dtype="float32")
    tokens = np.asarray(run.ids, dtype=np.int32).reshape(1, -1)
    hidden = backbone({"token_ids": tokens, "padding_mask": np.ones_like(tokens)})
    run.did = f"keras_hub.models.{classes[kind]}.from_preset (JAX, float32), tied embedding reversed for logits"
    run.packages = PACKAGES
    return np.asarray(backbone.token_embedding(hidden, reverse=True))[0]


if __name__ == "__main__":
    raise SystemExit(protocol.main(ROUTES, run_variant))
