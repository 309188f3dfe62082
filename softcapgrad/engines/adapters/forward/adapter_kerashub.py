"""Keras Hub on JAX: the backbone class Keras Hub's own Hugging Face loader picks for the folder's model type,
``from_preset`` of the folder (its conversion of config.json and the safetensors), fp32, the backbone's hidden
states, then its tied embedding in reverse (where Keras Hub applies the final cap). Imported without TensorFlow.

The registry read is Keras Hub's ``TransformersPresetLoader`` (its model types with a converter). Its Gemma 3
converter passes no layer pattern and no rope base from config.json: the backbone makes layer i local when
i % 6 < 5, with rope wavelength 10 000 for local and 1 000 000 for global layers, whatever ``layer_types`` and
``rope_parameters`` say."""

from __future__ import annotations

import os
import sys

import numpy as np

import adapter_protocol as protocol

ROUTES = {"default": "Keras Hub backbone .from_preset of the folder, JAX backend on the CPU, fp32"}
MODELS_PER_PROCESS = 7  # models one child runs in turn (catalog.models_per_process)


def keras_layer_types(n_layers: int) -> list[str]:
    """The layer kinds Keras Hub's Gemma3Backbone builds: five local layers, then one global."""
    return ["sliding_attention" if i % 6 < 5 else "full_attention" for i in range(n_layers)]


def backbone_class(run: protocol.Run, variant: str):
    """The backbone class Keras Hub's Hugging Face loader picks for the folder (its registry), with the folder and
    its config; NoArchitecture where the loader has no converter for the model type."""
    from keras_hub.src.utils.transformers.preset_loader import TransformersPresetLoader

    folder, config = run.folder(variant), run.config(variant)
    try:
        loader = TransformersPresetLoader(str(folder), config)
    except ValueError as err:
        raise protocol.NoArchitecture(f"{err} (registry read: keras_hub TransformersPresetLoader)") from err
    return loader.check_backbone_class(), folder, config


def inputs(backbone, tokens: np.ndarray) -> dict:
    """The backbone's inputs for one unpadded sequence: token ids, a padding mask of ones, and the positions where
    the backbone asks for them (Gemma 4's)."""
    feed = {"token_ids": tokens, "padding_mask": np.ones_like(tokens)}
    names = {getattr(x, "name", "").split(":")[0] for x in getattr(backbone, "inputs", None) or []}
    if "position_ids" in names or "position_ids" in getattr(backbone, "input", {}):
        feed["position_ids"] = np.arange(tokens.shape[-1], dtype=np.int32).reshape(tokens.shape)
    return feed


def run_variant(run: protocol.Run, variant: str) -> np.ndarray:
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import keras

    if keras.backend.backend() != "jax":
        raise RuntimeError(f"Keras runs on {keras.backend.backend()} here, not JAX (set KERAS_BACKEND=jax)")
    keras.config.set_floatx("float32")
    cls, folder, config = backbone_class(run, variant)
    backbone = cls.from_preset(str(folder), dtype="float32")
    tokens = run.ids.astype(np.int32).reshape(1, -1)
    hidden = backbone(inputs(backbone, tokens))
    out = np.asarray(backbone.token_embedding(hidden, reverse=True))[0]
    kinds = config.get("layer_types")
    run.did = f"keras_hub {cls.__name__}.from_preset of the folder, JAX backend, CPU, float32, no KV cache"
    if config.get("model_type") == "gemma3_text" and kinds and kinds != keras_layer_types(len(kinds)):
        run.notes = [f"config.json's layer_types {kinds} differ from the pattern Keras Hub builds "
                     f"{keras_layer_types(len(kinds))} (layer kind and rope base per layer)"]
    run.packages = ("keras", "keras-hub", "jax", "jaxlib")
    return out


if __name__ == "__main__":
    sys.exit(protocol.main(ROUTES, run_variant))
