"""Speed figures (not tests), each a ratio against a baseline measured in the same run.

`make bench` runs every section; `python benchmarks/bench.py startup scan` runs the named ones, and
BENCH_SCAN_MIB=128,512 picks the scan's file sizes (default 128, 512 and 1024 MiB), BENCH_MONITOR_SIZES=tiny
the monitor's models (default tiny,larger) and BENCH_MONITOR_REPEAT=31 its rounds (default 7). A candidate and
its baseline run interleaved (A, B, A, B, ...) and each figure is the median of its runs, so load
from other processes on a shared machine falls on both alike. Every line gives the candidate's
figure, the baseline's, their ratio, the target and whether this run met it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

PY = sys.executable
CLI = str(Path(PY).with_name("softcapgrad"))
ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Figure:
    name: str
    value: float  # seconds, or what ``unit`` says
    baseline: float | None = None  # the same quantity for the baseline, this run
    target: str = ""  # e.g. "<= 1.25x"; a ratio target is checked against value/baseline
    limit: float | None = None  # the number the target compares with
    unit: str = "s"
    higher_is_better: bool = False  # throughput: the ratio is value/baseline and must reach the limit

    @property
    def ratio(self) -> float | None:
        return None if not self.baseline else self.value / self.baseline

    @property
    def met(self) -> bool | None:
        if self.limit is None:
            return None
        measured = self.ratio if "x" in self.target else self.value
        if measured is None:
            return None
        return measured >= self.limit if self.higher_is_better else measured <= self.limit


def interleaved(runs: dict[str, Callable[[], object]], repeat: int, before: Callable[[str], None] | None = None,
                clock: Callable[[], float] = time.perf_counter, samples: dict[str, list[float]] | None = None,
                ) -> dict[str, float]:
    """Median seconds of each callable, run in turn ``repeat`` times; ``before(name)`` runs untimed first.
    ``clock=time.process_time``: this process's CPU seconds, which other processes' load inflates less.
    ``samples``, when given, receives every run's seconds (in round order, for paired differences)."""
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(repeat):
        for name, fn in runs.items():
            if before:
                before(name)
            t0 = clock()
            fn()
            times[name].append(clock() - t0)
    if samples is not None:
        samples.update(times)
    return {k: statistics.median(v) for k, v in times.items()}


def paired_extra(samples: dict[str, list[float]], name: str, baseline: str) -> tuple[float, float, float]:
    """(median, first quartile, third quartile) of ``name``'s seconds minus ``baseline``'s, round by round: the
    candidate's own cost, which a ratio hides where the baseline is slow (bf16 matrix products on a CPU without
    bf16 instructions take most of a step)."""
    extra = [a - b for a, b in zip(samples[name], samples[baseline])]
    low, _, high = statistics.quantiles(extra, n=4) if len(extra) > 1 else (extra[0],) * 3
    return statistics.median(extra), low, high


def command(*args: str) -> Callable[[], None]:
    return lambda: subprocess.run(list(args), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)


def _value(f: Figure) -> str:
    if f.unit == "s":
        return f"{f.value * 1e3:9.1f} ms" if f.value < 10 else f"{f.value:9.2f} s "
    return f"{f.value:9.2f} {f.unit}"


def show(figures: list[Figure]) -> None:
    for f in figures:
        base = "" if f.baseline is None else _value(Figure("", f.baseline, unit=f.unit)).strip()
        ratio = "" if f.ratio is None else f"{f.ratio:6.2f}x"
        verdict = {True: "met", False: "MISSED", None: ""}[f.met]
        print(f"{f.name:<66} {_value(f)}  {base:>12}  {ratio:>7}  {f.target:<14} {verdict}", flush=True)


# --- start-up --------------------------------------------------------------------------------


def _bytecode() -> None:
    """Compile the package's bytecode as pip does on install: with PYTHONDONTWRITEBYTECODE set (as on
    this machine) an editable checkout would otherwise compile every module on every start."""
    subprocess.run([PY, "-m", "compileall", "-q", str(ROOT / "softcapgrad")], check=True)


def startup() -> list[Figure]:
    """--help and the numpy-only commands against importing what every command imports."""
    _bytecode()
    base = "import numpy, ml_dtypes, typer, rich (baseline)"
    runs = {base: command(PY, "-c", "import numpy, ml_dtypes, typer, rich")}
    for args in (["--help"], ["--version"], ["ratchet"], ["knee"]):
        runs[f"softcapgrad {' '.join(args)}"] = command(CLI, *args)
    t = interleaved(runs, repeat=11)
    return [Figure(base, t[base])] + [Figure(k, v, t[base], "<= 1.25x", 1.25) for k, v in t.items() if k != base]


# --- every command with its defaults ---------------------------------------------------------

DEFAULTS = (["identity"], ["ratchet"], ["knee"], ["horizon"], ["dynamics"], ["gate-demo"], ["tether-demo"],
            ["scan", "examples/logits.safetensors"], ["dynamics", "--dtype", "bf16", "--a0", "110", "--backward", "remedy"])


def commands() -> list[Figure]:
    """Each subcommand with its defaults, under 2 s; beside it the floor of any command that needs torch."""
    _bytecode()
    floor = "python -c 'import torch' (floor of the torch commands)"
    runs = {floor: command(PY, "-c", "import torch")}
    runs.update({f"softcapgrad {' '.join(a)}": command(CLI, *a) for a in DEFAULTS})
    t = interleaved(runs, repeat=3)
    tether = "softcapgrad tether-demo"
    return [Figure(floor, t[floor])] + [Figure(k, v, t[floor], "< 2 s", 2.0) for k, v in t.items() if k not in (floor, tether)] \
        + [Figure(tether, t[tether], t[floor], "<= 1.5x", 1.5)]


def reproduce() -> list[Figure]:
    """make reproduce on an installed venv, beside importing what it imports (torch, transformers, jax);
    the committed results must come out unchanged."""
    _bytecode()
    floor = "python -c 'import torch, transformers, jax' (its imports)"
    t = interleaved({floor: command(PY, "-c", "import torch, transformers, jax"),
                     "make reproduce": command("make", "--no-print-directory", "-s", "reproduce")}, repeat=2)
    changed = subprocess.run(["git", "status", "--porcelain", "results"], cwd=ROOT, capture_output=True, text=True).stdout
    note = "results/ unchanged" if not changed.strip() else "results/ CHANGED: " + " ".join(changed.split()[1::2])
    return [Figure(floor, t[floor]), Figure(f"make reproduce ({note}), < 10 s", t["make reproduce"], t[floor], "< 10 s", 10.0)]


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


# --- dynamics ----------------------------------------------------------------------------------


def dynamics() -> list[Figure]:
    import ml_dtypes
    import numpy as np

    from softcapgrad.laws.dynamics import Setting, headline, sweep
    from softcapgrad.laws.lowprecision import Backward, descend_autograd, descend_by_table
    from softcapgrad.training.remedy import softcap

    REMEDY = Backward("remedy", softcap)

    s = Setting(cap=30.0)
    bf16 = np.dtype(ml_dtypes.bfloat16)
    start = np.array([110.0])  # the README's example: about 6,900 steps
    t = interleaved({
        "table": lambda: descend_by_table(start, Setting(cap=30.0, lr=1.0 + 2**-20), True, bf16, REMEDY),  # a fresh table
        "autograd": lambda: descend_autograd(start, s, True, bf16, REMEDY),
    }, repeat=1)
    t_default = interleaved({"default": lambda: headline(40.0, s)}, repeat=3)
    t_sweep = interleaved({"sweep": lambda: sweep([float(x) for x in range(10, 131, 10)], s)}, repeat=1)
    return [
        Figure("bf16 descent from a0 = 110 (remedy): table of every value's step vs autograd per step", t["table"], t["autograd"]),
        Figure("dynamics default (a0 = 40, c = 30, float64), both runs", t_default["default"], None, "< 1 s", 1.0),
        Figure("dynamics sweep a0 = 10..130 (13 starts, float64)", t_sweep["sweep"]),
    ]


# --- scan --------------------------------------------------------------------------------------


_MEMORY_PROBE = """
import sys, threading, tracemalloc
from pathlib import Path
from softcapgrad.files import scan
path = Path(sys.argv[1])
zones = scan.dead_zones(["eager-bf16"], 30.0)
def anon():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssAnon"))
start, peak, stop = anon(), [0], threading.Event()
def sample():
    while not stop.is_set():
        peak[0] = max(peak[0], anon() - start)
        stop.wait(0.002)
thread = threading.Thread(target=sample, daemon=True)
thread.start()
tracemalloc.start()
scan.scan_sources(scan.select(scan.open_sources(path), None, path), 30.0, zones)
traced = tracemalloc.get_traced_memory()[1]
stop.set(); thread.join()
print(peak[0], traced)
"""


def _scan_memory(path: Path) -> tuple[int, int]:
    """In a fresh process, after the imports: the peak of anonymous resident memory (RssAnon, which
    leaves out the mapped file's pages) above its level before the scan, sampled every 2 ms, and
    tracemalloc's peak (Python and numpy allocations), in bytes."""
    out = subprocess.run([PY, "-c", _MEMORY_PROBE, str(path)], check=True, capture_output=True, text=True, cwd=ROOT).stdout
    anon, traced = out.split()
    return int(anon), int(traced)


def _drop_cache(path: Path) -> None:
    """Evict the file from the page cache (posix_fadvise DONTNEED on this file only)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _write_files(folder: Path, mib: int) -> dict[str, Path]:
    """Logits N(0, 40²): float32 .npy and .pt, bfloat16 .safetensors (a checkpoint's format), ``mib`` MiB each."""
    import numpy as np
    import torch
    from safetensors.torch import save_file

    n32 = (mib << 20) // 4
    rng = np.random.default_rng(0)
    npy = folder / f"logits{mib}.npy"
    data = np.lib.format.open_memmap(npy, mode="w+", dtype=np.float32, shape=(n32,))
    for start in range(0, n32, 1 << 24):
        data[start:start + (1 << 24)] = rng.normal(0, 40, min(1 << 24, n32 - start)).astype(np.float32)
    data.flush()
    t = torch.from_numpy(np.asarray(data))
    torch.save({"logits": t}, folder / f"logits{mib}.pt")
    half = torch.empty(2 * n32, dtype=torch.bfloat16)
    half[:n32], half[n32:] = t.to(torch.bfloat16), (-t).to(torch.bfloat16)
    save_file({"weights": half}, str(folder / f"weights{mib}.safetensors"))
    del data, t, half
    return {".npy float32": npy, ".safetensors bfloat16": folder / f"weights{mib}.safetensors",
            ".pt float32": folder / f"logits{mib}.pt"}


def _raw_numpy(path: Path) -> None:
    """The baseline: every value read through the kind's own reader and summed by numpy, one thread."""
    import numpy as np

    def total(a) -> None:
        a = np.asarray(a)
        np.add.reduce(a.view(f"u{a.dtype.itemsize}"), dtype=np.uint64)

    if path.suffix == ".npy":
        m = np.load(path, mmap_mode="r")
        for i in range(0, m.size, 1 << 20):
            total(m[i:i + (1 << 20)])
    elif path.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(path), framework="numpy") as f:
            for k in f.keys():
                part = f.get_slice(k)
                for i in range(0, part.get_shape()[0], 1 << 20):
                    total(part[i:i + (1 << 20)])
    else:
        import torch

        for t in torch.load(path, mmap=True, weights_only=True).values():
            flat = t.reshape(-1)
            for i in range(0, flat.numel(), 1 << 20):
                total(flat[i:i + (1 << 20)].view({2: torch.int16, 4: torch.int32}[t.element_size()]).numpy())


def _raw_torch(path: Path) -> None:
    """A second reference: torch's multi-threaded sum over the kind's reader (none for .npy)."""
    import torch

    if path.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            for k in f.keys():
                f.get_tensor(k).sum()
    elif path.suffix == ".pt":
        for t in torch.load(path, mmap=True, weights_only=True).values():
            t.sum()


def scan() -> list[Figure]:
    from softcapgrad.files import scan as scanning

    sizes = [int(x) for x in os.environ.get("BENCH_SCAN_MIB", "128,512,1024").split(",")]
    zones = scanning.dead_zones(["eager-bf16"], 30.0)

    def run_scan(path: Path) -> None:
        scanning.scan_sources(scanning.select(scanning.open_sources(path), None, path), 30.0, zones)

    out = []
    for mib in sizes:
        folder = Path(tempfile.mkdtemp(prefix="softcapgrad-bench-"))  # the system temporary folder (TMPDIR)
        try:
            for kind, path in _write_files(folder, mib).items():
                size = path.stat().st_size / 1e9  # GB
                runs = {"raw": lambda: _raw_numpy(path), "scan": lambda: run_scan(path)}
                if path.suffix != ".npy":
                    runs["torch"] = lambda: _raw_torch(path)
                _raw_numpy(path)  # warm the page cache
                warm = interleaved(runs, repeat=3)
                cold = interleaved(runs, repeat=3, before=lambda _: _drop_cache(path))
                for mode, t in (("warm", warm), ("cold", cold)):
                    out.append(Figure(f"scan {mib} MiB {kind}, {mode} cache, GB/s vs numpy raw read",
                                      size / t["scan"], size / t["raw"], ">= 0.33x", 1 / 3, "GB/s", True))
                    if "torch" in t:
                        out.append(Figure(f"  the same vs torch's multi-threaded sum", size / t["scan"], size / t["torch"],
                                          unit="GB/s"))
                anon, traced = _scan_memory(path)
                out.append(Figure(f"  scan's own memory, fresh process: peak RssAnon above start (traced {traced / 2**20:.1f})",
                                  anon / 2**20, unit="MiB"))
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    return out


def _child_cpu(args: list[str], repeat: int = 3) -> float:
    """Median CPU seconds (user + system) of a child process running ``args``: on a shared machine the CPU
    a command takes is steadier than its wall-clock time."""
    import resource

    times = []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        times.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(times)


_NUMPY_PASS = "import numpy as np, sys; m = np.load(sys.argv[1], mmap_mode='r'); " \
              "[float(np.abs(m[i:i + (1 << 22)]).max()) for i in range(0, m.size, 1 << 22)]"


def scan_imports() -> list[Figure]:
    """CPU time of `scan` on a 256 MiB float32 .npy, a fresh process each: against a recorded stack (numpy alone:
    no torch is imported) and against the default, live torch-eager-cpu (torch runs it), beside a numpy pass
    over the same file and `import torch` alone."""
    import numpy as np

    folder = Path(tempfile.mkdtemp(prefix="softcapgrad-bench-"))
    try:
        path = folder / "logits256.npy"
        n = (256 << 20) // 4
        data = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n,))
        rng = np.random.default_rng(0)
        for start in range(0, n, 1 << 24):
            data[start:start + (1 << 24)] = rng.normal(0, 40, min(1 << 24, n - start)).astype(np.float32)
        data.flush()
        del data
        cli = [PY, "-m", "softcapgrad", "scan", str(path)]
        floor = _child_cpu([PY, "-c", _NUMPY_PASS, str(path)])
        return [
            Figure("numpy pass over a 256 MiB .npy (CPU time, baseline)", floor),
            Figure("python -c 'import torch' (CPU time)", _child_cpu([PY, "-c", "import torch"])),
            Figure("scan 256 MiB .npy, a recorded stack (no torch), CPU", _child_cpu(
                [*cli, "--path", "torch-eager-cuda"]), floor),
            Figure("scan 256 MiB .npy, default torch-eager-cpu (torch), CPU", _child_cpu(cli), floor),
        ]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# --- stacks ------------------------------------------------------------------------------------


def stacks() -> list[Figure]:
    """horizon --path in a fresh process: torch.compile's graphs come from inductor's on-disk cache once warm."""
    one = [CLI, "horizon", "--cap", "30", "--scores", "bf16", "--path"]
    t = interleaved({"eager": command(*one, "torch-eager-cpu"), "compiled": command(*one, "torch-compile-cpu")}, repeat=3)
    every = interleaved({"all": command(CLI, "horizon", "--path", "all", "--cap", "30", "--cap", "50")}, repeat=1)
    return [
        Figure("horizon --path torch-eager-cpu, bf16, c = 30 (every bf16 value)", t["eager"]),
        Figure("horizon --path torch-compile-cpu, bf16, c = 30 (compile, warm cache), vs eager", t["compiled"], t["eager"]),
        Figure("horizon --path all, c = 30 and 50, bf16 and fp32 (one run)", every["all"]),
    ]


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


def experiment() -> list[Figure]:
    """softcapgrad experiment's phase-2 steps (the bf16-eager arm, its monitor sampled as the design says, the
    hooks at the shift) against a plain transformers training step on the same model and data, without the tool."""
    import torch

    from softcapgrad.experiments import arms, loop, task as tasks
    from softcapgrad.experiments.design import DESIGN

    threads = torch.get_num_threads()
    torch.set_num_threads(DESIGN.threads)
    n = 2 * DESIGN.window  # steps per timed call: the shift, then two windows of sampled steps
    design = DESIGN.with_(phase2_steps=n, recover_probability=2.0)  # never recovers: every call runs n steps
    m = tasks.mapping(design.task, 0)
    arm = arms.build(arms.SPECS["bf16-eager"], design)
    state = {k: v.clone() for k, v in arm.model.state_dict().items()}
    after = torch.from_numpy(m.after)

    def tool() -> object:
        return loop.run_arm(arm, state, design, 0, 1.0, m, 104.0)

    def plain() -> object:
        arm.model.load_state_dict(state)
        opt = torch.optim.AdamW(arm.model.parameters(), lr=design.lr, weight_decay=design.weight_decay)
        for t in range(n):
            x = torch.from_numpy(tasks.batch(design.task, 0, 1, t))
            with torch.autocast("cpu", dtype=torch.bfloat16):
                z = arm.model(input_ids=x).logits
            loss = torch.nn.functional.cross_entropy(z.float().reshape(-1, z.shape[-1]), after[x].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

    tool(), plain()
    t = interleaved({"plain": plain, "tool": tool}, repeat=5)
    torch.set_num_threads(threads)
    return [
        Figure(f"plain transformers step, tiny Gemma 2, bf16 autocast, AdamW ({n} steps / {n})", t["plain"] / n),
        Figure(f"  experiment step: monitor at the shift, then 1 in {DESIGN.monitor_every}, hooks, metrics",
               t["tool"] / n, t["plain"] / n, "<= 1.1x", 1.1),
    ]
def parity() -> list[Figure]:
    """softcapgrad parity on the models make parity runs: CPU seconds (user + system) of each engine's child
    process, conversion included, and of the whole command with its children (wall time on a shared machine
    says little)."""
    import json
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([PY, "-m", "softcapgrad", "parity", "--model-type", "gemma2", "--model-type", "gemma3_text",
                           "--json"], capture_output=True, text=True, cwd=ROOT, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        return [Figure(f"parity failed: {done.stderr.strip()[-120:]}", float("nan"))]
    report = json.loads(done.stdout)
    out = [Figure(f"parity {e['engine']} {e['route']} on {e['model']} (CPU s, conversion included)", e["cpu_s"],
                  None, "<= 60 s", 60.0) for e in report["engines"] if e["cpu_s"] is not None]
    total = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    out.append(Figure("parity, the whole command (CPU s)", total, None, "<= 300 s", 300.0))
    return out


SECTIONS: dict[str, Callable[[], list[Figure]]] = {
    "startup": startup, "commands": commands, "reproduce": reproduce, "remedy": remedy, "tether": tether,
    "dynamics": dynamics, "scan": scan, "scan_imports": scan_imports, "stacks": stacks, "monitor_and_patch": monitor_and_patch,
    "monitor_sampled": monitor_sampled, "experiment": experiment, "parity": parity,
}


def main(names: list[str]) -> None:
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        sys.exit(f"bench: no section {', '.join(unknown)}; sections: {', '.join(SECTIONS)}")
    print(f"{'figure':<66} {'this':>12}  {'baseline':>12}  {'ratio':>7}  {'target':<14}")
    for name in names or list(SECTIONS):
        load = os.getloadavg()[0]
        print(f"--- {name} (load average {load:.2f} on {os.cpu_count()} cores)", flush=True)
        show(SECTIONS[name]())


if __name__ == "__main__":
    main(sys.argv[1:])
