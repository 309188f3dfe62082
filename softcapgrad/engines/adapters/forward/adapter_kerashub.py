"""Keras on JAX: keras-nlp's own code (0.14.0 to 0.15.1; from 0.16.1 keras-nlp only re-exports keras-hub) or Keras
Hub, whichever the interpreter holds in the releases ``RELEASES`` declares (keras_nlp before keras_hub); fp32, no
TensorFlow model code (keras-nlp imports TensorFlow for its preprocessing, never run here).

Keras Hub: the backbone class its own Hugging Face loader picks for the folder's model type, ``from_preset`` of the
folder (its conversion of config.json and the safetensors). keras-nlp: its transformers converter passes no Gemma 2
field to the backbone (keras_nlp/src/utils/transformers/convert_gemma.py:39-47 at 0.14.1), so a Gemma 2 folder is
built here as Keras Hub's converter builds it (the caps, the window, the post norms from config.json) and its weights
are copied in the same layout.

Three routes, each the logits one public call returns:

- ``default``: the backbone's hidden states, then its tied embedding in reverse (where Keras Hub and keras-nlp from
  0.14.2 apply the final cap, ReversibleEmbedding's ``logit_soft_cap``);
- ``score``: ``GemmaCausalLM.score(scoring_mode="logits")`` (keras-nlp 0.14.1 computes it without the final cap,
  keras_nlp/src/models/gemma/gemma_causal_lm.py:446, fixed in 0.14.2, keras-team PR #1712);
- ``generate``: the logits generation's sampler sees: ``_build_cache`` of the sequence as ``generate_step`` builds
  it, then ``call_with_cache`` one token at a time at its index, as the sampler's ``next`` calls it (keras-nlp
  0.14.1 caps there, gemma_causal_lm.py:231-235).

The registry read is Keras Hub's ``TransformersPresetLoader`` (its model types with a converter). Its Gemma 3
converter passes no layer pattern and no rope base from config.json: the backbone makes layer i local when
i % 6 < 5, with rope wavelength 10 000 for local and 1 000 000 for global layers, whatever ``layer_types`` and
``rope_parameters`` say."""

from __future__ import annotations

import os
import re
import sys
from importlib import metadata

import numpy as np

import adapter_protocol as protocol

ROUTES = {"default": "the backbone of the folder, its tied embedding in reverse; JAX backend on the CPU, fp32",
          "score": "GemmaCausalLM.score(scoring_mode='logits') of that backbone; JAX, CPU, fp32",
          "generate": "GemmaCausalLM.call_with_cache one token at a time after _build_cache, as generate's sampler "
                      "calls it; JAX, CPU, fp32"}
# The releases this adapter speaks, first to last as the package index lists them: keras-nlp's own code from its
# first release with Gemma 2 (0.14.0) to its last (0.15.1), then Keras Hub from its first release to the pinned one.
RELEASES = {"keras-nlp": ("0.14.0", "0.15.1"), "keras-hub": ("0.16.1", "0.32.0")}
MODELS_PER_PROCESS = 7  # models one child runs in turn (catalog.models_per_process)


def release(text: str) -> tuple[int, ...]:
    """A release as numbers (``0.14.1`` -> (0, 14, 1)); a suffix after them is dropped."""
    return tuple(int(x) for x in re.findall(r"\d+", text.split("+")[0])[:3])


def speaks(package: str, version: str | None) -> bool:
    first, last = RELEASES[package]
    return version is not None and release(first) <= release(version) <= release(last)


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def library():
    """keras_nlp where its own code is installed at a release declared here, else keras_hub at one."""
    if speaks("keras-nlp", _version("keras-nlp")):
        import keras_nlp

        return keras_nlp
    if speaks("keras-hub", _version("keras-hub")):
        import keras_hub

        return keras_hub
    spans = "; ".join(f"{k} {a} to {b}" for k, (a, b) in RELEASES.items())
    raise RuntimeError(f"keras-nlp {_version('keras-nlp')}, keras-hub {_version('keras-hub')}: outside {spans}")


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


def _heads(w: np.ndarray, shape) -> np.ndarray:
    """A transformers q/k/v projection [heads * head_dim, hidden] as Keras' kernel [heads, hidden, head_dim]."""
    return np.transpose(w.reshape(shape[0], shape[2], shape[1]), (0, 2, 1))


def nlp_backbone(lib, run: protocol.Run, variant: str):
    """keras-nlp's GemmaBackbone for a Gemma 2 folder, its arguments and weights as Keras Hub's converter maps
    them (keras_hub/src/utils/transformers/convert_gemma.py at 0.32.0)."""
    from safetensors.numpy import load_file

    folder, config = run.folder(variant), run.config(variant)
    if config.get("model_type") != "gemma2":
        raise protocol.NoArchitecture(f"model type {config.get('model_type')!r}: only gemma2 is built here for "
                                      f"keras-nlp {lib.__version__}")
    c = config
    backbone = lib.models.GemmaBackbone(
        vocabulary_size=c["vocab_size"], num_layers=c["num_hidden_layers"], num_query_heads=c["num_attention_heads"],
        num_key_value_heads=c["num_key_value_heads"], hidden_dim=c["hidden_size"],
        intermediate_dim=c["intermediate_size"] * 2, head_dim=c["head_dim"],
        query_head_dim_normalize=c["head_dim"] == c["query_pre_attn_scalar"], use_post_ffw_norm=True,
        use_post_attention_norm=True, final_logit_soft_cap=c["final_logit_softcapping"],
        attention_logit_soft_cap=c["attn_logit_softcapping"], sliding_window_size=c["sliding_window"],
        use_sliding_window_attention=True, layer_norm_epsilon=c.get("rms_norm_eps", 1e-6), dtype="float32")
    weights = {}
    for f in sorted(folder.glob("*.safetensors")):
        weights.update(load_file(str(f)))

    def put(variable, key, shape_fn=None):
        w = weights[key].astype(np.float32)
        variable.assign(shape_fn(w, tuple(variable.shape)) if shape_fn else w)

    put(backbone.get_layer("token_embedding").embeddings, "model.embed_tokens.weight")
    for i in range(backbone.num_layers):
        b, p = backbone.get_layer(f"decoder_block_{i}"), f"model.layers.{i}."
        for norm, key in (("pre_attention_norm", "input_layernorm"),
                          ("post_attention_norm", "post_attention_layernorm"),
                          ("pre_ffw_norm", "pre_feedforward_layernorm"),
                          ("post_ffw_norm", "post_feedforward_layernorm")):
            put(getattr(b, norm).variables[0], f"{p}{key}.weight")
        for dense, key in (("query_dense", "q_proj"), ("key_dense", "k_proj"), ("value_dense", "v_proj")):
            put(getattr(b.attention, dense).kernel, f"{p}self_attn.{key}.weight", _heads)
        put(b.attention.output_dense.kernel, f"{p}self_attn.o_proj.weight",
            lambda w, s: np.transpose(w.reshape(s[2], s[0], s[1]), (1, 2, 0)))
        for dense, key in (("gating_ffw", "gate_proj"), ("gating_ffw_2", "up_proj"), ("ffw_linear", "down_proj")):
            put(getattr(b, dense).kernel, f"{p}mlp.{key}.weight", lambda w, s: w.T)
    put(backbone.get_layer("final_normalization").variables[0], "model.norm.weight")
    return backbone, config


def inputs(backbone, tokens: np.ndarray) -> dict:
    """The backbone's inputs for one unpadded sequence: token ids, a padding mask of ones, and the positions where
    the backbone asks for them (Gemma 4's)."""
    feed = {"token_ids": tokens, "padding_mask": np.ones_like(tokens)}
    names = {getattr(x, "name", "").split(":")[0] for x in getattr(backbone, "inputs", None) or []}
    if "position_ids" in names or "position_ids" in getattr(backbone, "input", {}):
        feed["position_ids"] = np.arange(tokens.shape[-1], dtype=np.int32).reshape(tokens.shape)
    return feed


def causal_lm(lib, backbone):
    """The library's GemmaCausalLM over the backbone, without a preprocessor (token ids in); NoArchitecture for
    another backbone (score and generate are read on Gemma's task model)."""
    if type(backbone).__name__ != "GemmaBackbone":
        raise protocol.NoArchitecture(f"{type(backbone).__name__}: the score and generate routes run "
                                      "GemmaCausalLM only")
    return lib.models.GemmaCausalLM(backbone=backbone, preprocessor=None)


def sampled(lm, tokens: np.ndarray) -> np.ndarray:
    """The logits generate's sampler sees at each position: the cache ``_build_cache`` fills, then one
    ``call_with_cache`` per token at its index (the sampler's ``next``)."""
    _, cache = lm._build_cache(tokens)
    rows = []
    for i in range(tokens.shape[1]):
        logits, _, cache = lm.call_with_cache(tokens[:, i:i + 1], cache, i)
        rows.append(np.asarray(logits)[0, 0])
    return np.stack(rows)


def run_variant(run: protocol.Run, variant: str) -> np.ndarray:
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import keras

    if keras.backend.backend() != "jax":
        raise RuntimeError(f"Keras runs on {keras.backend.backend()} here, not JAX (set KERAS_BACKEND=jax)")
    keras.config.set_floatx("float32")
    lib = library()
    name = lib.__name__
    if name == "keras_nlp":
        backbone, config = nlp_backbone(lib, run, variant)
        how = "GemmaBackbone built from config.json"
    else:
        cls, folder, config = backbone_class(run, variant)
        backbone, how = cls.from_preset(str(folder), dtype="float32"), f"{cls.__name__}.from_preset of the folder"
    tokens = run.ids.astype(np.int32).reshape(1, -1)
    if run.route == "default":
        out = np.asarray(backbone.token_embedding(backbone(inputs(backbone, tokens)), reverse=True))[0]
        call = "the backbone, token_embedding(reverse=True)"
    elif run.route == "score":
        mask = np.ones_like(tokens, dtype=bool)
        out = np.asarray(causal_lm(lib, backbone).score(tokens, padding_mask=mask, scoring_mode="logits"))[0]
        call = "GemmaCausalLM.score(scoring_mode='logits')"
    else:
        out, call = sampled(causal_lm(lib, backbone), tokens), "GemmaCausalLM.call_with_cache per token"
    kinds = config.get("layer_types")
    run.did = f"{name} {lib.__version__} {how}, {call}, JAX backend, CPU, float32"
    if config.get("model_type") == "gemma3_text" and kinds and kinds != keras_layer_types(len(kinds)):
        run.notes = [f"config.json's layer_types {kinds} differ from the pattern Keras Hub builds "
                     f"{keras_layer_types(len(kinds))} (layer kind and rope base per layer)"]
    run.packages = ("keras", name.replace("_", "-"), "jax", "jaxlib")
    return out


if __name__ == "__main__":
    sys.exit(protocol.main(ROUTES, run_variant))
