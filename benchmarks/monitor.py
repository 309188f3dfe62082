"""The dead-zone monitor and the fp32 tanh backward on Gemma 2 steps, eager and compiled."""

from __future__ import annotations

import os
import sys
import time
from typing import Callable

from benchmarks.timing import Figure, interleaved, paired_extra


# --- the dead-zone monitor and the fp32 tanh backward ------------------------------------------


def tiny_gemma2_step(batch: int = 2, seq: int = 16) -> Callable[[], object]:
    """One forward and backward of a 2-layer Gemma 2 (hidden 64, vocab 256) in bf16: the tests' model."""
    import torch

    from softcapgrad.models import audit

    config = audit.model_type_config("gemma2", {"final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0})
    torch.manual_seed(0)
    model = audit.build(audit.Source(config, None, False), config, "eager", torch.bfloat16)
    ids = torch.randint(0, 256, (batch, seq), generator=torch.Generator().manual_seed(0))

    def step() -> object:
        model(input_ids=ids, labels=ids).loss.backward()
        return model

    return step


def _per_call(fn: Callable[[], object], calls: int = 5) -> Callable[[], object]:
    """``calls`` calls in one timed run (the figure is then divided by ``calls``)."""
    return lambda: [fn() for _ in range(calls)]


def monitor_and_patch() -> list[Figure]:
    import torch

    import softcapgrad

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # per-op cost, not thread contention on a shared machine, is what is compared
    out = []
    for batch, seq in ((2, 16), (8, 128)):
        step = tiny_gemma2_step(batch, seq)

        def monitored(step=step) -> object:
            with softcapgrad.DeadZoneMonitor():
                return step()

        def patched(step=step) -> object:
            with softcapgrad.fp32_tanh_backward():
                return step()

        for fn in (step, monitored, patched):
            fn()  # warm-up
        t = {k: v / 5 for k, v in interleaved({"plain": _per_call(step), "monitor": _per_call(monitored),
                                                 "patch": _per_call(patched)}, repeat=7).items()}
        out += [
            Figure(f"tiny Gemma 2 step (bf16, 2 layers, batch {batch}×{seq}, 1 thread), forward+backward", t["plain"]),
            Figure("  the same step inside DeadZoneMonitor", t["monitor"], t["plain"], "< 2x", 2.0),
            Figure("  the same step inside fp32_tanh_backward", t["patch"], t["plain"]),
        ]
    torch.set_num_threads(threads)
    x16 = (torch.randn(4096, 4096, generator=torch.Generator().manual_seed(0)) * 60).to(torch.bfloat16)

    def cap(under_patch: bool, x) -> Callable[[], object]:
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

    for name, x in (("bf16", x16), ("fp32 (derivative in fp64)", x16.float())):
        big = interleaved({"eager": cap(False, x), "patch": cap(True, x)}, repeat=5)
        out.append(Figure(f"eager 30·tanh(x/30) in fp32_tanh_backward vs not, {name} 4096², fwd+bwd",
                          big["patch"], big["eager"]))
    return out


def _without_counter(gm, example_inputs):
    """inductor with no in-graph counter: the counter-free compiled baseline (its own backend, so dynamo keeps its
    graphs apart from those compiled with the counter)."""
    from torch._inductor import config
    from torch._inductor.compile_fx import compile_fx

    with config.patch(pre_grad_custom_pass=None):
        return compile_fx(gm, example_inputs)


def _gemma2(size: str, compiled: bool, batch: int, seq: int, counter: bool = True):
    """(model, step) for a Gemma 2 from config in bf16: "tiny" is the tests' (2 layers, hidden 64, vocab 256),
    "larger" 4 layers, hidden 512, 8 heads of 64, MLP 2048, vocab 8192; ``step`` runs forward and backward.
    ``counter=False`` compiles without the in-graph counter."""
    import torch
    from transformers import Gemma2Config, Gemma2ForCausalLM

    from softcapgrad.models import audit

    caps = {"final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0}
    if size == "tiny":
        config = audit.model_type_config("gemma2", caps)
    else:
        config = Gemma2Config(vocab_size=8192, hidden_size=512, intermediate_size=2048, num_hidden_layers=4,
                              num_attention_heads=8, num_key_value_heads=4, head_dim=64, **caps)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = Gemma2ForCausalLM(config).to(torch.bfloat16)
    forward = model
    if compiled:
        forward = torch.compile(model, dynamic=False, **({} if counter else {"backend": _without_counter}))
    ids = torch.randint(0, config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(0))

    def step() -> object:
        forward(input_ids=ids, labels=ids).loss.backward()
        return model

    return model, step


def _check_counter(step: Callable[[], object], expected: bool) -> None:
    """The compiled baseline must carry no counter, and the counted step must carry it."""
    from softcapgrad.stacks.watch import DeadZoneMonitor

    with DeadZoneMonitor(learn=False) as probe:
        step()
    if bool(probe.rows()) != expected:
        sys.exit(f"bench: the compiled {'counted' if expected else 'counter-free'} step "
                 f"{'has no' if expected else 'has an'} in-graph counter")


def monitor_sampled() -> list[Figure]:
    """The monitor's cost against a counter-free step, eager and compiled, watching every step and one in 100:
    bf16, one thread, medians of this process's CPU time (load from other processes inflates it less than wall time).

    The watched steps use one monitor over many steps, as a training loop does: its first step watches every
    aten op and finds the cap sites; from then on an eager step is watched in those modules' code only."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from softcapgrad.stacks.watch import DeadZoneMonitor

    class Empty(TorchDispatchMode):  # the floor of any monitor that sees every aten op
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out, n = [], 100
    sizes = os.environ.get("BENCH_MONITOR_SIZES", "tiny,larger").split(",")
    for size, batch, seq in [s for s in (("tiny", 8, 128), ("larger", 4, 256)) if s[0] in sizes]:
        for compiled in (False, True):
            torch.compiler.reset()
            _, plain = _gemma2(size, compiled, batch, seq, counter=False)  # counter-free: no monitor, no pass
            plain()
            DeadZoneMonitor()  # installs the counting pass before the next compile
            _, step = _gemma2(size, compiled, batch, seq)
            step()
            if compiled:
                _check_counter(plain, False)
                _check_counter(step, True)
            every = DeadZoneMonitor(every=1)
            sampled = DeadZoneMonitor(every=n)

            def watched(step=step, every=every) -> object:
                with every.step():
                    return step()

            def unwatched(step=step, sampled=sampled) -> object:
                sampled.steps = 1  # never the first of n: not watched
                with sampled.step():
                    return step()

            def every_op(step=step) -> object:
                with DeadZoneMonitor(learn=False):
                    return step()

            def empty(step=step) -> object:
                with Empty():
                    return step()

            runs = {"plain": plain, "watched": watched, "unwatched": unwatched, "every op": every_op}
            if not compiled:
                runs["empty"] = empty
            for fn in runs.values():
                fn()  # warm-up; the persistent monitor learns its sites here
            samples: dict[str, list[float]] = {}
            t = interleaved(runs, repeat=int(os.environ.get("BENCH_MONITOR_REPEAT", "7")), clock=time.process_time,
                            samples=samples)
            amortised = ((n - 1) * t["unwatched"] + t["watched"]) / n
            how = "compiled" if compiled else "eager"
            extra, low, high = paired_extra(samples, "watched", "plain")
            out += [
                Figure(f"{size} Gemma 2 step, {how}, {batch}×{seq}, CPU time, no counter", t["plain"]),
                Figure("  watched, every = 1 (after its first step: the sites found)", t["watched"], t["plain"],
                       "<= 1.1x", 1.1),
                Figure(f"  watched minus plain, per round (quartiles {low * 1e3:.1f} to {high * 1e3:.1f} ms)", extra),
                Figure(f"  every = {n}: a step not watched", t["unwatched"], t["plain"]),
                Figure(f"  every = {n}: amortised", amortised, t["plain"], "<= 1.05x", 1.05),
                Figure("  a first watched step (every aten op)", t["every op"], t["plain"]),
            ]
            if not compiled:
                out.append(Figure("  an empty dispatch mode over every op", t["empty"], t["plain"]))
    torch.compiler.reset()
    torch.set_num_threads(threads)
    return out
