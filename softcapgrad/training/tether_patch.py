"""TetherGate patched into a transformers model without editing it: ``softcapgrad.patch(model, gates="tether")``.

A head-gate site is an attention module whose forward computes a gate link(u) of its own projection and
scales its heads' output by it. The sites this patch holds, in transformers 5.24.0 as installed:

- ``LagunaAttention`` (models/laguna/modeling_laguna.py:401): ``F.softplus(self.g_proj(hidden_states).float())``,
  one gate per head when ``config.gating`` is True or "per-head" (line 354), else one per channel;
- ``Qwen3NextAttention`` (models/qwen3_next/modeling_qwen3_next.py:270-273, 301), ``Qwen3_5Attention``
  (models/qwen3_5/modeling_qwen3_5.py:812) and ``Qwen3_5MoeAttention`` (models/qwen3_5_moe/modeling_qwen3_5_moe.py:831):
  gated attention's output gate ``attn_output * torch.sigmoid(gate)``, ``gate`` the second half of q_proj's
  output per head, one gate per channel (heads × head_dim).

The module's class forward is left as it is; the instance gets a ``forward`` that runs the class's inside a
torch function mode, which hands the first call of the site's link whose input has the gate's width to an
:class:`~softcapgrad.training.anchored.AnchoredGate` (registered on the module as ``tether_gate``, so
``model.parameters()`` holds its θ). At step 0 the outputs are those of the unpatched model, bit for bit.
``torch.compile(model)`` traces the mode with the rest (no graph break; the gate's θ gets its gradient).

Sites it refuses, named in one line each: routers (``LagunaTopKRouter``'s sigmoid scores, line 167;
the MoE blocks' ``shared_expert_gate``, qwen3_next line 864: one scalar per token, not a head gate) and
activations (``Qwen3NextGatedDeltaNet``'s sigmoid β, line 725; its ``RMSNormGated`` silu, line 73).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode

from softcapgrad.core.checks import InputError
from softcapgrad.training.anchored import AnchoredGate, Awake
from softcapgrad.training.tether import tethergate_step

GATES = ("tether",)
KINDS = ("router", "activation")
WD, G_TARGET, KAPPA_SLEEP, ANCHOR = 20.0, 0.5, 0.1, "global"  # tethergate.md's defaults for a hand-set target


@dataclass(frozen=True)
class Site:
    cls: str  # the attention module's class name
    link: str  # sigmoid | softplus
    what: str


HELD = {
    "LagunaAttention": Site("LagunaAttention", "softplus", "Laguna's softplus head gate of g_proj"),
    "Qwen3NextAttention": Site("Qwen3NextAttention", "sigmoid", "gated attention's sigmoid output gate"),
    "Qwen3_5Attention": Site("Qwen3_5Attention", "sigmoid", "gated attention's sigmoid output gate"),
    "Qwen3_5MoeAttention": Site("Qwen3_5MoeAttention", "sigmoid", "gated attention's sigmoid output gate"),
}
REFUSED = {  # class name -> (kind, why) for the gate-like calls this patch does not hold
    "LagunaTopKRouter": ("router", "sigmoid routing scores choose experts; no branch to tether"),
    "Qwen3NextTopKRouter": ("router", "routing scores choose experts"),
    "Qwen3_5MoeTopKRouter": ("router", "routing scores choose experts"),
    "Qwen3NextGatedDeltaNet": ("activation", "sigmoid β is the delta rule's step size, not a branch gate"),
    "Qwen3_5GatedDeltaNet": ("activation", "sigmoid β is the delta rule's step size, not a branch gate"),
    "Qwen3_5MoeGatedDeltaNet": ("activation", "sigmoid β is the delta rule's step size, not a branch gate"),
    "Qwen3NextRMSNormGated": ("activation", "silu(gate) inside a norm"),
    "Qwen3_5RMSNormGated": ("activation", "silu(gate) inside a norm"),
}
SHARED_EXPERT_GATE = "shared_expert_gate"  # an nn.Linear of one output: a per-token scalar router-like gate


def gate_width(module, site: Site) -> int:
    """Gates per token at a site: Laguna's g_proj outputs; gated attention's heads × head_dim."""
    if site.cls == "LagunaAttention":
        return module.g_proj.out_features
    return module.o_proj.in_features


class _Hold(TorchFunctionMode):
    """Inside one forward of a site: the first call of its link on a tensor of the gate's width goes to the gate."""

    def __init__(self, gate: AnchoredGate, link: str) -> None:
        super().__init__()
        self.gate, self.link, self.held = gate, link, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if (not self.held and name == self.link and args and isinstance(args[0], torch.Tensor)
                and args[0].shape[-1:] == self.gate.theta.shape and len(args) == 1 and not kwargs):
            self.held += 1
            return self.gate(args[0])
        return func(*args, **kwargs)


@dataclass(frozen=True)
class Refusal:
    module: str
    cls: str
    kind: str
    why: str


@dataclass(frozen=True)
class Held:
    module: str
    cls: str
    link: str
    gates: int
    what: str


class TetherPatch:
    """What ``patch(model, gates="tether")`` did, ``step`` (the spring, after each optimizer step) and ``remove``."""

    def __init__(self, held: list[tuple[str, torch.nn.Module, Held]], refused: list[Refusal]) -> None:
        self._modules = [(m, h) for _, m, h in held]
        self.held = [h for _, _, h in held]
        self.refused = refused
        self.gates = [m.tether_gate for m, _ in self._modules]

    def step(self, step: int, lr: float, wd: float = WD, g_target: float | None = None,
             kappa_sleep: float = KAPPA_SLEEP, anchor: str | None = None) -> float:
        """tethergate_step over every held gate, floor 0 throughout (tethergate.md's spring with k = lr·wd).

        Default: each gate holds its own opening at its mean input, measured on the first training batch after
        patching (anchored.py), each to its own target (anchor "local"): a pretrained model's gates stay where they
        were unless the loss moves them. ``g_target=`` (a sigmoid gate's in (0, 1), a softplus gate's > 0, in its
        own units) holds every gate at that opening instead, with tethergate.md's global anchor unless ``anchor``."""
        anchor = anchor or ("local" if g_target is None else ANCHOR)
        return tethergate_step(self.gates, step, Awake(), lr, wd, g_target, kappa_sleep, anchor)

    def held_openings(self) -> list[float]:
        """The opening each gate is held at by default, link(a*) (NaN before the first training batch)."""
        return [float(x) for gate in self.gates for x in gate.held_openings().detach()]

    def openings(self) -> list[float]:
        """The mean opening of every gate as last seen: link(β·(EMA(u) − θ)) per gate (NaN before a training step)."""
        out = []
        for gate in self.gates:
            with torch.no_grad():
                a = gate.beta * (gate.ema_s - gate.theta)
                g = torch.sigmoid(a) if gate.link == "sigmoid" else torch.nn.functional.softplus(a)
            out += [float(x) for x in g]
        return out

    def remove(self) -> None:
        for module, _ in self._modules:
            module.__dict__.pop("forward", None)
            del module.tether_gate


def refusals(model: torch.nn.Module) -> list[Refusal]:
    """Every gate-like site of ``model`` this patch does not hold, with its kind."""
    out = []
    for name, module in model.named_modules():
        cls = type(module).__name__
        if cls in REFUSED:
            kind, why = REFUSED[cls]
            out.append(Refusal(name, cls, kind, why))
        elif name.rsplit(".", 1)[-1] == SHARED_EXPERT_GATE:
            out.append(Refusal(name, cls, "router", "a per-token scalar gate of the shared expert, not a head gate"))
    return out


def _wrap(module: torch.nn.Module, gate: AnchoredGate, link: str) -> None:
    inner = module.forward

    @functools.wraps(inner)
    def forward(*args, **kwargs):
        with _Hold(gate, link):
            return inner(*args, **kwargs)

    module.forward = forward


def patch_gates(model: torch.nn.Module, gates: str = "tether") -> TetherPatch:
    """Replace every head gate of ``model`` by an anchored gate equal to it at step 0 (see the module's text).

    One line (InputError) for an unknown ``gates``, a model with no site it holds, or one patched twice.
    """
    if gates not in GATES:
        raise InputError(f"gates={gates!r}: the patch holds {', '.join(GATES)}")
    refused = refusals(model)
    found = [(n, m, HELD[type(m).__name__]) for n, m in model.named_modules() if type(m).__name__ in HELD]
    if not found:
        listed = "; ".join(f"{r.module} ({r.kind})" for r in refused[:4]) + ("; ..." if len(refused) > 4 else "")
        raise InputError(f"{type(model).__name__} has no head gate this patch can hold (it holds "
                         f"{', '.join(HELD)})" + (f"; refused: {listed}" if refused else ""))
    held = []
    for name, module, site in found:
        if "forward" in module.__dict__ or hasattr(module, "tether_gate"):
            raise InputError(f"{name or type(module).__name__} is already patched (an instance-level forward)")
        ref = next((p for p in module.parameters()), None)
        gate = AnchoredGate(gate_width(module, site), site.link)
        if ref is not None:
            gate = gate.to(ref.device)
        module.tether_gate = gate
        _wrap(module, gate, site.link)
        held.append((name, module, Held(name, site.cls, site.link, gate.theta.numel(), site.what)))
    return TetherPatch(held, refused)

