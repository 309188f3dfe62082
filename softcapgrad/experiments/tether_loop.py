"""tether-experiment's training: phase A (the branch useless) and phase B (needed) per arm and seed.

The plain and tether arms train from the seed's initialisation; the reinit arm forks from the plain
arm's state at the switch (its phase A is the plain arm's), with AdamW's state copied, so it differs from
plain only by the gate rows put back. Openings are read from the gate's own input (a forward hook on
q_proj: gate = the second half of each head's rows), so every arm is measured the same way.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np

from softcapgrad.experiments.tether_design import Design


@dataclass(frozen=True)
class Health:
    phase: str  # "A" or "B"
    step: int
    opening: float  # mean gate opening over the batch and every gate
    closed: float  # share of gates below design.closed_below × their step-0 opening
    saturated: float | None  # the monitor: share of the gates' sigmoid outputs stored as exactly 0 or 1
    zero_grad: float | None  # the monitor: share of its backward exactly 0 under a non-zero upstream gradient


@dataclass(frozen=True)
class Run:
    arm: str
    seed: int
    closed_at_switch: float  # (a)
    opening_at_switch: float
    steps: int | None  # (b) updates before recovery; None: censored
    loss_a: list[float]
    loss_b: list[float]
    health: list[Health] = field(default_factory=list)


def config(d: Design):
    from transformers import Qwen3NextConfig

    return Qwen3NextConfig(
        vocab_size=d.vocab, hidden_size=d.hidden, intermediate_size=d.intermediate, num_hidden_layers=d.layers,
        num_attention_heads=d.heads, num_key_value_heads=d.kv_heads, head_dim=d.head_dim,
        layer_types=["full_attention"] * d.layers, mlp_only_layers=list(range(d.layers)),
        max_position_embeddings=d.seq, tie_word_embeddings=False, attention_bias=d.bias, attn_implementation="eager")


def fresh(d: Design, seed: int):
    import torch
    from transformers import Qwen3NextForCausalLM

    torch.manual_seed(seed)
    model = Qwen3NextForCausalLM(config(d)).float()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(d.branch_scale)
    return model


def gate_rows(d: Design) -> np.ndarray:
    """q_proj's output rows that are gates: per head, [query (head_dim) | gate (head_dim)]."""
    return np.concatenate([np.arange(h * 2 * d.head_dim + d.head_dim, (h + 1) * 2 * d.head_dim)
                           for h in range(d.heads)])


def batch(d: Design, seed: int, phase: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, targets) of one batch; targets −100 where no loss is taken."""
    rng = np.random.default_rng([seed, phase, step])
    x = rng.integers(0, d.vocab, size=(d.batch, d.seq))
    if phase == 0:
        pi = np.random.default_rng([seed, 99]).permutation(d.vocab)
        y = np.where(rng.random(x.shape) < d.label_noise, rng.integers(0, d.vocab, size=x.shape), pi[x])
    else:
        y = np.full_like(x, -100)
        y[:, 1:] = x[:, :-1]
    return x, y


class _Openings:
    """The gates' mean opening per gate (layer × channel) over the last forward, from q_proj's output."""

    def __init__(self, model, d: Design) -> None:
        import torch

        rows = torch.from_numpy(gate_rows(d))
        self.seen: dict[int, object] = {}
        self.handles = []
        for i, layer in enumerate(model.model.layers):
            attn = layer.self_attn

            def hook(mod, inputs, out, i=i, attn=attn):  # runs inside the patch's mode: only stash u here
                self.seen[i] = (attn, out.detach()[..., rows])

            self.handles.append(attn.q_proj.register_forward_hook(hook))

    def now(self):
        import torch

        out = []
        with torch.no_grad():
            for i in sorted(self.seen):
                attn, u = self.seen[i]
                gate = getattr(attn, "tether_gate", None)
                if gate is None:
                    g = torch.sigmoid(u)
                else:
                    was = gate.training
                    gate.eval()
                    g = gate(u)
                    gate.train(was)
                out.append(g.reshape(-1, u.shape[-1]).mean(0))
        return torch.cat(out)

    def close(self) -> None:
        for h in self.handles:
            h.remove()


class GatesOnly:
    """Phase A of the gates-only scenario: AdamW over the gates' parameters alone (q_proj's gate rows and their bias;
    the tether arm's θ too), every other weight held where it started. The query rows of q_proj share its tensor:
    their gradient is zeroed and AdamW's decoupled weight decay on them undone after each step (put back exactly)."""

    def __init__(self, model, d: Design) -> None:
        import torch

        self.model, self.d = model, d
        rows = torch.from_numpy(gate_rows(d))
        self.keep = torch.ones(2 * d.heads * d.head_dim, dtype=torch.bool)
        self.keep[rows] = False  # True: a query row, held
        self.held, self.hooks, train = [], [], []
        for name, p in model.named_parameters():
            if ".q_proj." in name:
                mask = (~self.keep).to(p.dtype).reshape(-1, *([1] * (p.dim() - 1)))
                self.hooks.append(p.register_hook(lambda g, m=mask: g * m))
                self.held.append((p, p.detach()[self.keep].clone()))
                train.append(p)
            elif name.endswith("tether_gate.theta"):
                train.append(p)
            else:
                p.requires_grad_(False)
        self.opt = torch.optim.AdamW(train, lr=d.lr, weight_decay=d.weight_decay)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.opt.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        import torch

        self.opt.step()
        with torch.no_grad():
            for p, values in self.held:
                p[self.keep] = values

    def release(self):
        """Every parameter trainable again; phase B's optimizer (fresh AdamW over all of them)."""
        import torch

        for h in self.hooks:
            h.remove()
        for p in self.model.parameters():
            p.requires_grad_(True)
        return torch.optim.AdamW(self.model.parameters(), lr=self.d.lr, weight_decay=self.d.weight_decay)


def _step(model, opt, tether, x, y, t: int, d: Design, monitor=None) -> float:
    import torch

    ids, target = torch.from_numpy(x), torch.from_numpy(y)
    z = model(input_ids=ids).logits
    loss = torch.nn.functional.cross_entropy(z.reshape(-1, z.shape[-1]), target.reshape(-1), ignore_index=-100)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if tether is not None:
        tether.step(t, d.lr, g_target=0.5, anchor="global")  # the design's spring (tethergate.md's defaults)
    return float(loss.detach())


def _monitor_rows(monitor) -> tuple[float | None, float | None]:
    rows = [r for r in monitor.rows() if r.fn == "sigmoid" and "self_attn" in r.module]
    count = sum(r.count for r in rows)
    sat = [r.saturated for r in rows if r.saturated is not None]
    back = sum(r.backward_count for r in rows if r.zero_grad is not None)
    zero = sum(r.zero_grad for r in rows if r.zero_grad is not None)
    return (sum(sat) / count if sat and count else None), (zero / back if back else None)


def _phase(model, opt, tether, d: Design, seed: int, phase: int, steps: int, first, watch: _Openings,
           health: list[Health], advance, start: int = 0) -> tuple[list[float], int | None]:
    """Train ``steps`` steps of a phase; phase B stops at recovery. (losses before each update, steps or None)."""
    from softcapgrad.stacks.watch import DeadZoneMonitor

    losses: list[float] = []
    for t in range(steps):
        x, y = batch(d, seed, phase, t)
        watched = t % d.every == 0
        monitor = DeadZoneMonitor() if watched else None
        if monitor is not None:
            with monitor:
                loss = _probe_then_step(model, opt, tether, x, y, start + t, d, phase == 1)
        else:
            loss = _probe_then_step(model, opt, tether, x, y, start + t, d, phase == 1)
        losses.append(round(loss[0], 4))
        if watched:
            g = watch.now()
            sat, zero = _monitor_rows(monitor)
            health.append(Health("AB"[phase], t, round(float(g.mean()), 6),
                                 round(float((g < d.closed_below * first).double().mean()), 6),
                                 None if sat is None else round(sat, 8), None if zero is None else round(zero, 8)))
        if loss[1]:
            return losses, t
        advance(1)
    return losses, None


def _probe_then_step(model, opt, tether, x, y, t, d: Design, stop: bool) -> tuple[float, bool]:
    """The batch's loss before its update; phase B: recovered batches are not stepped on. With
    ``d.probe_observes`` (the train-all design, as its committed results ran) the probe forward runs in training
    mode, so in phase B the tether arm's gates observe each batch twice (its EMA decays by 0.99² a step, the other
    arms have no EMA); without it the tether gates are in eval mode for the probe and the EMA sees each batch once."""
    import torch

    if stop:
        quiet = [] if tether is None or d.probe_observes else [g for g in tether.gates if g.training]
        for g in quiet:
            g.eval()
        try:
            with torch.no_grad():
                z = model(input_ids=torch.from_numpy(x)).logits
                loss = float(torch.nn.functional.cross_entropy(z.reshape(-1, z.shape[-1]),
                                                               torch.from_numpy(y).reshape(-1), ignore_index=-100))
        finally:
            for g in quiet:
                g.train()
        if loss <= d.recover_loss:
            return loss, True
    loss = _step(model, opt, tether, x, y, t, d)
    return loss, False


def run_seed(d: Design, seed: int, advance=lambda n=1: None) -> list[Run]:
    """Every arm of one seed."""
    import torch

    from softcapgrad.training.tether_patch import patch_gates

    out = []
    init = fresh(d, seed).state_dict()
    rows = torch.from_numpy(gate_rows(d))
    forks = {}
    for arm in [a for a in ("plain", "tether") if a in d.arms or (a == "plain" and "reinit" in d.arms)]:
        model = fresh(d, seed)
        model.train()
        tether = patch_gates(model) if arm == "tether" else None
        opt = GatesOnly(model, d) if d.train_a == "gates" else \
            torch.optim.AdamW(model.parameters(), lr=d.lr, weight_decay=d.weight_decay)
        watch = _Openings(model, d)
        with torch.no_grad():
            model(input_ids=torch.from_numpy(batch(d, seed, 0, 0)[0]))
        first = watch.now().clone()
        health: list[Health] = []
        loss_a, _ = _phase(model, opt, tether, d, seed, 0, d.steps_a, first, watch, health, advance)
        with torch.no_grad():
            model(input_ids=torch.from_numpy(batch(d, seed, 0, d.steps_a - 1)[0]))
        g = watch.now()
        closed, opening = float((g < d.closed_below * first).double().mean()), float(g.mean())
        if isinstance(opt, GatesOnly):  # phase B: every parameter, a fresh AdamW (for every arm)
            opt = opt.release()
        if arm == "plain" and "reinit" in d.arms:
            forks = {"model": copy.deepcopy(model.state_dict()), "opt": copy.deepcopy(opt.state_dict()),
                     "health": list(health), "loss_a": list(loss_a), "closed": closed, "opening": opening}
        if arm in d.arms:
            loss_b, steps = _phase(model, opt, tether, d, seed, 1, d.steps_b, first, watch, health, advance,
                                   d.steps_a)
            out.append(Run(arm, seed, round(closed, 6), round(opening, 6), steps, loss_a, loss_b, health))
        watch.close()
    if "reinit" in d.arms:
        model = fresh(d, seed)
        model.load_state_dict(forks["model"])
        with torch.no_grad():
            for i, layer in enumerate(model.model.layers):
                q = layer.self_attn.q_proj
                q.weight[rows] = init[f"model.layers.{i}.self_attn.q_proj.weight"][rows]
                if q.bias is not None:
                    q.bias[rows] = init[f"model.layers.{i}.self_attn.q_proj.bias"][rows]
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=d.lr, weight_decay=d.weight_decay)
        opt.load_state_dict(forks["opt"])
        watch = _Openings(model, d)
        with torch.no_grad():
            model(input_ids=torch.from_numpy(batch(d, seed, 0, 0)[0]))
        health = list(forks["health"])
        first = _first_opening(d, seed, init)
        loss_b, steps = _phase(model, opt, None, d, seed, 1, d.steps_b, first, watch, health, advance, d.steps_a)
        watch.close()
        out.append(Run("reinit", seed, round(forks["closed"], 6), round(forks["opening"], 6), steps,
                       forks["loss_a"], loss_b, health))
    return sorted(out, key=lambda r: d.arms.index(r.arm))


def _first_opening(d: Design, seed: int, init: dict):
    import torch

    model = fresh(d, seed)
    model.load_state_dict(init)
    watch = _Openings(model, d)
    with torch.no_grad():
        model(input_ids=torch.from_numpy(batch(d, seed, 0, 0)[0]))
    first = watch.now().clone()
    watch.close()
    return first
