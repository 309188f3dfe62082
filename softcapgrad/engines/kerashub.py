"""Keras Hub on JAX: ``GemmaBackbone.from_preset`` (Gemma 2) or ``Gemma3Backbone.from_preset`` (Gemma 3) of the
transformers directory (Keras Hub's own conversion of the config and weights), the backbone's hidden states,
then its tied embedding in reverse (where Keras Hub applies the final cap). Imported without TensorFlow."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np


def logits(folder: Path, ids: np.ndarray, work: Path, name: str = "kerashub") -> np.ndarray:
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import keras
    import keras_hub

    if keras.backend.backend() != "jax":
        raise RuntimeError(f"Keras runs on {keras.backend.backend()} here, not JAX (set KERAS_BACKEND=jax)")
    keras.config.set_floatx("float32")
    import json

    kind = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("model_type")
    classes = {"gemma2": keras_hub.models.GemmaBackbone, "gemma3_text": keras_hub.models.Gemma3Backbone}
    if kind not in classes:
        raise ValueError(f"Keras Hub is run here on gemma2 and gemma3_text, not {kind}")
    backbone = classes[kind].from_preset(str(folder), dtype="float32")
    tokens = np.asarray(ids, dtype=np.int32).reshape(1, -1)
    hidden = backbone({"token_ids": tokens, "padding_mask": np.ones_like(tokens)})
    return np.asarray(backbone.token_embedding(hidden, reverse=True))[0]
