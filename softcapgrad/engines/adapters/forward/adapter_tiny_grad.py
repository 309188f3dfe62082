"""tinygrad: a Gemma path, if its distribution has one. Its own language-model loader (``tinygrad.llm``) reads GGUF
files and dispatches on their ``general.architecture``; the adapter reads the installed distribution's files (it
imports nothing from it) and exits 3 when no file of it mentions Gemma."""

from __future__ import annotations

import sys
from importlib import metadata

import adapter_protocol as protocol

ROUTES = {"default": "tinygrad's own Gemma model code, if its distribution has any (it is looked for)"}


def run_variant(run: protocol.Run, variant: str):
    kind = run.config(variant).get("model_type", "?")
    files = [f for f in metadata.files("tinygrad") or [] if str(f).endswith((".py", ".md", ".html"))]
    hits = sorted(str(f) for f in files if "gemma" in f.locate().read_text(encoding="utf-8", errors="replace").lower())
    if not hits:
        raise protocol.NoArchitecture(f"tinygrad {metadata.version('tinygrad')}: none of its {len(files)} source "
                                      f"files mentions gemma, so it has no {kind}")
    raise RuntimeError(f"tinygrad mentions gemma in {', '.join(hits)}: not yet wired here")


if __name__ == "__main__":
    sys.exit(protocol.main(ROUTES, run_variant))
