"""The timing every benchmark shares: a figure against its baseline, interleaved runs, a child's CPU time.

A candidate and its baseline run interleaved (A, B, A, B, ...) and each figure is the median of its runs, so
load from other processes on a shared machine falls on both alike. Every line gives the candidate's figure,
the baseline's, their ratio, the target and whether this run met it.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

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


def children_cpu() -> float:
    """CPU seconds (user + system) of this process's finished children: as ``interleaved``'s clock, each run's
    own CPU time, which the load of other processes on a shared machine inflates far less than its wall time."""
    import resource

    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


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


def bytecode() -> None:
    """Compile the package's bytecode as pip does on install: with PYTHONDONTWRITEBYTECODE set (as on
    this machine) an editable checkout would otherwise compile every module on every start."""
    subprocess.run([PY, "-m", "compileall", "-q", str(ROOT / "softcapgrad")], check=True)


def child_cpu(args: list[str], repeat: int = 3, env: Callable[[], dict] | None = None) -> float:
    """Median CPU seconds (user + system) of a child process running ``args``: on a shared machine the CPU
    a command takes is steadier than its wall-clock time. ``env()``, when given, is each run's environment."""
    import resource

    times = []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT,
                       env=env() if env else None)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        times.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(times)
