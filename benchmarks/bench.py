"""Speed figures (not tests): cold starts, `reproduce`, and the heavier investigations.

Run with `make bench`. Each figure is the median of a few runs on this machine.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from typing import Callable

PY = sys.executable
REPEAT = 9


def wall(cmd: list[str], repeat: int = REPEAT) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def timed(fn: Callable[[], object], repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def cold_starts() -> list[tuple[str, float, str]]:
    base = wall([PY, "-c", "import numpy, ml_dtypes, typer, rich"])
    rows = [("import numpy, ml_dtypes, typer, rich (baseline)", base, "")]
    for args in (["ratchet"], ["knee", "--dtype", "bf16", "--cap", "30"]):
        t = wall([PY, "-m", "softcapgrad", *args])
        rows.append((f"softcapgrad {' '.join(args)}", t, f"{t / base:.2f}x baseline (target <= 1.5x)"))
    return rows


def reproduce() -> list[tuple[str, float, str]]:
    t = wall(["make", "--no-print-directory", "-s", "reproduce"], repeat=1)
    return [("make reproduce (ledger and figures, installed already)", t, "target < 15 s")]


def dynamics() -> list[tuple[str, float, str]]:
    from softcapgrad.dynamics import Setting, headline, sweep

    s = Setting(cap=30.0)
    return [
        ("dynamics default (a0 = 40, c = 30, float64), both runs", timed(lambda: headline(40.0, s)), "target < 1 s"),
        ("dynamics sweep a0 = 10..130 (13 starts, vectorised)", timed(lambda: sweep([float(x) for x in range(10, 131, 10)], s), 1), ""),
    ]


def tether_step() -> list[tuple[str, float, str]]:
    import torch

    from softcapgrad.tether import FloorSchedule, TetherGate, tethergate_step, tethergate_step_per_gate

    gate = TetherGate(1000)
    gate.ema_s.copy_(torch.linspace(-1, 1, 1000))
    sched = FloorSchedule("exp", ramp_start=0, tau=100.0)
    steps = 20
    vec = timed(lambda: [tethergate_step(gate, t, sched, lr=1e-3, wd=20.0) for t in range(1, steps + 1)]) / steps
    loop = timed(lambda: [tethergate_step_per_gate(gate, t, sched, lr=1e-3, wd=20.0) for t in range(1, steps + 1)], 1) / steps
    return [
        ("tethergate_step, 1,000 gates, tensor ops (per step)", vec, ""),
        ("tethergate_step_per_gate, 1,000 gates, one read per gate (per step)", loop, f"{loop / vec:.0f}x slower"),
    ]


def remedy() -> list[tuple[str, float, str]]:
    import torch

    import softcapgrad

    x = (torch.randn(4096, 4096, generator=torch.Generator().manual_seed(0)) * 60).to(torch.bfloat16)

    def fwd_bwd(f) -> Callable[[], object]:
        def run() -> object:
            xr = x.detach().requires_grad_(True)
            f(xr).backward(torch.ones_like(xr))
            return xr.grad

        return run

    eager = timed(fwd_bwd(lambda t: 30.0 * torch.tanh(t / 30.0)), 5)
    fixed = timed(fwd_bwd(lambda t: softcapgrad.softcap(t, 30.0)), 5)
    return [
        ("eager 30·tanh(x/30), bf16 4096×4096, forward+backward", eager, ""),
        ("softcapgrad.softcap, bf16 4096×4096, forward+backward", fixed, f"{fixed / eager:.2f}x eager (target <= 1.5x)"),
    ]


def stacks() -> list[tuple[str, float, str]]:
    """horizon --path in a fresh process: torch.compile's graphs come from inductor's on-disk cache once warm."""
    one = [PY, "-m", "softcapgrad", "horizon", "--cap", "30", "--scores", "bf16", "--path"]
    eager = wall([*one, "torch-eager-cpu"], repeat=3)
    compiled = wall([*one, "torch-compile-cpu"], repeat=3)
    every = wall([PY, "-m", "softcapgrad", "horizon", "--path", "all", "--cap", "30", "--cap", "50"], repeat=1)
    return [
        ("horizon --path torch-eager-cpu, bf16, c = 30 (every bf16 value)", eager, ""),
        ("horizon --path torch-compile-cpu, bf16, c = 30 (compile, warm cache)", compiled, f"{compiled / eager:.1f}x eager"),
        ("horizon --path all, c = 30 and 50, bf16 and fp32 (one run)", every, ""),
    ]


def interleaved(runs: dict[str, Callable[[], object]], rounds: int = 7, per_round: int = 5) -> dict[str, float]:
    """Median time per call of each function, measured in alternation so load changes hit all alike."""
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for fn in runs.values():
        fn()  # warm-up
    for _ in range(rounds):
        for name, fn in runs.items():
            t0 = time.perf_counter()
            for _ in range(per_round):
                fn()
            samples[name].append((time.perf_counter() - t0) / per_round)
    return {name: statistics.median(times) for name, times in samples.items()}


def tiny_gemma2_step(batch: int = 2, seq: int = 16) -> Callable[[], object]:
    """One forward and backward of a 2-layer Gemma 2 (hidden 64, vocab 256) in bf16: the tests' model."""
    import torch

    from softcapgrad import audit

    config = audit.model_type_config("gemma2", {"final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0})
    torch.manual_seed(0)
    model = audit.build(audit.Source(config, None, False), config, "eager", torch.bfloat16)
    ids = torch.randint(0, 256, (batch, seq), generator=torch.Generator().manual_seed(0))

    def step() -> object:
        model(input_ids=ids, labels=ids).loss.backward()
        return model

    return step


def monitor_and_patch() -> list[tuple[str, float, str]]:
    import torch

    import softcapgrad

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # per-op cost, not thread contention on a shared machine, is what is compared
    rows = []
    for batch, seq in ((2, 16), (8, 128)):
        step = tiny_gemma2_step(batch, seq)

        def monitored(step=step) -> object:
            with softcapgrad.DeadZoneMonitor():
                return step()

        def patched(step=step) -> object:
            with softcapgrad.fp32_tanh_backward():
                return step()

        t = interleaved({"plain": step, "monitor": monitored, "patch": patched})
        rows += [
            (f"tiny Gemma 2 step (bf16, 2 layers, batch {batch}×{seq}, 1 thread), forward+backward", t["plain"], ""),
            ("  the same step inside DeadZoneMonitor", t["monitor"], f"{t['monitor'] / t['plain']:.2f}x (target < 2x)"),
            ("  the same step inside fp32_tanh_backward", t["patch"], f"{t['patch'] / t['plain']:.2f}x"),
        ]
    torch.set_num_threads(threads)
    x = (torch.randn(4096, 4096, generator=torch.Generator().manual_seed(0)) * 60).to(torch.bfloat16)

    def cap(under_patch: bool) -> Callable[[], object]:
        def run() -> object:
            xr = x.detach().requires_grad_(True)
            if under_patch:
                with softcapgrad.fp32_tanh_backward():
                    y = 30.0 * torch.tanh(xr / 30.0)
            else:
                y = 30.0 * torch.tanh(xr / 30.0)
            y.backward(torch.ones_like(y))
            return xr.grad

        return run

    big = interleaved({"eager": cap(False), "patch": cap(True)}, rounds=5, per_round=1)
    return rows + [
        ("eager 30·tanh(x/30), bf16 4096×4096, forward+backward", big["eager"], ""),
        ("  the same inside fp32_tanh_backward", big["patch"], f"{big['patch'] / big['eager']:.2f}x eager"),
    ]


SECTIONS: list[Callable[[], list[tuple[str, float, str]]]] = [cold_starts, reproduce, dynamics, tether_step, remedy, stacks,
                                                             monitor_and_patch]


def main(names: list[str] | None = None) -> None:
    """Every section, or only those named on the command line (e.g. ``bench.py monitor_and_patch``)."""
    for section in SECTIONS:
        if names and section.__name__ not in names:
            continue
        for name, seconds, note in section():
            shown = f"{seconds * 1000:10.1f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:10.1f} µs"
            print(f"{name:<68} {shown}  {note}")


if __name__ == "__main__":
    main(sys.argv[1:])
