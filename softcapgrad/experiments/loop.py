"""The training loop: phase 1 (learn the task), the confidence setting, and phase 2 (the shift) per arm.

Phase 2 runs one arm from a given fp32 state with a fresh AdamW, on the seed's batches, until the
shifted targets are learned (design.recover_*) or the step budget ends. softcapgrad.DeadZoneMonitor
watches step 0 alone and then one step in ``monitor_every``, one monitor per window; at step 0
autograd hooks on the final cap's input and output also count the exactly-zero gradients there
(eager arms: a hook inside compiled code would change what is compiled).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np

from softcapgrad.experiments import task as tasks
from softcapgrad.experiments.arms import Arm
from softcapgrad.experiments.design import Design

SITES = ("final logits", "attention")


@dataclass(frozen=True)
class Window:
    start: int  # first step of the window (0: the shift alone)
    end: int  # one past its last step
    watched: int  # steps the monitor watched
    site: str
    values: int  # capped values the watched forwards saw
    dead_fraction: float | None  # past the path's first zero-gradient input (monitor)
    zero_grad_fraction: float | None  # gradient exactly 0 from a non-zero upstream (monitor; None: no backward seen)
    largest: float  # largest |pre-cap value| seen
    mass_lost: float | None = None  # final logits: share of the exact gradient's L1 mass set to 0 (hooks; None: not seen)


@dataclass(frozen=True)
class ArmRun:
    arm: str
    depth: float
    seed: int
    steps: int | None  # updates before recovery; None: not recovered within the budget
    shifted_loss: list[float]  # per step, before its update
    other_loss: list[float]
    new_probability: list[float]
    hook_zero_grad_fraction: float | None  # final logits at the shift, by autograd hooks (None: compiled arm)
    hook_dead_fraction: float | None  # final logits at the shift past the arm's own first zero (hooks)
    hook_largest: float | None  # largest |a| of the final logits at the shift, as the arm stored it
    windows: list[Window] = field(default_factory=list)
    shift: str = "rotation"
    optimizer: str = "adamw"
    mass_lost_at_shift: float | None = None  # final logits at step 0 (hooks)
    grad0: object = field(default=None, repr=False, compare=False)  # the step-0 parameter gradient, flat fp64


def _ids(x: np.ndarray):
    import torch

    return torch.from_numpy(x)


def _autocast(on: bool):
    import torch

    return torch.autocast("cpu", dtype=torch.bfloat16) if on else contextlib.nullcontext()


def phase1(model, design: Design, seed: int, m: tasks.Mapping, advance=lambda n=1: None) -> dict:
    """Learn π in fp32 with the caps; the fp32 state after it."""
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=design.phase1_lr, weight_decay=design.weight_decay)
    before = torch.from_numpy(m.before)
    for step in range(design.phase1_steps):
        x = _ids(tasks.batch(design.task, seed, 0, step))
        logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), before[x].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        advance(1)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def largest_pre_cap(model, ids) -> float:
    """The largest pre-cap final logit (the output layer's output), fp32, over the given contexts."""
    import torch

    seen = []
    handle = model.lm_head.register_forward_hook(lambda mod, i, o: seen.append(o.detach().float().max()))
    try:
        with torch.no_grad():
            model(input_ids=ids)
    finally:
        handle.remove()
    return float(seen[0])


def pre_cap_logits(model, design: Design) -> np.ndarray:
    """The pre-cap final logits (fp32) with every token once as context: row t is the logits after token t."""
    import torch

    seen = []
    handle = model.lm_head.register_forward_hook(lambda mod, i, o: seen.append(o.detach().float()))
    try:
        with torch.no_grad():
            model(input_ids=_ids(tasks.probe(design.task)))
    finally:
        handle.remove()
    v = design.task.vocab
    return seen[0].reshape(-1, seen[0].shape[-1])[:v].numpy()


def confident(model, state: dict, target: float, design: Design) -> tuple[dict, float, float]:
    """``state`` with the output layer scaled so that the largest pre-cap logit over every token is ``target``:
    (the new state, the scale s, the largest pre-cap logit after scaling)."""
    model.load_state_dict(state)
    ids = _ids(tasks.probe(design.task))
    s = target / largest_pre_cap(model, ids)
    scaled = dict(state)
    scaled["lm_head.weight"] = state["lm_head.weight"] * s
    model.load_state_dict(scaled)
    return scaled, s, largest_pre_cap(model, ids)


def _site(cap: float | None, design: Design) -> str | None:
    if cap is None:
        return None
    if abs(cap - design.final_cap) <= 1e-6 * design.final_cap:
        return "final logits"
    if abs(cap - design.attn_cap) <= 1e-6 * design.attn_cap:
        return "attention"
    return None


def windows(monitor, start: int, end: int, watched: int, design: Design, lost=None) -> list[Window]:
    """One row per site from a monitor's rows (``watched``: the steps it watched; ``lost``: the hooks' (lost,
    total) exact L1 mass of the final logits over those steps)."""
    out = []
    rows = monitor.rows()
    for site in SITES:
        mine = [r for r in rows if _site(r.cap, design) == site and r.fn == "tanh"]
        if not mine:
            continue
        count = sum(r.count for r in mine)
        dead = [r.dead for r in mine if r.dead is not None]
        back = sum(r.backward_count for r in mine if r.zero_grad is not None)
        zero = sum(r.zero_grad for r in mine if r.zero_grad is not None)
        out.append(Window(start, end, watched, site, count,
                          sum(dead) / count if dead and count else None,
                          zero / back if back else None, max(r.max_abs for r in mine),
                          lost[0] / lost[1] if site == "final logits" and lost and lost[1] else None))
    return out


class _Hooks:
    """At the shift: the final cap's input a and the gradients at a and at the cap's output z."""

    def __init__(self, model) -> None:
        self.a = self.grad_a = self.grad_z = None
        self._handle = model.lm_head.register_forward_hook(self._forward)

    def _forward(self, module, inputs, a) -> None:
        self.a = a.detach()
        a.register_hook(self._keep("grad_a"))
        self._handle.remove()

    def _keep(self, name: str):
        def hook(g):
            setattr(self, name, g.detach())

        return hook

    def close(self) -> None:
        self._handle.remove()

    def watch_output(self, z) -> None:
        z.register_hook(self._keep("grad_z"))

    def mass(self, cap: float) -> tuple[float, float] | None:
        """(L1 mass of the exact gradient at the cap's input that the backward set to exactly 0, its whole L1 mass):
        exact = upstream × sech²(a/c), in fp64 from the stored a and upstream."""
        import torch

        if self.a is None or self.grad_a is None or self.grad_z is None:
            return None
        exact = (self.grad_z.double() * torch.cosh(self.a.double() / cap).reciprocal().square()).abs()
        return float(exact[self.grad_a == 0].sum()), float(exact.sum())

    def fractions(self, first_zero: float | None) -> tuple[float | None, float | None, float | None]:
        if self.a is None or self.grad_a is None or self.grad_z is None:
            return None, None, None
        n = self.a.numel()
        zero = int(((self.grad_a == 0) & (self.grad_z != 0)).sum()) / n
        largest = float(self.a.float().abs().max())
        dead = 0.0 if first_zero is None else int((self.a.float().abs() >= first_zero).sum()) / n
        return zero, dead, largest


def run_arm(arm: Arm, state: dict, design: Design, seed: int, depth: float, m: tasks.Mapping,
            first_zero: float | None, advance=lambda n=1: None, shift: str = "rotation", sgd: float | None = None,
            budget: int | None = None) -> ArmRun:
    """Phase 2 for one arm from ``state``: steps until the shifted targets are learned, curves, fractions
    (``sgd``: plain SGD at that learning rate instead of AdamW; ``budget``: most steps instead of the design's)."""
    import torch

    from softcapgrad.stacks.watch import DeadZoneMonitor

    arm.model.load_state_dict(state)
    if sgd is None:
        opt = torch.optim.AdamW(arm.model.parameters(), lr=design.lr, weight_decay=design.weight_decay)
    else:
        opt = torch.optim.SGD(arm.model.parameters(), lr=sgd)
    budget = design.phase2_steps if budget is None else budget
    after, shifted = torch.from_numpy(m.after), torch.from_numpy(m.shifted)
    curves: tuple[list, list, list] = ([], [], [])
    rows: list[Window] = []
    first = hooks = None if arm.spec.compiled else _Hooks(arm.model)
    lost = [0.0, 0.0]
    at_shift = grad0 = None
    monitor, opened, watched, steps = DeadZoneMonitor(), 0, 0, None
    for t in range(budget):
        if t >= 1 and (t - 1) % design.window == 0:
            rows += windows(monitor, opened, t, watched, design, lost)
            monitor, opened, watched, lost = DeadZoneMonitor(every=design.monitor_every), t, 0, [0.0, 0.0]
        x = _ids(tasks.batch(design.task, seed, 1, t))
        y, mask = after[x].reshape(-1), shifted[x].reshape(-1)
        with (monitor if t == 0 else monitor.step()) as seen:
            watched += seen is not False
            if t > 0 and seen is not False and not arm.spec.compiled:
                hooks = _Hooks(arm.model)
            with _autocast(arm.spec.autocast):
                z = arm.forward(input_ids=x).logits
            if hooks is not None:
                hooks.watch_output(z)
            losses = torch.nn.functional.cross_entropy(z.float().reshape(-1, z.shape[-1]), y, reduction="none")
            on, off = losses.detach()[mask], losses.detach()[~mask]
            shifted_loss, p_new = float(on.mean()), float(torch.exp(-on).mean())
            curves[0].append(round(shifted_loss, 4))
            curves[1].append(round(float(off.mean()), 4))
            curves[2].append(round(p_new, 4))
            done = p_new >= design.recover_probability and shifted_loss <= design.recover_loss
            if not done or t == 0:
                opt.zero_grad(set_to_none=True)
                losses.mean().backward()
            if t == 0:
                grad0 = torch.cat([p.grad.detach().double().reshape(-1) if p.grad is not None
                                   else torch.zeros(p.numel(), dtype=torch.float64) for p in arm.model.parameters()])
        if hooks is not None:
            mass = hooks.mass(design.final_cap) if arm.spec.caps else None
            if mass is not None:
                lost = [lost[0] + mass[0], lost[1] + mass[1]]
                if t == 0:
                    at_shift = mass[0] / mass[1] if mass[1] else 0.0
            if t > 0:
                hooks.close()
            hooks = None
        if done:
            steps = t
            break
        opt.step()
        advance(1)
    rows += windows(monitor, opened, len(curves[0]), watched, design, lost)
    zero, dead, largest = first.fractions(first_zero) if first is not None else (None, None, None)
    return ArmRun(arm.spec.name, depth, seed, steps, *curves, zero, dead, largest, rows, shift,
                  "adamw" if sgd is None else f"sgd lr {sgd:g}", at_shift, grad0)
