"""One training step of Google DeepMind's ``gemma`` (JAX) on the folder's weights, where the library can load them.

It trains its own transformers (``gemma.gm.nn``) from its own orbax checkpoints, and, as adapter_gemma_jax finds by
reading the installed files, ships no reader of a Hugging Face folder: a training step on these weights would need
a converter written here, which would not be its users' route. So the route's row is the library's own reason,
read as the forward adapter reads it (the model types its module claims, and whether any file reads safetensors
or transformers). Written as adapter_train_transformers writes a step (its ``main``).
"""

import sys

import adapter_protocol as protocol
from adapter_gemma_jax import run_variant as loaded
from adapter_train_transformers import main

ROUTES = {"default": "gemma.gm's training on the folder's weights through the library's own reader of a Hugging "
                     "Face folder, if it ships one (it is looked for)"}
PACKAGES = ("gemma", "jax", "flax")


def run_variant(run: protocol.Run, variant: str) -> dict:
    loaded(run, variant)  # raises with the library's own reason: no such architecture, or no reader of the folder
    raise RuntimeError("gemma read a Hugging Face folder: the training step is not wired here yet")


if __name__ == "__main__":
    sys.exit(main(routes=ROUTES, run_variant=run_variant, packages=PACKAGES))
