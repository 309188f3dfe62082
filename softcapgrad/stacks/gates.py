"""torch's real backward through a sigmoid or softplus gate: from which input autograd returns exactly 0.

``torch.sigmoid(x)`` and ``torch.nn.functional.softplus(x)`` as user code writes them, eager or under
torch.compile (which may save the output or recompute from x: measured, not assumed), differentiated by
autograd with an upstream gradient of ones, over every value of the format on each side of 0; beside each
first zero, the law of softcapgrad.laws.gates it is checked against.
"""

from __future__ import annotations

import numpy as np

from softcapgrad.core.report import Report, Table
from softcapgrad.laws import formats
from softcapgrad.laws.gates import gate_point
from softcapgrad.stacks import runners

ENGINES = ("eager", "compiled")
FORMULA = {"sigmoid": "sigmoid as 1/(1 + e^−x)", "softplus": "softplus backward as e^x/(e^x + 1)"}  # torch's CPU kernels' formulas
# per gate and side, the law point whose first input is the first zero of the backward (None: the law has none)
ZERO_POINT = {("sigmoid", "+"): "one", ("sigmoid", "−"): "zero", ("softplus", "+"): None, ("softplus", "−"): "grad_zero"}


def gate_formula(fn: str):
    import torch

    if fn == "sigmoid":
        def gate(x):
            return torch.sigmoid(x)
    else:
        def gate(x):
            return torch.nn.functional.softplus(x)
    return gate


def gate_gradient(values: np.ndarray, dtype: np.dtype, fn: str, compiled: bool = False) -> np.ndarray:
    """d/dx of the gate over ``values`` of ``dtype`` by autograd (upstream ones), eager or compiled, as float64."""
    import torch

    tdtype = formats.torch_dtype(dtype)
    gate = runners.compile_once(("gate", fn, dtype.name), lambda: gate_formula(fn)) if compiled else gate_formula(fn)

    def run(chunk: np.ndarray) -> np.ndarray:
        x = torch.from_numpy(chunk).to(tdtype).requires_grad_(True)
        with runners._inductor_settings(compiled, None):
            y = gate(x)
            (g,) = torch.autograd.grad(y, x, torch.ones_like(y))
        return g.double().numpy()

    return runners.batched(values, run)


def first_zero(dtype: np.dtype, fn: str, side: str, compiled: bool = False) -> formats.Switch:
    """The first value of the format, going out from 0 on ``side``, whose autograd gradient through the gate is 0."""
    sign = 1.0 if side == "+" else -1.0
    return formats.find_switch(dtype, lambda v: gate_gradient(sign * v.astype(np.float64), dtype, fn, compiled) == 0.0)


def _agrees(measured: float | None, exact: float | None, torch_formula: float | None) -> str:
    if measured == exact and measured == torch_formula:
        return "both"
    if measured == exact:
        return "the correctly rounded law"
    if measured == torch_formula:
        return "torch's formula"
    return "neither"


def gate_rows(dtype: np.dtype, fn: str, engines: list[str], no_compiler: str = "") -> list[dict]:
    rows = []
    for side in ("+", "−"):
        key = ZERO_POINT[(fn, side)]
        law = gate_point(dtype, key) if key else None
        exact, formula = (law.first_input, law.torch_formula) if law else (None, None)
        for engine in engines:
            row = {"fn": fn, "dtype": dtype.name, "side": side, "engine": engine, "first_zero_grad_input": None,
                   "monotone": None, "law_exact": exact, "law_torch_formula": formula, "agrees_with": "",
                   "source": "measured", "reason": ""}
            if engine == "compiled" and no_compiler:
                rows.append({**row, "source": "not measured", "reason": no_compiler})
                continue
            switch = first_zero(dtype, fn, side, engine == "compiled")
            value = None if switch.first_true is None else (switch.first_true if side == "+" else -switch.first_true)
            rows.append({**row, "first_zero_grad_input": value, "monotone": switch.monotone if value is not None else None,
                         "agrees_with": _agrees(value, exact, formula)})
    return rows


def _from(v: float | None) -> str:
    return "never" if v is None else f"from x = {v:.8g}"


def _at(rows: list[dict], side: str) -> str:
    """Where the measured rows of one side first return 0, the engines that agree named together."""
    mine = [r for r in rows if r["side"] == side and r["source"] == "measured"]
    values = list(dict.fromkeys(r["first_zero_grad_input"] for r in mine))
    if len(values) == 1:
        return f"{_from(values[0])} ({' and '.join(r['engine'] for r in mine)})"
    return "; ".join(f"{_from(r['first_zero_grad_input'])} ({r['engine']})" for r in mine)


def _values(rows: list[dict], key: str) -> str:
    first = {r["side"]: r[key] for r in rows}
    return ", ".join("never" if first[s] is None else f"{first[s]:.8g}" for s in ("+", "−"))


def gate_answer(rows: list[dict], dtype: np.dtype, fn: str) -> tuple[str, ...]:
    verdicts = sorted({r["agrees_with"] for r in rows if r["source"] == "measured"})
    if fn == "sigmoid":
        first = (f"In {dtype.name}, autograd's sigmoid backward σ(1 − σ), read from the stored output, is exactly 0 "
                 f"{_at(rows, '+')}, where σ is stored as 1.0 (a gate stuck open), and on the negative side "
                 f"{_at(rows, '−')}, where it is stored as 0 (stuck shut).")
    else:
        one = gate_point(dtype, "grad_one").first_input
        first = (f"In {dtype.name}, autograd's softplus backward is exactly 0 on the negative side {_at(rows, '−')}, "
                 f"where σ(x) rounds to 0, and {_at(rows, '+')} for x > 0; a correctly rounded σ(x) is exactly 1.0 "
                 f"from x = {one:.8g}.")
    exact, formula = _values(rows, "law_exact"), _values(rows, "law_torch_formula")
    torch_way = f"{FORMULA[fn]} in {'float64' if dtype.itemsize >= 8 else 'float32'}, rounded once"
    odd = [r for r in rows if r["agrees_with"] == "neither"]
    if verdicts == ["both"]:
        second = f"A correctly rounded {fn} gives the same ({exact}; x > 0, x < 0), and so does torch, which computes its {torch_way}."
    elif not odd:
        second = (f"A correctly rounded {fn} would give {exact} (x > 0, x < 0); torch computes {torch_way}, which "
                  f"gives {formula}, as measured.")
    else:
        second = (f"A correctly rounded {fn} gives {exact} (x > 0, x < 0), torch's {FORMULA[fn].split(' as ')[0]} {formula}; the "
                  "measurement differs from both " + ", ".join(f"{r['engine']} on side {r['side']}" for r in odd) + ".")
    return first, second


def gate_horizon_report(fn: str, dtype: np.dtype) -> Report:
    """``horizon --fn sigmoid|softplus``: the first zero of torch's real backward on each side, eager and compiled,
    against the gate law."""
    no_compiler = runners.cxx_compiler_missing()
    rows = gate_rows(dtype, fn, list(ENGINES), no_compiler)
    return Report(
        command="horizon",
        params={"fn": fn, "dtype": dtype.name, "engines": list(ENGINES)},
        tables=(Table("rows", f"first input whose autograd gradient through torch's {fn} is exactly 0, in {dtype.name}",
                      rows, ("side", "engine", "first_zero_grad_input", "law_exact", "law_torch_formula", "agrees_with"),
                      wide=("monotone", "source", "reason"), digits=9),),
        notes=(
            "first zero-grad input: autograd of torch.sigmoid(x) / torch.nn.functional.softplus(x) over every value of "
            "the format (bisection on the bit patterns for wider ones) going out from 0 on each side, upstream gradient "
            "of ones; compiled: torch.compile of the same function (inductor), forward and backward",
            "law exact: the first input of the format where a correctly rounded σ is stored as 1.0 or 0 "
            "(softcapgrad knee --fn " + fn + "); law torch formula: the same with σ = 1/(1 + e^−x) (softplus' "
            "gradient e^x/(e^x + 1), 1 past 20) in float32 (float64 for fp64), rounded once; — means never",
        ),
        answer=gate_answer(rows, dtype, fn),
    )
