"""The arms: one model object per arm, built once and loaded with each run's state, so that a compiled
arm compiles once per shape and is reused across seeds and depths.

Each arm names the real stack its final-logit cap runs on, so its first zero-gradient input comes
from the stack table (softcapgrad.stacks), never from a typed constant.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from softcapgrad.experiments.design import Design
from softcapgrad.stacks.watch import first_zero


@dataclass(frozen=True)
class ArmSpec:
    name: str
    autocast: bool  # bf16 autocast on fp32 master weights
    patch: bool  # softcapgrad.patch(model)
    compiled: bool  # torch.compile(model)
    caps: bool  # the model keeps its caps in phase 2
    path: str | None  # the real stack of its final-logit cap
    scores: str  # the format the cap's input is in
    control: bool = False  # the patch's backward, exactly 0 wherever eager's is (softcapgrad.experiments.control)


SPECS = {
    "bf16-eager": ArmSpec("bf16-eager", True, False, False, True, "torch-eager-cpu", "bfloat16"),
    "bf16-patch": ArmSpec("bf16-patch", True, True, False, True, "torch-eager-cpu-remedy", "bfloat16"),
    "bf16-patch-deadzone": ArmSpec("bf16-patch-deadzone", True, False, False, True, "torch-eager-cpu", "bfloat16",
                                   control=True),
    "bf16-compile": ArmSpec("bf16-compile", True, False, True, True, "torch-compile-cpu", "bfloat16"),
    "fp32-eager": ArmSpec("fp32-eager", False, False, False, True, "torch-eager-cpu", "float32"),
    "no-cap": ArmSpec("no-cap", True, False, False, False, None, "bfloat16"),
}


def arm_first_zero(spec: ArmSpec, c: float) -> tuple[float | None, str]:
    """The arm's first zero-gradient input at cap c, and where the figure comes from."""
    if spec.path is None:
        return None, "no cap"
    found = first_zero(spec.path, spec.scores, c)
    return found.value, f"{spec.path}, {spec.scores} scores: {found.source}"


def horizon(design: Design) -> float:
    """The bf16 first zero-gradient input at the final cap: the unit of depth."""
    value, why = arm_first_zero(SPECS["bf16-eager"], design.final_cap)
    if value is None:
        raise RuntimeError(f"the stack table has no bf16 first zero at c = {design.final_cap:g}: {why}")
    return value


def config(design: Design, caps: bool = True):
    from transformers import Gemma2Config

    return Gemma2Config(
        vocab_size=design.task.vocab, hidden_size=design.hidden, intermediate_size=design.intermediate,
        num_hidden_layers=design.layers, num_attention_heads=design.heads, num_key_value_heads=design.kv_heads,
        head_dim=design.head_dim, query_pre_attn_scalar=design.head_dim, max_position_embeddings=design.task.seq,
        sliding_window=design.task.seq, final_logit_softcapping=design.final_cap if caps else None,
        attn_logit_softcapping=design.attn_cap if caps else None, tie_word_embeddings=False,
        attn_implementation="eager",
    )


def fresh_model(design: Design, seed: int, caps: bool = True, base: Any = None):
    """Gemma2ForCausalLM in fp32 from the seed's initialisation (``base``: a config to take instead)."""
    import torch
    from transformers import AutoModelForCausalLM, Gemma2ForCausalLM

    torch.manual_seed(seed)
    if base is not None:
        return AutoModelForCausalLM.from_config(base, attn_implementation="eager").float()
    return Gemma2ForCausalLM(config(design, caps)).float()


@dataclass
class Arm:
    spec: ArmSpec
    model: Any  # the module whose parameters the optimizer steps
    forward: Callable  # the model, or its compile


def build(spec: ArmSpec, design: Design, base: Any = None) -> Arm:
    import copy

    import torch

    from softcapgrad.training.fp32grad import patch

    cfg = copy.deepcopy(base) if base is not None else config(design)
    if not spec.caps:
        cfg.final_logit_softcapping = None
        cfg.attn_logit_softcapping = None
    model = fresh_model(design, 0, base=cfg)
    if spec.patch:
        patch(model)
    if spec.control:
        from softcapgrad.experiments.control import patch_deadzone

        patch_deadzone(model)
    forward = torch.compile(model) if spec.compiled else model
    return Arm(spec, model, forward)


def nonfinite(state: dict) -> list[str]:
    """The names of a state's floating tensors that hold a NaN or an infinity."""
    import torch

    return [k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
