"""Start-up and whole commands: --help and the numpy-only commands against their imports, every command with
its defaults against `import torch`, and make reproduce against its imports."""

from __future__ import annotations

import subprocess

from benchmarks.timing import CLI, PY, ROOT, Figure, bytecode, children_cpu, command, interleaved


# --- start-up --------------------------------------------------------------------------------


def startup() -> list[Figure]:
    """--help and the numpy-only commands against importing what every command imports: CPU time (user +
    system) of each child, medians of 31 interleaved runs."""
    bytecode()
    base = "import numpy, ml_dtypes, typer, rich (baseline, CPU time)"
    runs = {base: command(PY, "-c", "import numpy, ml_dtypes, typer, rich")}
    for args in (["--help"], ["--version"], ["ratchet"], ["knee", "--dtype", "bf16", "--cap", "30"]):
        runs[f"softcapgrad {' '.join(args)}"] = command(CLI, *args)
    t = interleaved(runs, repeat=31, clock=children_cpu)
    return [Figure(base, t[base])] + [Figure(k, v, t[base], "<= 1.1x", 1.1) for k, v in t.items() if k != base]


# --- every command with its defaults ---------------------------------------------------------

DEFAULTS = (["identity"], ["ratchet"], ["knee"], ["horizon"], ["dynamics"], ["gate-demo"], ["tether-demo"],
            ["scan", "examples/logits.safetensors"], ["dynamics", "--dtype", "bf16", "--a0", "110", "--backward", "remedy"])


def commands() -> list[Figure]:
    """Each subcommand with its defaults, under 2 s; beside it the floor of any command that needs torch."""
    bytecode()
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
    bytecode()
    floor = "python -c 'import torch, transformers, jax' (its imports)"
    t = interleaved({floor: command(PY, "-c", "import torch, transformers, jax"),
                     "make reproduce": command("make", "--no-print-directory", "-s", "reproduce")}, repeat=2)
    changed = subprocess.run(["git", "status", "--porcelain", "results"], cwd=ROOT, capture_output=True, text=True).stdout
    note = "results/ unchanged" if not changed.strip() else "results/ CHANGED: " + " ".join(changed.split()[1::2])
    return [Figure(floor, t[floor]), Figure(f"make reproduce ({note}), < 10 s", t["make reproduce"], t[floor], "< 10 s", 10.0)]
