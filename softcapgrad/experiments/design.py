"""The experiment's fixed design: one frozen dataclass, written out before any result is looked at.

``DESIGN`` is the default run; ``QUICK`` the same design with fewer seeds and steps. Every number
that shapes the measurement lives here, so the design text in results/experiment.md is this object
printed, and a change to it is a change of design, visible in the history.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from softcapgrad.core.names import EXPERIMENT_ARMS as ARMS, EXPERIMENT_BUDGET_STEPS, EXPERIMENT_STEP_SECONDS
from softcapgrad.experiments.task import Task

TINY = "transformers Gemma2ForCausalLM (tiny, random init)"  # what the default run trains
CORE = ("bf16-eager", "bf16-patch", "bf16-patch-deadzone")  # the three the paired ratios compare
SHIFTS = ("rotation", "band")
# The previous default run's steps-to-recover at 4× (8 seeds, bf16-eager then bf16-patch, per seed): the per-seed
# spread the seed count is chosen from (design_seeds). An input of the design, not a result of this one.
PREVIOUS_4X = ((67, 77, 64, 65, 67, 70, 60, 60), (67, 74, 62, 65, 66, 70, 60, 60))
ARM_TEXT = {
    "bf16-eager": "bf16 autocast, transformers' own eager code: the cap's backward 1 − y² from the stored bf16 output",
    "bf16-patch-deadzone": "the control: bf16 autocast, the patch's fp32 sech² from the input, set to exactly 0 "
                           "wherever eager's stored bf16 output is ±1 (the dead zone without eager's rounding)",
    "bf16-patch": "bf16 autocast with softcapgrad.patch(model): the same forward, the tanh derivative from the input "
                  "in fp32",
    "bf16-compile": "bf16 autocast, torch.compile(model) (inductor): its backward recomputes tanh in fp32",
    "fp32-eager": "fp32 throughout, eager",
    "no-cap": "bf16 autocast, eager, both caps removed at the shift (final_logit_softcapping and "
              "attn_logit_softcapping None): the control",
}


@dataclass(frozen=True)
class Design:
    task: Task = Task(vocab=256, seq=32, batch=16, shift_fraction=0.25)
    # the model: transformers' Gemma2ForCausalLM, tiny, with Gemma 2's caps; untied output layer
    layers: int = 2
    hidden: int = 64
    heads: int = 2
    kv_heads: int = 1
    head_dim: int = 32
    intermediate: int = 128
    final_cap: float = 30.0
    attn_cap: float = 50.0
    # phase 1: learn the task in fp32 with the caps, then set the confidence
    phase1_steps: int = 150
    phase1_lr: float = 1e-2
    depths: tuple[float, ...] = (0.5, 1.1, 1.25, 1.5, 2.0, 4.0)  # largest pre-cap final logit at the shift, × the bf16 first zero
    depth_margin: float = 1.01  # the target sits 1% above depth × first zero, so bf16 rounding cannot undercut it
    # phase 2: the label shift, per arm
    phase2_steps: int = 200  # most steps; a run not recovered by then is censored at this count
    lr: float = 3e-3
    weight_decay: float = 0.01
    recover_probability: float = 0.5  # mean probability of the new target on the shifted contexts, at least
    recover_loss: float = 1.0  # mean loss (nats) on the shifted contexts, at most
    seeds: tuple[int, ...] = tuple(range(24))
    arms: tuple[str, ...] = tuple(a for a in ARMS if a != "bf16-compile")  # --arm bf16-compile adds it
    side_depths: tuple[float, ...] = (0.5, 4.0)  # the arms outside CORE run at these depths, rotation shift only
    shifts: tuple[str, ...] = SHIFTS
    band_depths: tuple[float, ...] = (2.0, 4.0)  # the band shift runs at these depths only
    band: tuple[float, float] = (-150.0, -110.0)  # band shift: new targets among tokens whose logit lies here
    band_aim: float = -130.0  # the one closest to this, per shifted context
    effect: float = 0.01  # the smallest cost the seed count is chosen to resolve
    # natural confidence: phase 1's setting, bf16 eager, long and hot, no weight decay
    natural_steps: int = 2000
    natural_lr: float = 3e-2
    natural_every: int = 250
    # one SGD setting (plain SGD, no momentum), its learning rate chosen by a pilot on seeds never reported
    sgd_lrs: tuple[float, ...] = (0.5, 2.0, 8.0)
    sgd_pilot_seeds: tuple[int, ...] = (1000, 1001)
    sgd_seeds: tuple[int, ...] = tuple(range(8))
    sgd_depths: tuple[float, ...] = (0.5, 4.0)
    sgd_steps: int = 150
    # the monitor: step 0 (the shift) watched alone, then every ``monitor_every``-th step, one row per window
    monitor_every: int = 25
    window: int = 50
    # the statistics
    bootstrap: int = 2000
    confidence: float = 0.95
    bootstrap_seed: int = 0
    threads: int = 1
    quick: bool = False

    def with_(self, **changes) -> "Design":
        return replace(self, **changes)


DESIGN = Design()
QUICK = Design(phase1_steps=100, phase2_steps=100, seeds=(0, 1), monitor_every=20, window=30, bootstrap=500,
               quick=True, depths=(0.5, 1.25, 4.0), arms=tuple(a for a in ARMS if a != "bf16-compile"),
               natural_steps=200, natural_every=100, sgd_lrs=(2.0,), sgd_pilot_seeds=(1000,), sgd_seeds=(0,),
               sgd_steps=60)


def arms_at(design: Design, depth: float, shift: str) -> list[str]:
    if shift == "band" and depth not in design.band_depths:
        return []
    return [a for a in design.arms if a in CORE or (shift == "rotation" and depth in design.side_depths)]


def total_steps(design: Design) -> int:
    """Training steps of the AdamW runs (phase 1 per seed, phase 2 per seed, depth, shift and arm), at most."""
    runs = sum(len(arms_at(design, d, s)) for d in design.depths for s in design.shifts)
    return len(design.seeds) * (design.phase1_steps + runs * design.phase2_steps)


STEP_SECONDS, BUDGET_STEPS = EXPERIMENT_STEP_SECONDS, EXPERIMENT_BUDGET_STEPS  # where they come from: core/names


def all_steps(design: Design) -> int:
    """Every training step the design may take: the AdamW runs, the SGD pilot and setting, the natural run."""
    sgd = 0
    if set(CORE) <= set(design.arms) and design.sgd_lrs and design.sgd_seeds:
        pilot = len(design.sgd_pilot_seeds) * (design.phase1_steps + len(design.sgd_lrs) * len(CORE) * design.sgd_steps)
        sgd = pilot + len(design.sgd_seeds) * len(design.sgd_depths) * len(CORE) * design.sgd_steps
    return total_steps(design) + sgd + design.natural_steps


def within_budget(design: Design, what: str) -> tuple[int, float]:
    """(training steps at most, estimated seconds) of ``design``; one line past BUDGET_STEPS, before any work.
    ``what``: the options that set its size, for the message."""
    from softcapgrad.core.checks import InputError

    steps = all_steps(design)
    if steps > BUDGET_STEPS:
        raise InputError(f"{what}: {steps:,} training steps, about {steps * STEP_SECONDS / 3600:,.0f} h here; the "
                         f"budget is {BUDGET_STEPS:,} steps (about {BUDGET_STEPS * STEP_SECONDS / 3600:.0f} h at "
                         f"{STEP_SECONDS * 1000:g} ms a step)")
    return steps, steps * STEP_SECONDS


def design_seeds(effect: float, z: float = 1.96 + 0.84) -> tuple[float, int]:
    """(sd of the per-seed log ratio in PREVIOUS_4X, seeds needed): n = (z·sd / log(1 + effect))², z for a two-sided
    5 % test with 80 % power, so a cost of ``effect`` lies outside an interval around 1 four times in five."""
    import math

    import numpy as np

    logs = np.log(np.asarray(PREVIOUS_4X[0], dtype=float) / np.asarray(PREVIOUS_4X[1], dtype=float))
    sd = float(np.std(logs, ddof=1))
    return sd, math.ceil((z * sd / math.log1p(effect)) ** 2)


def lines(d: Design) -> list[str]:
    """The design as Markdown bullet lines, in words and numbers."""
    t = d.task
    sd, need = design_seeds(d.effect)
    return [
        f"- Model: transformers' `Gemma2ForCausalLM`, {d.layers} layers, hidden {d.hidden}, {d.heads} heads "
        f"({d.kv_heads} key-value head), head dim {d.head_dim}, MLP {d.intermediate}, vocabulary {t.vocab}, eager "
        f"attention, untied output layer, `final_logit_softcapping = {d.final_cap:g}`, "
        f"`attn_logit_softcapping = {d.attn_cap:g}`. torch threads: {d.threads}.",
        f"- Task: a deterministic bigram language: each token has one successor (a permutation drawn from the seed); "
        f"batches of {t.batch} × {t.seq} uniform random tokens, targets at the same positions. Batches depend on "
        "(seed, phase, step) only: every arm of a seed sees the same data in the same order.",
        f"- Phase 1 (once per seed, shared by every arm): {d.phase1_steps} AdamW steps at lr {d.phase1_lr:g} in fp32 "
        "with both caps, from the seed's initialisation.",
        "- Confidence (per depth): the output layer's weights are multiplied by one number s, chosen so that the "
        f"largest pre-cap final logit over every token as context equals depth × (the bf16 first zero-gradient input "
        f"at c = {d.final_cap:g}, from the stack table) × {d.depth_margin:g}. Depths: "
        f"{', '.join(f'{x:g}×' for x in d.depths)}. s is printed per seed and depth.",
        f"- Phase 2 (the shift, per arm): {t.shift_fraction:.0%} of the tokens get a new successor (the old successors "
        f"of the shifted set rotated by one inside it). A fresh AdamW (lr {d.lr:g}, weight decay "
        f"{d.weight_decay:g}) on fp32 master weights, at most {d.phase2_steps} steps.",
        f"- Recovered: the first step whose batch, before its update, has a mean new-target probability ≥ "
        f"{d.recover_probability:g} and a mean loss ≤ {d.recover_loss:g} nats on the shifted contexts; "
        f"steps-to-recover is the number of updates made before it. A run not recovered after {d.phase2_steps} "
        "steps is censored there (shown as ≥).",
        "- Arms (same seed, same state at the shift, same data): " + "; ".join(f"{a}: {ARM_TEXT[a]}" for a in d.arms) + ".",
        f"- Seeds: {', '.join(str(s) for s in d.seeds)} ({len(d.seeds)}). Chosen from the previous default run's "
        f"per-seed spread at 4× (8 seeds): the per-seed log ratio eager ÷ patched has sd {sd:.4f}, so resolving a "
        f"{d.effect:.0%} cost (two-sided 5 %, power 80 %) needs n ≥ (2.80 · sd / log 1.01)² = {need} seeds.",
        f"- Shifts: 'rotation' as before; 'band': each shifted context's new target is the token whose pre-cap logit "
        f"(after the depth's scaling, that context alone) lies in [{d.band[0]:g}, {d.band[1]:g}] closest to "
        f"{d.band_aim:g} (just past eager's negative horizon, where the exact slope is 4e-3 to 1e-4 and eager's is "
        "0); a context with no such token keeps the rotation's target (the share is reported).",
        f"- Arms {', '.join(CORE)} run at every depth with the rotation and at depths "
        f"{', '.join(f'{x:g}×' for x in d.band_depths)} with the band shift (below 2× the most negative logit does not "
        "reach the band: the quick look found a token in it for 0 of 64 shifted contexts at 0.5× and 1.25×); the "
        f"other arms at depths {', '.join(f'{x:g}×' for x in d.side_depths)}, rotation only. bf16-compile is not in "
        "the default run (its cold compile is a large share of the budget on a loaded 2-core machine): "
        "`--arm bf16-compile` adds it.",
        f"- Natural confidence: seed {d.seeds[0]}'s phase 1 again in bf16 eager, {d.natural_steps} AdamW steps at lr "
        f"{d.natural_lr:g}, no weight decay; every {d.natural_every} steps the largest pre-cap final logit over every "
        "token as context and its share past the bf16 horizon.",
        f"- SGD: plain SGD (no momentum, no weight decay) at one learning rate from {', '.join(map(str, d.sgd_lrs))}, "
        f"chosen by a pilot on seeds {', '.join(map(str, d.sgd_pilot_seeds))} (never reported): the largest at which, "
        "at depth 0.5× (no final logit dead), every core arm recovers within the budget, control and patched take "
        "the same steps and eager ÷ patched lies in [0.8, 1.25] per seed. Then the core arms at depths "
        f"{', '.join(f'{x:g}×' for x in d.sgd_depths)}, rotation, seeds {', '.join(map(str, d.sgd_seeds))}, at most "
        f"{d.sgd_steps} steps; called chaotic when eager ÷ control at 0.5× (rounding alone) has an interval outside "
        "[0.95, 1.05].",
        f"- Monitor: softcapgrad.DeadZoneMonitor watches step 0 of phase 2 (the shift) alone, then one step in "
        f"{d.monitor_every}, one row per window of {d.window} steps, per site (final logits c = {d.final_cap:g}, "
        f"attention c = {d.attn_cap:g}): the fraction of capped values past the path's first zero-gradient input and "
        "the fraction whose gradient was exactly 0. At the shift the final logits' exact-zero gradients are also "
        "counted by autograd hooks on the cap's input and output (eager arms).",
        f"- Statistics, per depth and shift, paired by seed: eager ÷ patched (the total), control ÷ patched (the dead "
        f"zone alone), eager ÷ control (rounding alone): the per-seed step ratios, their geometric mean with a "
        f"{d.confidence:.0%} paired percentile bootstrap interval ({d.bootstrap} resamples of the seeds, numpy "
        f"generator seeded {d.bootstrap_seed}), the seeds slower / tied / faster, and scipy's Wilcoxon signed-rank "
        "test (ties dropped). Censored runs count at the budget. Verdict from the interval: 'costs x % (low–high)' "
        "when it lies above 1, 'faster by x %' when below, otherwise 'no cost larger than y %' (its upper end). "
        "The ratio of medians and its bootstrap interval are kept as a secondary figure.",
        "- Gradient fidelity at the shift (step 0, the same state and batch for every arm) and in every watched "
        "window (final logits, eager-backward arms): the share of the exact gradient's L1 mass at the cap's input "
        "(the upstream gradient × sech²(a/c), fp64) that the arm's backward set to exactly 0; at the shift also the "
        "relative L2 error of the full parameter gradient of eager and of the control against the patch, and the "
        "count of parameter elements whose gradient is exactly 0 there but not under the patch.",
        "- Beside it, the document's single-logit prediction: `dynamics` (one logit, plain gradient descent, bf16) "
        "at a0 = each depth's largest pre-cap logit.",
    ]
