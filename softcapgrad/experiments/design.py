"""The experiment's fixed design: one frozen dataclass, written out before any result is looked at.

``DESIGN`` is the default run; ``QUICK`` the same design with fewer seeds and steps. Every number
that shapes the measurement lives here, so the design text in results/experiment.md is this object
printed, and a change to it is a change of design, visible in the history.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from softcapgrad.experiments.task import Task

ARMS = ("bf16-eager", "bf16-patch", "bf16-compile", "fp32-eager", "no-cap")
ARM_TEXT = {
    "bf16-eager": "bf16 autocast, transformers' own eager code: the cap's backward 1 − y² from the stored bf16 output",
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
    depths: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0)  # largest pre-cap final logit at the shift, × the bf16 first zero
    depth_margin: float = 1.01  # the target sits 1% above depth × first zero, so bf16 rounding cannot undercut it
    # phase 2: the label shift, per arm
    phase2_steps: int = 200  # most steps; a run not recovered by then is censored at this count
    lr: float = 3e-3
    weight_decay: float = 0.01
    recover_probability: float = 0.5  # mean probability of the new target on the shifted contexts, at least
    recover_loss: float = 1.0  # mean loss (nats) on the shifted contexts, at most
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4, 5, 6, 7)
    arms: tuple[str, ...] = ARMS
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
               quick=True)


def lines(d: Design) -> list[str]:
    """The design as Markdown bullet lines, in words and numbers."""
    t = d.task
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
        f"- Seeds: {', '.join(str(s) for s in d.seeds)}.",
        f"- Monitor: softcapgrad.DeadZoneMonitor watches step 0 of phase 2 (the shift) alone, then one step in "
        f"{d.monitor_every}, one row per window of {d.window} steps, per site (final logits c = {d.final_cap:g}, "
        f"attention c = {d.attn_cap:g}): the fraction of capped values past the path's first zero-gradient input and "
        "the fraction whose gradient was exactly 0. At the shift the final logits' exact-zero gradients are also "
        "counted by autograd hooks on the cap's input and output (eager arms).",
        f"- Statistics: per arm and depth the median steps-to-recover and the spread (min to max) over seeds; the "
        f"ratio bf16-eager ÷ bf16-patch of the medians, with a {d.confidence:.0%} percentile bootstrap interval "
        f"({d.bootstrap} resamples of the seeds, paired, numpy generator seeded {d.bootstrap_seed}). Verdict per "
        "depth: 'bf16 eager slower' when the interval lies above 1, 'bf16 eager faster' when below, otherwise 'no "
        "measurable difference'.",
        "- Beside it, the document's single-logit prediction: `dynamics` (one logit, plain gradient descent, bf16) "
        "at a0 = each depth's largest pre-cap logit.",
    ]
