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
