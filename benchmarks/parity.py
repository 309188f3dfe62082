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


SUITE_ENVIRONMENTS = ("transformers-4", "transformers-5.0", "kerashub")  # the ones the test suite builds


def environments() -> list[Figure]:
    """The three engine environments the test suite needs, built one after another and then side by side
    (environments.start, as the suite's conftest does), each time into a fresh temporary cache that is removed
    after: wall seconds, and the builds' CPU seconds. About 3 GB of disk per build; not in the default run."""
    import resource
    import shutil
    import tempfile
    import time
    from pathlib import Path

    from softcapgrad.engines.environments import environments as envs

    def once(side_by_side: bool) -> tuple[float, float]:
        root = Path(tempfile.mkdtemp(prefix="softcapgrad-bench-environments-"))
        try:
            before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
            if side_by_side:
                for build in envs.start(SUITE_ENVIRONMENTS, root).values():
                    build.result()
            else:
                for name in SUITE_ENVIRONMENTS:
                    envs.ready(name, True, root)
            wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
            return wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
        finally:
            shutil.rmtree(root, ignore_errors=True)

    one_by_one, together = once(False), once(True)
    return [Figure("3 engine environments one after another (wall s)", one_by_one[0]),
            Figure("the same side by side (wall s; baseline: one after another)", together[0], one_by_one[0]),
            Figure("their CPU s, one after another", one_by_one[1]),
            Figure("their CPU s, side by side", together[1], one_by_one[1])]
