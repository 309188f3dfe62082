"""The gradient-descent runs of `dynamics`: the bf16 table descent against autograd, the default and the sweep."""

from __future__ import annotations

from benchmarks.timing import Figure, interleaved


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
