"""penzai (JAX): its own Gemma transformer, where penzai can load the folder's weights.

penzai builds Gemma from the gemma library's checkpoint parameters (``gemma_from_pretrained_checkpoint``) and
reads Hugging Face models only for the families its other variants name (``*_from_huggingface_model``, each taking
a transformers model object of that family). The adapter asks the installed penzai itself, by importing its
variants and reading their functions and Gemma's presets, and the row is what it finds: the model types it has no
transformer for, or the loader a user would need and the reason it cannot take this folder. No converter of ours
stands in for one. Written as adapter_train_transformers writes a step (its ``main``).
"""

import importlib
import inspect
import pkgutil
import sys

import adapter_protocol as protocol
from adapter_train_transformers import main

ROUTES = {"default": "penzai's own Gemma from the folder's weights, through a reader of a Hugging Face folder or "
                     "model if it ships one for Gemma (it is looked for)"}
PACKAGES = ("penzai", "jax", "jaxlib", "treescope")


def loaders() -> dict[str, str]:
    """Each function of penzai's transformer variants that loads weights, with its first parameter's name."""
    from penzai.models.transformer import variants

    found = {}
    for info in pkgutil.iter_modules(variants.__path__):
        module = importlib.import_module(f"{variants.__name__}.{info.name}")
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if fn.__module__ == module.__name__ and ("huggingface" in name or "pretrained" in name):
                found[f"{info.name}.{name}"] = next(iter(inspect.signature(fn).parameters))
    return found


def run_variant(run: protocol.Run, variant: str):
    from importlib import metadata

    from penzai.models.transformer import variants

    run.packages = PACKAGES
    config = run.config(variant)
    kind = config.get("model_type", "?")
    held = sorted(info.name for info in pkgutil.iter_modules(variants.__path__))
    if not kind.startswith("gemma") or "gemma" not in held:
        raise protocol.NoArchitecture(f"penzai's transformer variants are {', '.join(held)}; none is {kind}")
    from penzai.models.transformer.variants import gemma

    generation = kind[len("gemma"):].split("_")[0] or "1"  # gemma2 -> 2, gemma3_text -> 3
    presets = sorted(gemma._GEMMA_PRESETS)
    if not any(p.startswith(f"gemma{generation}_" if generation != "1" else "gemma_") for p in presets):
        raise protocol.NoArchitecture(f"penzai's Gemma presets are {', '.join(presets)}: none of Gemma {generation}")
    found = loaders()
    gemma_readers = [n for n in found if n.startswith("gemma.")]
    layers = sorted(v["num_decoder_blocks"] for v in gemma._GEMMA_PRESETS.values())
    hf = sorted(n.split(".")[0] for n in found if "huggingface" in n)
    raise RuntimeError(  # kept short: a row's reason is cut at 300 characters
        f"penzai {metadata.version('penzai')} reads no Hugging Face Gemma: "
        f"{', '.join(n.split('.')[-1] for n in gemma_readers)} takes the gemma library's checkpoint at its presets' "
        f"layer counts ({', '.join(map(str, layers))}; this folder has {config.get('num_hidden_layers')}); its "
        f"Hugging Face readers (*_from_huggingface_model) are of {', '.join(hf)}")


if __name__ == "__main__":
    sys.exit(main(routes=ROUTES, run_variant=run_variant, packages=PACKAGES))
