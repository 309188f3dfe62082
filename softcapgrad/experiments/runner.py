"""The whole measurement: phase 1 once per seed, the confidence per depth, both shifts, phase 2 per arm; then the
SGD pilot and setting, and the natural-confidence run.

``measure`` returns plain data (no timing in it: the written results regenerate byte for byte);
the command line adds the wall and CPU time to what it prints.
"""

from __future__ import annotations

from dataclasses import dataclass

from softcapgrad.core import progress
from softcapgrad.core.checks import InputError
from softcapgrad.experiments import arms as armset, task as tasks
from softcapgrad.experiments.design import CORE, TINY, Design, arms_at, total_steps
from softcapgrad.experiments.loop import ArmRun, confident, phase1, pre_cap_logits, run_arm
from softcapgrad.experiments.natural import Natural, natural


@dataclass(frozen=True)
class Shift:
    seed: int
    depth: float
    target: float  # the largest pre-cap logit asked for
    scale: float  # s applied to the output layer
    largest: float  # the largest pre-cap logit after scaling (fp32, every token as context)
    band_found: int = 0  # shifted contexts the band shift found a token in the band for
    shifted: int = 0  # shifted contexts


@dataclass(frozen=True)
class Fidelity:
    seed: int
    depth: float
    shift: str
    arm: str  # compared with bf16-patch at step 0 (same state, same batch)
    relative_error: float  # ‖g_arm − g_patch‖₂ / ‖g_patch‖₂
    zero_not_patch: int  # parameter elements with g_arm exactly 0 and g_patch not


@dataclass(frozen=True)
class Measured:
    design: Design
    horizon: float  # bf16 first zero-gradient input at the final cap (the stack table)
    first_zero: dict[str, tuple[float | None, str]]  # arm -> its own first zero and where it comes from
    shifts: list[Shift]
    runs: list[ArmRun]
    model: str  # what was trained
    fidelity: list[Fidelity]
    sgd_lr: float | None = None  # chosen by the pilot (None: no SGD)
    sgd_pilot: list[dict] | None = None  # per learning rate: the pilot's steps and whether it passed
    sgd_runs: list[ArmRun] | None = None
    natural: Natural | None = None


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


def _fidelity(runs: list[ArmRun], seed: int, depth: float, shift: str) -> list[Fidelity]:
    import torch

    by = {r.arm: r.grad0 for r in runs if r.grad0 is not None}
    patched = by.get("bf16-patch")
    out = []
    if patched is None:
        return out
    norm = float(torch.linalg.vector_norm(patched))
    for arm in ("bf16-eager", "bf16-patch-deadzone"):
        if arm in by:
            g = by[arm]
            err = float(torch.linalg.vector_norm(g - patched)) / norm if norm else 0.0
            out.append(Fidelity(seed, depth, shift, arm, err, int(((g == 0) & (patched != 0)).sum())))
    return out


def _shifted(learner, scaled: dict, design: Design, m: tasks.Mapping, shift: str) -> tuple[tasks.Mapping, int]:
    if shift == "rotation":
        return m, int(m.shifted.sum())
    learner.load_state_dict(scaled)
    return tasks.band_mapping(m, pre_cap_logits(learner, design), design.band, design.band_aim)


def _finite(state: dict, largest: float, what: str) -> None:
    """Refuse, in one line, a state or a largest logit that is not finite: no verdict rests on a NaN."""
    import math

    bad = armset.nonfinite(state)
    if bad or not math.isfinite(largest):
        raise InputError(f"{what}: non-finite values ({', '.join(bad[:3]) or f'largest pre-cap logit {largest}'}"
                         f"{'...' if len(bad) > 3 else ''}): nothing can be measured from them")


def _drop_grads(runs: list[ArmRun]) -> list[ArmRun]:
    from dataclasses import replace

    return [replace(r, grad0=None) for r in runs]


def _measure(design: Design, base, initial, model: str) -> Measured:
    h = armset.horizon(design)
    cap = design.final_cap
    zeros = {a: armset.arm_first_zero(armset.SPECS[a], cap) for a in design.arms}
    built = {a: armset.build(armset.SPECS[a], design, base) for a in design.arms}
    shifts, runs, fidelity, states = [], [], [], {}
    with progress.task("experiment", total_steps(design)) as overall:
        for seed in design.seeds:
            m = tasks.mapping(design.task, seed)
            learner = armset.fresh_model(design, seed, base=base)
            if initial is not None:
                learner.load_state_dict(initial)
            with progress.task(f"phase 1 · seed {seed}", design.phase1_steps) as advance:
                state = phase1(learner, design, seed, m, lambda n=1: (advance(n), overall(n)))
            _finite(state, 0.0, f"seed {seed}: the weights after phase 1")
            if seed in design.sgd_seeds:
                states[seed] = state
            for depth in design.depths:
                target = depth * h * design.depth_margin
                scaled, s, largest = confident(learner, state, target, design)
                _finite(scaled, largest, f"--depth {depth:g}: the output layer scaled by {s:.3g} for a largest "
                                         f"pre-cap logit of {target:.3g}")
                band = 0
                for shift in design.shifts:
                    mapped, found = _shifted(learner, scaled, design, m, shift)
                    band = found if shift == "band" else band
                    group = []
                    for name in arms_at(design, depth, shift):
                        with progress.task(f"{name} · {shift} · {depth:g}× · seed {seed}",
                                           design.phase2_steps) as advance:
                            def both(n=1):
                                advance(n)
                                overall(n)

                            run = run_arm(built[name], scaled, design, seed, depth, mapped, zeros[name][0], both,
                                          shift)
                        if not all(x == x for x in run.shifted_loss + run.other_loss):
                            raise InputError(f"{name} at depth {depth:g}×, seed {seed}: the loss became NaN; no "
                                             "verdict is given from it")
                        overall(design.phase2_steps - len(run.shifted_loss) + (run.steps is not None))
                        group.append(run)
                    fidelity += _fidelity(group, seed, depth, shift)
                    runs += _drop_grads(group)
                shifts.append(Shift(seed, depth, target, s, largest, band, int(m.shifted.sum())))
    core = {a: built[a] for a in CORE if a in built}
    lr = pilot = sgd_runs = None
    if len(core) == len(CORE) and design.sgd_lrs and design.sgd_seeds:
        from softcapgrad.experiments.sgd import choose, reported

        lr, pilot = choose(design, core, zeros, h, base, initial)
        sgd_runs = reported(design, core, zeros, h, states, lr, base)
    return Measured(design, h, zeros, shifts, runs, model or TINY,
                    fidelity, lr, pilot, sgd_runs,
                    natural(design, base, initial) if design.natural_steps else None)
