"""GateMonitor on a watched step of a tiny gated model (lfm3: a bf16 sigmoid output gate per head), eager and
compiled, against the same step unwatched (target ≤ 1.1×, issue 38); and eager at batch 8×128, where the monitor's
cost per gate call, the same at any size, weighs less.

The watched step's figure is the plain median plus the median of the per-round differences (each round runs both,
in turn): the machine's speed drifts within a run (the 8×128 plain step went from 17 to 27 ms in one), and the
medians of the two sides taken apart follow the drift, while a round's difference cancels most of it."""

from __future__ import annotations

import os
import time
import warnings

from benchmarks.timing import Figure, interleaved, paired_extra


def _lfm3(compiled: bool, batch: int = 2, seq: int = 16):
    import torch

    from softcapgrad.models import audit

    config = audit.model_type_config("lfm3", {})
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = audit.build(audit.Source(config, None, False), config, "eager", torch.bfloat16)
    model.train()
    forward = torch.compile(model, dynamic=False) if compiled else model
    ids = torch.randint(0, config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(0))

    def step() -> object:
        forward(input_ids=ids, labels=ids).loss.backward()
        return model

    return step


def gate_monitor() -> list[Figure]:
    import torch

    from softcapgrad.stacks.watch import GateMonitor

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # per-op cost, not thread contention on a shared machine
    out = []
    for compiled, batch, seq in ((False, 2, 16), (True, 2, 16), (False, 8, 128)):
        step = _lfm3(compiled, batch, seq)
        monitor = GateMonitor()

        def watched(step=step, monitor=monitor) -> object:
            with monitor:
                return step()

        for fn in (step, watched):
            fn()  # warm-up (and the compilation)
        monitor.rows()  # the first-zero lookup, once, outside the timing
        samples: dict[str, list[float]] = {}  # a round is one step of each (10 to 60 ms): many rounds cost little
        t = interleaved({"plain": step, "watched": watched}, repeat=int(os.environ.get("BENCH_GATE_REPEAT", "61")),
                        clock=time.process_time, samples=samples)
        extra, low, high = paired_extra(samples, "watched", "plain")
        kind = "compiled" if compiled else "eager"
        out += [Figure(f"tiny lfm3 step (bf16, batch {batch}×{seq}, 1 thread), {kind}, forward+backward", t["plain"]),
                Figure(f"  the same step inside GateMonitor ({kind}): plain + paired extra", t["plain"] + extra,
                       t["plain"], "<= 1.1x", 1.1),
                Figure(f"  watched minus plain, per round (quartiles {low * 1e3:.2f} to {high * 1e3:.2f} ms)", extra)]
    torch.set_num_threads(threads)
    return out
