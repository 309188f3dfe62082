"""Google DeepMind's ``gemma`` (JAX): its own Gemma transformers, ``gemma.gm.nn`` (Gemma2_2B, Gemma3_1B, ...).

The library loads weights from its own orbax checkpoints (``gemma.gm.ckpts.load_params``) and ships no converter
from a Hugging Face folder, so its users cannot point it at one; a converter written here would not be their route.
The adapter reads the installed distribution's files (it imports nothing from it) for the two facts a row needs:
which model types its module of transformers claims, and whether any file reads safetensors or transformers."""

from __future__ import annotations

import re
import sys
from importlib import metadata

import adapter_protocol as protocol

ROUTES = {"default": "the library's own route from a Hugging Face folder, if it ships one (it is looked for)"}
CLASSES = {"gemma2": "Gemma2_", "gemma3_text": "Gemma3_", "gemma3n_text": "Gemma3n_"}  # gemma.gm.nn class prefixes
CONVERTER = re.compile(r"safetensors|huggingface|from transformers|import transformers", re.IGNORECASE)


def sources() -> dict[str, str]:
    files = metadata.files("gemma") or []
    return {str(f): f.locate().read_text(encoding="utf-8", errors="replace") for f in files if str(f).endswith(".py")}


def run_variant(run: protocol.Run, variant: str):
    kind = run.config(variant).get("model_type", "?")
    texts = sources()
    classes = sorted(set(re.findall(r"^class (Gemma[0-9A-Za-z_]+)\(", "\n".join(
        t for p, t in texts.items() if p.startswith("gemma/gm/nn/")), flags=re.MULTILINE)))
    prefix = CLASSES.get(kind)
    if prefix is None or not any(c.startswith(prefix) for c in classes):
        raise protocol.NoArchitecture(f"gemma.gm.nn has no transformer for {kind}; it holds {', '.join(classes)}")
    readers = sorted(p for p, t in texts.items() if CONVERTER.search(t))
    if readers:
        raise RuntimeError(f"files that may read Hugging Face weights, not yet wired here: {', '.join(readers)}")
    raise RuntimeError(f"gemma {metadata.version('gemma')} ships no converter from Hugging Face weights: none of its "
                       f"{len(texts)} Python files mentions safetensors or transformers; its checkpoints load "
                       "from orbax (gemma.gm.ckpts.load_params)")


if __name__ == "__main__":
    sys.exit(protocol.main(ROUTES, run_variant))
