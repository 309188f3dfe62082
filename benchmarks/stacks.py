"""horizon --path per stack in a fresh process."""

from __future__ import annotations

from benchmarks.timing import CLI, Figure, command, interleaved


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
