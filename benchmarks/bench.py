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
REPEAT = 5


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
    t = wall([PY, "-m", "softcapgrad", "reproduce", "--out", "/tmp/softcapgrad-bench"], repeat=1)
    return [("softcapgrad reproduce (whole ledger)", t, "target < 15 s")]


SECTIONS: list[Callable[[], list[tuple[str, float, str]]]] = [cold_starts, reproduce]


def main() -> None:
    for section in SECTIONS:
        for name, seconds, note in section():
            print(f"{name:<60} {seconds * 1000:10.1f} ms  {note}")


if __name__ == "__main__":
    main()
