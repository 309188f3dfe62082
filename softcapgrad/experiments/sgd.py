"""The SGD setting: a learning rate chosen by a pilot on seeds never reported, then the core arms at it.

The pilot runs the core arms at depth 0.5× (no final logit past the bf16 horizon, so the control's
backward is the patch's wherever a value is live) for each learning rate of the design, and keeps the
largest at which every arm recovers within the budget, control and patched take the same steps, and
eager ÷ patched lies in [0.8, 1.25] per seed (rounding alone must not move the count much).
"""

from __future__ import annotations

from softcapgrad.experiments import arms as armset, task as tasks
from softcapgrad.experiments.design import Design
from softcapgrad.experiments.loop import ArmRun, confident, phase1, run_arm

PILOT_DEPTH = 0.5
STABLE = (0.8, 1.25)


def _state(design: Design, seed: int, base, initial):
    m = tasks.mapping(design.task, seed)
    learner = armset.fresh_model(design, seed, base=base)
    if initial is not None:
        learner.load_state_dict(initial)
    return learner, phase1(learner, design, seed, m), m


def choose(design: Design, core: dict, zeros: dict, horizon: float, base, initial) -> tuple[float, list[dict]]:
    """(the learning rate, per learning rate of the grid: the pilot's steps per arm and seed, and the verdict)."""
    states = [(seed, *_state(design, seed, base, initial)) for seed in design.sgd_pilot_seeds]
    table, chosen = [], None
    for lr in design.sgd_lrs:
        steps: dict[str, list] = {a: [] for a in core}
        for seed, learner, state, m in states:
            scaled, _, _ = confident(learner, state, PILOT_DEPTH * horizon * design.depth_margin, design)
            for name, arm in core.items():
                steps[name].append(run_arm(arm, scaled, design, seed, PILOT_DEPTH, m, zeros[name][0], sgd=lr,
                                           budget=design.sgd_steps).steps)
        e, p, c = steps["bf16-eager"], steps["bf16-patch"], steps["bf16-patch-deadzone"]
        recovered = all(x is not None for x in e + p + c)
        stable = recovered and c == p and all(STABLE[0] <= a / b <= STABLE[1] for a, b in zip(e, p) if b)
        table.append({"lr": lr, "steps": steps, "stable": stable})
        if stable:
            chosen = lr
    if chosen is None:
        chosen = design.sgd_lrs[0]
    return chosen, table


def reported(design: Design, core: dict, zeros: dict, horizon: float, states: dict, lr: float,
             base=None) -> list[ArmRun]:
    """The core arms under SGD at ``lr``, on the reported SGD seeds (phase 1 shared with the AdamW runs)."""
    from dataclasses import replace

    out = []
    for seed in design.sgd_seeds:
        m = tasks.mapping(design.task, seed)
        learner = armset.fresh_model(design, seed, base=base)
        for depth in design.sgd_depths:
            scaled, _, _ = confident(learner, states[seed], depth * horizon * design.depth_margin, design)
            for name, arm in core.items():
                run = run_arm(arm, scaled, design, seed, depth, m, zeros[name][0], sgd=lr, budget=design.sgd_steps)
                out.append(replace(run, grad0=None))
    return out
