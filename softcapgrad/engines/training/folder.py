"""``train-parity DIR``: the user's saved model, its inputs, and the interpreter ``--python`` gives, each checked
before any route runs.

The folder is read as ``parity DIR`` reads it (models/source.py: config.json, safetensors only, no remote code, no
pickle; a tensor of the wrong shape refused there); here a tensor the model has and the folder lacks is refused too
(transformers would initialise it at random). The weights are kept as saved: nothing scales them so that a cap
binds (parity's tiny models are scaled, engines/forward/reference.py's ``bind``), so each cap's largest |a/c| on the
inputs is measured and reported, and a cap that moves neither the logits nor the gradients beyond a route's
tolerance gets no verdict of applied or ignored (engines/training/verdict.py's ``unbound``).

The inputs: the text ``audit-model --gates`` reads (models/gate_audit.py's TEXT), or the lines of ``--prompts FILE``
joined by newlines, tokenized by the folder's tokenizer.json (the tokenizers library reads it as data); without a
tokenizer.json, token ids drawn from the seed, and the answer says so.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from softcapgrad.core.checks import InputError

MAX_TOKENS = 512  # parity's longest input (engines/forward/reference.py's MAX_TOKENS)
STAND_IN = 16  # token ids drawn where the folder has no tokenizer.json (train-parity's --seq-len default)


def inputs(directory: Path, config, lines: list[str] | None, seq_len: int | None, seed: int) -> tuple:
    """The token ids one training step reads (int64 [tokens]) and a sentence saying where they came from."""
    from softcapgrad.models.gate_audit import TEXT
    from softcapgrad.models.inputs import random_ids, text_tokens, vocabulary

    path = Path(directory) / "tokenizer.json"
    if not path.is_file():
        if lines is not None:
            raise InputError(f"--prompts: {directory} has no tokenizer.json, so its prompts cannot be tokenized")
        n = seq_len or STAND_IN
        ids = random_ids(config, 1, n, seed).numpy().reshape(-1)
        return ids, (f"{n} token ids drawn from seed {seed} below {text_tokens(config)} (no tokenizer.json in the "
                     "folder: a stand-in for text, not what the model reads)")
    from tokenizers import Tokenizer

    text = TEXT if lines is None else "\n".join(lines)
    try:
        ids = np.asarray(Tokenizer.from_file(str(path)).encode(text).ids, dtype=np.int64)
    except Exception as err:  # noqa: BLE001 -- the tokenizers library raises its own exception type
        raise InputError(f"{path}: cannot load the tokenizer: {str(err).splitlines()[0]}") from None
    what = "the shipped text" if lines is None else f"{len(lines)} prompt{'s' * (len(lines) > 1)} joined by newlines"
    if ids.size < 2:
        raise InputError(f"{path}: {what} tokenizes to {ids.size} token(s); one training step needs at least 2")
    vocab = vocabulary(config)
    if int(ids.max()) >= vocab:
        raise InputError(f"{path}: gives token id {int(ids.max())}, beyond the model's vocabulary of {vocab}: "
                         "the tokenizer is not this model's")
    keep = min(ids.size, seq_len or MAX_TOKENS)
    cut = f", the first {keep} kept" if keep < ids.size else ""
    return ids[:keep], f"{what}, tokenized by the folder's tokenizer.json ({ids.size} tokens{cut})"


def load(src):
    """The folder's model in fp32 with eager attention, its weights exactly as saved (a bf16 or fp16 file widened
    without rounding, nothing scaled); one line where the folder holds no weights or lacks a tensor of the model."""
    import torch

    from softcapgrad.models import runnable
    from softcapgrad.models.source import quiet

    if not src.weights:
        raise InputError(f"{src.directory}: no safetensors weights there; train-parity trains a saved model's weights "
                         "(for parity's tiny models give --model-type)")
    with quiet():
        model, loading = runnable.model_class(src.config).from_pretrained(
            str(src.directory), config=src.config, attn_implementation="eager", dtype=torch.float32,
            local_files_only=True, trust_remote_code=False, output_loading_info=True)
    missing = sorted(loading.get("missing_keys") or ())
    if missing:
        raise InputError(f"{src.directory}: the weights lack {len(missing)} tensor(s) of the model (such as "
                         f"{missing[0]}); they would be initialised at random")
    return model.eval()


def reach(model, ids: np.ndarray) -> tuple[dict, dict]:
    """Each cap's largest |a/c| on ``ids`` (None: not set, or never computed) and whether transformers applies it."""
    from softcapgrad.engines.forward import reference as ref

    seen: dict = {}
    ref.logits(model, ids, seen=seen)
    layers = [v for k, v in seen.items() if isinstance(k, int)]
    caps = ref.caps_of(model.config)
    found = {"attention": max(layers) if layers and caps["attention"] is not None else None,
             "final": seen.get("final")}
    return found, {"attention": bool(seen.get("attention applied")), "final": caps["final"] is not None}


def has_type(engines: list[str], model_type: str) -> None:
    """One line where no engine asked for has the folder's model type (measured: results/train-parity.json)."""
    from softcapgrad.engines.training.routes import ABSENT

    if engines and all(model_type in ABSENT.get(e, ()) for e in engines):
        raise InputError(f"the folder is {model_type}, which {', '.join(engines)} "
                         f"{'has' if len(engines) == 1 else 'have'} no model for (no such architecture): "
                         "nothing to run")


def given_python(python: Path, engines: list[str], explicit: bool, install: bool) -> tuple:
    """--python PATH: the one engine's routes run by that interpreter once the probe finds the engine's libraries
    there; (the probe's facts, the states to measure with)."""
    from softcapgrad.engines.forward import interpreter
    from softcapgrad.engines.training.routes import ADAPTER, ADAPTERS, ENGINES, NEEDS

    if not explicit or len(engines) != 1:
        raise InputError("--python runs one engine's routes: give exactly one --engine NAME with it")
    if install:
        raise InputError("--install does not go with --python: the interpreter given is used as it is")
    engine = engines[0]
    facts = interpreter.probe(python, ADAPTERS.get(engine, ADAPTER), engine)
    have = {_normal(name) for name in facts["packages"]}
    lacking = [name for name in NEEDS.get(engine, ()) if _normal(name) not in have]
    if lacking:
        raise InputError(f"--python {facts['path']}: engine {engine} cannot run there (no {', '.join(lacking)} "
                         f"installed in Python {facts['version'].split()[0]})")
    return facts, {ENGINES[engine]: interpreter.state(facts, ENGINES[engine])}


def _normal(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def note_interpreter(results: list, facts: dict | None) -> None:
    """Each route run by the --python interpreter names it and its sys.version."""
    for p in results if facts else ():
        for e in p.routes:
            e.update(interpreter=facts["path"], python=facts["version"], environment=f"--python {facts['path']}")


def prepare(model, ids: np.ndarray, work: Path):
    """The references of the folder's own model (not scaled), each cap's reach on ``ids`` with them; the folder
    ``capped`` and ids.npy under ``work`` for the routes, as engines/training/reference.py's ``prepare`` writes them."""
    import dataclasses

    from softcapgrad.engines.forward import runner
    from softcapgrad.engines.training import reference as tr

    found, applied = reach(model, ids)
    runner.write_ids(work, ids)
    tr.save_folder(model, work / "capped")
    return dataclasses.replace(tr.train_reference(model, ids, {}, applied), reach=found), model
