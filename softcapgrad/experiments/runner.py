"""The whole measurement: phase 1 once per seed, the confidence per depth, phase 2 per arm.

``measure`` returns plain data (no timing in it: the written results regenerate byte for byte);
the command line adds the wall and CPU time to what it prints.
"""

from __future__ import annotations

from dataclasses import dataclass

from softcapgrad.core import progress
from softcapgrad.experiments import arms as armset, task as tasks
from softcapgrad.experiments.design import Design
from softcapgrad.experiments.loop import ArmRun, confident, phase1, run_arm


@dataclass(frozen=True)
class Shift:
    seed: int
    depth: float
    target: float  # the largest pre-cap logit asked for
    scale: float  # s applied to the output layer
    largest: float  # the largest pre-cap logit after scaling (fp32, every token as context)


@dataclass(frozen=True)
class Measured:
    design: Design
    horizon: float  # bf16 first zero-gradient input at the final cap (the stack table)
    first_zero: dict[str, tuple[float | None, str]]  # arm -> its own first zero and where it comes from
    shifts: list[Shift]
    runs: list[ArmRun]
    model: str  # what was trained


def total_steps(design: Design) -> int:
    return len(design.seeds) * (design.phase1_steps + len(design.depths) * len(design.arms) * design.phase2_steps)


def measure(design: Design, base=None, initial: dict | None = None, model: str = "") -> Measured:
    """Run the design. ``base``: a transformers config to build instead of the tiny one, ``initial``: its
    weights (``--model DIR``); phase 1 then starts from them."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(design.threads)
    try:
        return _measure(design, base, initial, model)
    finally:
        torch.set_num_threads(threads)


def _measure(design: Design, base, initial, model: str) -> Measured:
    h = armset.horizon(design)
    cap = design.final_cap
    zeros = {a: armset.arm_first_zero(armset.SPECS[a], cap) for a in design.arms}
    built = {a: armset.build(armset.SPECS[a], design, base) for a in design.arms}
    shifts, runs = [], []
    with progress.task("experiment", total_steps(design)) as overall:
        for seed in design.seeds:
            m = tasks.mapping(design.task, seed)
            learner = armset.fresh_model(design, seed, base=base)
            if initial is not None:
                learner.load_state_dict(initial)
            with progress.task(f"phase 1 · seed {seed}", design.phase1_steps) as advance:
                state = phase1(learner, design, seed, m, lambda n=1: (advance(n), overall(n)))
            for depth in design.depths:
                target = depth * h * design.depth_margin
                scaled, s, largest = confident(learner, state, target, design)
                shifts.append(Shift(seed, depth, target, s, largest))
                for name in design.arms:
                    with progress.task(f"{name} · depth {depth:g}× · seed {seed}", design.phase2_steps) as advance:
                        def both(n=1):
                            advance(n)
                            overall(n)

                        run = run_arm(built[name], scaled, design, seed, depth, m, zeros[name][0], both)
                    overall(design.phase2_steps - len(run.shifted_loss) + (run.steps is not None))
                    runs.append(run)
    return Measured(design, h, zeros, shifts, runs, model or "transformers Gemma2ForCausalLM (tiny, random init)")
