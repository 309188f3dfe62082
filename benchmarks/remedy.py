"""softcapgrad.softcap against the eager and the compiled formula: time and backward peak memory."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Callable, Iterator

from benchmarks.timing import Figure, interleaved


# --- the remedy --------------------------------------------------------------------------------


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """File descriptor 2 to /dev/null: the profiler's C++ side prints its start and stop there."""
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def _backward_peak_bytes(f: Callable, x, grad) -> int:
    """Peak bytes the CPU allocator holds during the backward beyond what it held before, from the
    profiler's allocation events (the returned gradient counts; the saved tensors do not)."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    xr = x.detach().requires_grad_(True)
    y = f(xr)
    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        y.backward(grad)
    sizes: list[tuple[int, int]] = []

    def walk(e) -> None:
        if e.tag == _EventType.Allocation:
            sizes.append((e.start_time_ns, e.extra_fields.alloc_size))
        for child in e.children:
            walk(child)

    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root)
    live = peak = 0
    for _, n in sorted(sizes):
        live += n
        peak = max(peak, live)
    return peak


def remedy() -> list[Figure]:
    import warnings

    import torch

    import softcapgrad

    warnings.filterwarnings("ignore")
    gen = torch.Generator().manual_seed(0)
    formula = lambda t: 30.0 * torch.tanh(t / 30.0)  # noqa: E731
    fixed = lambda t: softcapgrad.softcap(t, 30.0)  # noqa: E731

    def fwd_bwd(f, x) -> Callable[[], object]:
        grad = torch.ones_like(x)

        def run() -> object:
            xr = x.detach().requires_grad_(True)
            f(xr).backward(grad)
            return xr.grad

        return run

    out = []
    for shape in ((4096, 4096), (8, 16, 1024, 1024)):
        x = (torch.randn(*shape, generator=gen) * 60).to(torch.bfloat16)
        label = "×".join(map(str, shape))
        t = interleaved({"formula": fwd_bwd(formula, x), "remedy": fwd_bwd(fixed, x)}, repeat=5)
        out.append(Figure(f"softcap fwd+bwd vs 30·tanh(x/30), bf16 {label}", t["remedy"], t["formula"], "<= 1.1x", 1.1))
        del x
    x = (torch.randn(4096, 4096, generator=gen) * 60).to(torch.bfloat16)
    for name, grad in (("ones", torch.ones_like(x)), ("from .sum()", torch.ones((), dtype=x.dtype).expand(x.shape))):
        mine, theirs = _backward_peak_bytes(fixed, x, grad), _backward_peak_bytes(formula, x, grad)
        out.append(Figure(f"softcap backward peak memory vs the formula's (upstream {name}), MiB", mine / 2**20,
                          theirs / 2**20, "<= 1.0x", 1.0, unit="MiB"))
    compiled_formula = torch.compile(formula, fullgraph=True)
    compiled_fixed = torch.compile(fixed, fullgraph=True)
    t0 = time.perf_counter()
    for f in (compiled_formula, compiled_fixed):
        fwd_bwd(f, x)()
    compile_s = time.perf_counter() - t0
    t = interleaved({"formula": fwd_bwd(compiled_formula, x), "remedy": fwd_bwd(compiled_fixed, x)}, repeat=7)
    out.append(Figure(f"compiled softcap fwd+bwd vs compiled formula, bf16 4096×4096 (compiles: {compile_s:.0f} s)",
                      t["remedy"], t["formula"], "<= 1.05x", 1.05))
    v = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    v = v[~v.isnan()]
    with torch.no_grad():
        eager, compiled = formula(v), compiled_fixed(v)
    ulps = (eager.view(torch.int16).int() - compiled.view(torch.int16).int()).abs()
    xe, xc = v.clone().requires_grad_(True), v.clone().requires_grad_(True)
    fixed(xe).sum().backward()
    compiled_fixed(xc).sum().backward()
    out.append(Figure(f"compiled softcap forward ≠ eager: bf16 values differing (of {v.numel():,}; most {int(ulps.max())} ulps; "
                      f"gradients {'identical' if torch.equal(xe.grad, xc.grad) else 'DIFFER'})", int((ulps > 0).sum()), unit="values"))
    return out
