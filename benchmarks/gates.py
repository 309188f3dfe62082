"""GateMonitor on a watched step of each tiny gated model type it reports (lfm3: a bf16 sigmoid output gate per head;
laguna: an fp32 softplus gate per head, of g_proj's bf16 output cast, and a sigmoid router; qwen3_next: a bf16
sigmoid gate per channel of each head and softmax routers), eager and compiled, against the same step unwatched
(target ≤ 1.1×, issues 38 and 54); and lfm3 eager at batch 8×128, where the monitor's cost per gate call, the same
at any size, weighs less. BENCH_GATE_MODELS=lfm3,laguna picks the model types (default all three).

Each step is timed in this thread's CPU time (time.thread_time: the load of other processes, and torch's idle
worker threads, count least there). The watched step's figure is the plain median plus the median of the per-round
differences (each round runs both, in turn): the machine's speed drifts within a run (the 8×128 plain step went
from 17 to 27 ms in one), and the medians of the two sides taken apart follow the drift, while a round's difference
cancels most of it."""

from __future__ import annotations

import os
import time
import warnings

from benchmarks.timing import Figure, interleaved, paired_extra


MODELS = ("lfm3", "laguna", "qwen3_next")


def _tiny(model_type: str, compiled: bool, batch: int = 2, seq: int = 16):
    import torch

    from softcapgrad.models import audit

    config = audit.model_type_config(model_type, {})
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
    models = os.environ.get("BENCH_GATE_MODELS", ",".join(MODELS)).split(",")
    cases = [(m, compiled, 2, 16) for m in models for compiled in (False, True)]
    for model_type, compiled, batch, seq in cases + ([("lfm3", False, 8, 128)] if "lfm3" in models else []):
        step = _tiny(model_type, compiled, batch, seq)
        monitor = GateMonitor()

        def watched(step=step, monitor=monitor) -> object:
            with monitor:
                return step()

        for fn in (step, watched):
            fn()  # warm-up (and the compilation)
        monitor.rows()  # the first-zero lookup, once, outside the timing
        samples: dict[str, list[float]] = {}  # a round is one step of each (10 to 60 ms): many rounds cost little
        t = interleaved({"plain": step, "watched": watched}, repeat=int(os.environ.get("BENCH_GATE_REPEAT", "61")),
                        clock=time.thread_time, samples=samples)
        extra, low, high = paired_extra(samples, "watched", "plain")
        kind = "compiled" if compiled else "eager"
        out += [Figure(f"tiny {model_type} step (bf16, batch {batch}×{seq}, 1 thread), {kind}, forward+backward",
                       t["plain"]),
                Figure(f"  the same step inside GateMonitor ({kind}): plain + paired extra", t["plain"] + extra,
                       t["plain"], "<= 1.1x", 1.1),
                Figure(f"  watched minus plain, per round (quartiles {low * 1e3:.2f} to {high * 1e3:.2f} ms)", extra)]
    torch.set_num_threads(threads)
    return out
