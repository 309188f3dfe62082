"""TetherGate against a plain learned sigmoid gate, and its vectorised step against the per-gate reference."""

from __future__ import annotations

from benchmarks.timing import Figure, interleaved


# --- TetherGate --------------------------------------------------------------------------------


def tether() -> list[Figure]:
    import torch

    from softcapgrad.training.tether import FloorSchedule, TetherGate, tethergate_step, tethergate_step_per_gate

    gen = torch.Generator().manual_seed(0)
    s = torch.randn(32, 2048, 1024, generator=gen)
    grad = torch.randn(32, 2048, 1024, generator=gen)
    theta = torch.zeros(1024, requires_grad=True)
    gate = TetherGate(1024).train()
    gate.floor.fill_(0.5)

    def plain() -> None:
        torch.sigmoid(6.0 * (s - theta)).backward(grad)

    def tethered() -> None:
        gate(s).backward(grad)

    def plain_forward() -> None:
        with torch.no_grad():
            torch.sigmoid(6.0 * (s - theta))

    def tethered_forward() -> None:
        with torch.no_grad():
            gate(s)

    t = interleaved({"plain": plain, "tether": tethered, "plain fwd": plain_forward, "tether fwd": tethered_forward,
                     "ema": lambda: gate._observe(s)}, repeat=5)
    step_gate = TetherGate(1000)
    step_gate.ema_s.copy_(torch.linspace(-1, 1, 1000))
    sched = FloorSchedule("exp", ramp_start=0, tau=100.0)
    steps = interleaved({
        "vector": lambda: [tethergate_step(step_gate, i, sched, lr=1e-3, wd=20.0) for i in range(1, 21)],
        "loop": lambda: [tethergate_step_per_gate(step_gate, i, sched, lr=1e-3, wd=20.0) for i in range(1, 21)],
    }, repeat=1)
    return [
        Figure("TetherGate train fwd+bwd vs sigmoid(6(s − θ)), (32, 2048, 1024)", t["tether"], t["plain"], "<= 1.3x", 1.3),
        Figure("TetherGate train forward vs the plain gate's", t["tether fwd"], t["plain fwd"]),
        Figure("  of which the EMA update (share of TetherGate fwd+bwd)", t["ema"], t["tether"]),
        Figure("tethergate_step, 1,000 gates, tensor ops, vs one host read per gate (per step)", steps["vector"] / 20,
               steps["loop"] / 20),
    ]


# --- softcapgrad.patch(model, gates="tether") ----------------------------------------------------


def tether_patch() -> list[Figure]:
    """A training step of a tiny Qwen3-Next (gated attention) patched with TetherGate against the same model
    unpatched: eager, and each under torch.compile (compiled once before timing)."""
    import copy

    import torch

    from softcapgrad.experiments.tether_design import DESIGN
    from softcapgrad.experiments.tether_loop import batch, fresh
    from softcapgrad.training.tether_patch import patch_gates

    plain = fresh(DESIGN, 0).train()
    patched = copy.deepcopy(plain)
    gates = patch_gates(patched)
    ids = torch.from_numpy(batch(DESIGN, 0, 0, 0)[0])

    def step(model, after=lambda: None):
        def run() -> None:
            model(input_ids=ids).logits.float().square().mean().backward()
            after()
        return run

    spring = step(patched, lambda: gates.step(1, 1e-2))
    c_plain, c_patched = torch.compile(plain), torch.compile(patched)
    for f in (step(c_plain), step(c_patched)):
        f()  # compile before timing
    t = interleaved({"plain": step(plain), "patched": step(patched), "spring": spring,
                     "c plain": step(c_plain), "c patched": step(c_patched)}, repeat=7)
    return [
        Figure("patched tiny Qwen3-Next fwd+bwd vs unpatched, eager", t["patched"], t["plain"], "<= 1.3x", 1.3),
        Figure("  the same with the spring step after it", t["spring"], t["plain"]),
        Figure("patched vs unpatched, both under torch.compile", t["c patched"], t["c plain"], "<= 1.3x", 1.3),
    ]
