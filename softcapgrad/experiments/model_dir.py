"""``experiment --model DIR``: the same shift measurement on a saved transformers model with caps.

Read with trust_remote_code=False and safetensors weights only (nothing pickled is ever opened),
refused in one line, before anything is built, when the directory cannot be used or the training
would not fit in memory: one model per arm in fp32 with its gradients and AdamW's two moments, and
three copies of the weights (phase 1, the scaled state, the loaded one).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from softcapgrad.core.checks import InputError
from softcapgrad.experiments.design import Design
from softcapgrad.experiments.task import Task

PER_ARM = 4 * 4  # fp32 bytes per parameter: weights, gradients, AdamW's two moments
COPIES = 3 * 4  # the loaded, phase-1 and scaled states


def needed_bytes(parameters: int, arms: int) -> int:
    return parameters * (PER_ARM * arms + COPIES)


def load(directory: Path, design: Design) -> tuple[Design, object, dict, str]:
    """(the design with the model's caps and vocabulary, its untied config, its fp32 weights, a name)."""
    from softcapgrad.models.source import directory_config
    from softcapgrad.models.tiny import available_bytes, parameters_estimate

    directory = Path(directory)
    if not directory.is_dir():
        raise InputError(f"--model {directory}: not a directory")
    if not any((directory / n).is_file() for n in ("model.safetensors", "model.safetensors.index.json")):
        raise InputError(f"--model {directory}: no model.safetensors there; only safetensors weights are read "
                         "(pickled .bin files are never opened)")
    config, _ = directory_config(directory, {})  # config.json as data: an unknown type refused, an auto_map dropped
    text = getattr(config, "get_text_config", lambda: config)()
    final = getattr(text, "final_logit_softcapping", None)
    if not final:
        raise InputError(f"--model {directory}: {type(config).__name__} has no final_logit_softcapping: "
                         "nothing for the dead zone to act on")
    params = parameters_estimate(config)
    need, have = needed_bytes(params, len(design.arms)), available_bytes()
    if need > have:
        raise InputError(f"--model {directory}: about {params:.3g} parameters, {need / 2**30:.3g} GiB to train "
                         f"{len(design.arms)} arms with AdamW in fp32 and {have / 2**30:.3g} GiB available: "
                         "it cannot run here")
    import torch
    from transformers import AutoModelForCausalLM

    try:
        # the config already read (integers where the class wants floats made floats), not config.json again
        model = AutoModelForCausalLM.from_pretrained(directory, config=config, trust_remote_code=False,
                                                     use_safetensors=True, local_files_only=True, dtype=torch.float32,
                                                     attn_implementation="eager")
    except (ValueError, OSError, KeyError) as err:
        raise InputError(f"--model {directory}: {str(err).splitlines()[0][:300]}") from None
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    from softcapgrad.experiments.arms import nonfinite

    bad = nonfinite(state)
    if bad:
        raise InputError(f"--model {directory}: {len(bad)} weight tensor{'s' if len(bad) != 1 else ''} hold NaN or "
                         f"infinite values ({', '.join(bad[:3])}{'...' if len(bad) > 3 else ''}): nothing can be "
                         "trained from them")
    if "lm_head.weight" not in state:
        raise InputError(f"--model {directory}: {type(model).__name__} has no lm_head: not a causal language model")
    untied = model.config
    untied.tie_word_embeddings = False
    if hasattr(untied, "get_text_config"):
        untied.get_text_config().tie_word_embeddings = False
    attn = getattr(text, "attn_logit_softcapping", None) or design.attn_cap
    vocab = min(design.task.vocab, int(text.vocab_size))
    seq = min(design.task.seq, int(getattr(text, "max_position_embeddings", design.task.seq)))
    task = Task(vocab, seq, design.task.batch, design.task.shift_fraction)
    return replace(design, task=task, final_cap=float(final), attn_cap=float(attn)), untied, state, \
        f"{type(model).__name__} from {directory.name} ({params:.3g} parameters, estimated)"
