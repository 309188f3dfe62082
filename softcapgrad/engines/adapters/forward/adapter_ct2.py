"""CTranslate2: the model converted by its own ``TransformersConverter`` (what ``ct2-transformers-converter``
runs), scored by ``Generator.forward_batch`` on the CPU, at the default compute type and in float32."""

from __future__ import annotations

import json

import numpy as np

from adapter_protocol import NoArchitecture, Run, main

ROUTES = {
    "default": "TransformersConverter, then Generator(compute_type='default'): the converter's and runtime's defaults",
    "fp32": "the same conversion run with compute_type='float32'",
}
# routes that may run one after another in one process (catalog.processes): nothing one sets outlives it
PROCESSES = (("default", "fp32"),)
MODELS_PER_PROCESS = 7  # models one child runs in turn (catalog.models_per_process)
PACKAGES = ("ctranslate2", "transformers", "torch")


def claimed(run: Run, variant: str) -> None:
    from ctranslate2.converters import transformers as converter
    from transformers import AutoConfig

    name = type(AutoConfig.from_pretrained(run.folder(variant))).__name__
    if name not in converter._MODEL_LOADERS:
        raise NoArchitecture(f"{name} is not in CTranslate2's converter loader registry (_MODEL_LOADERS)")


def tokens(folder, ids: np.ndarray) -> list[str]:
    """The converted model's own vocabulary names the input: token id i is its i-th entry."""
    vocabulary = json.loads((folder / "vocabulary.json").read_text(encoding="utf-8"))
    return [vocabulary[int(i)] for i in ids]


def run_variant(run: Run, variant: str) -> np.ndarray:
    import ctranslate2
    from ctranslate2.converters import TransformersConverter

    claimed(run, variant)
    out = run.scratch(variant)
    TransformersConverter(str(run.folder(variant))).convert(str(out), force=True)
    compute = "default" if run.route == "default" else "float32"
    generator = ctranslate2.Generator(str(out), device="cpu", compute_type=compute, intra_threads=1)
    logits = np.asarray(generator.forward_batch([tokens(out, run.ids)]))[0]
    run.did = (f"ct2 TransformersConverter, Generator.forward_batch on cpu, compute_type={compute}, "
               "the engine's own attention and cache")
    run.precision = "fp32"
    run.packages = PACKAGES
    return logits


if __name__ == "__main__":
    raise SystemExit(main(ROUTES, run_variant))
