"""Speed figures (not tests), each a ratio against a baseline measured in the same run (benchmarks/timing.py).

`make bench` runs every section but `environments` (run it by name); `python benchmarks/bench.py startup scan`
runs the named ones, and BENCH_SCAN_MIB=128,512 picks the scan's file sizes (default 128, 512 and 1024 MiB),
BENCH_MONITOR_SIZES=tiny the monitor's models (default tiny,larger), BENCH_MONITOR_REPEAT=31 its rounds
(default 7) and BENCH_GATE_REPEAT the gate monitor's (default 61). Each area has a file of its own in this folder; a section is one function of one of them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable

sys.path[0] = str(Path(__file__).resolve().parent.parent)  # the area files import as benchmarks.<area>

from benchmarks import dynamics, experiment, gates, monitor, parity, remedy, scan, stacks, startup, tether  # noqa: E402
from benchmarks.timing import Figure, show  # noqa: E402

SECTIONS: dict[str, Callable[[], list[Figure]]] = {
    "startup": startup.startup, "commands": startup.commands, "reproduce": startup.reproduce,
    "remedy": remedy.remedy, "tether": tether.tether, "tether_patch": tether.tether_patch, "dynamics": dynamics.dynamics, "scan": scan.scan,
    "scan_imports": scan.scan_imports, "stacks": stacks.stacks, "monitor_and_patch": monitor.monitor_and_patch,
    "monitor_sampled": monitor.monitor_sampled, "gate_monitor": gates.gate_monitor, "experiment": experiment.experiment, "parity": parity.parity,
    "environments": parity.environments,
}
ON_REQUEST = ("environments",)  # builds 6 GB of environments from scratch: run by name only


def main(names: list[str]) -> None:
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        sys.exit(f"bench: no section {', '.join(unknown)}; sections: {', '.join(SECTIONS)}")
    print(f"{'figure':<66} {'this':>12}  {'baseline':>12}  {'ratio':>7}  {'target':<14}")
    for name in names or [n for n in SECTIONS if n not in ON_REQUEST]:
        load = os.getloadavg()[0]
        print(f"--- {name} (load average {load:.2f} on {os.cpu_count()} cores)", flush=True)
        show(SECTIONS[name]())


if __name__ == "__main__":
    main(sys.argv[1:])
