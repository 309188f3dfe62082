"""softcapgrad parity's engines: CPU seconds per engine child and for the whole command."""

from __future__ import annotations

import os
import subprocess

from benchmarks.timing import PY, ROOT, Figure


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
