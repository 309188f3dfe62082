"""torch's real backward through a sigmoid or softplus gate: from which input autograd returns exactly 0.

``torch.sigmoid(x)`` and ``torch.nn.functional.softplus(x)`` as user code writes them, eager or under
torch.compile (which may save the output or recompute from x: measured, not assumed), differentiated by
autograd with an upstream gradient g (ones by default; ``--upstream G`` with ``--loss-scale S``: g = G·S in
float64, rounded once to the gate's format, the tensor the backward receives), over every value of the format on
each side of 0; beside each first zero, the law of softcapgrad.laws.gates it is checked against. For g ≠ 1 the
product underflows before σ is stored as 0 or 1, and not always monotonically (fp16, g = 1e-6, x < 0): each row
gives the first zero and the input from which every gradient is 0.
"""

from __future__ import annotations

import math

import numpy as np

from softcapgrad.core.checks import InputError
from softcapgrad.core.report import Report, Table
from softcapgrad.laws import formats
from softcapgrad.laws.gates import gate_point, torch_backward_values
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


def upstream_in(dtype: np.dtype, upstream: float, loss_scale: float = 1.0) -> float:
    """The upstream gradient the gate's backward receives: G·S in float64, rounded once to the gate's format."""
    return float(np.float64(upstream * loss_scale).astype(dtype))


def upstream_checked(dtype: np.dtype, upstream: float, loss_scale: float = 1.0) -> float:
    """upstream_in, refused in one line where G·S rounds to 0 or ∞ in the format (no gradient the backward gets)."""
    g = upstream_in(dtype, upstream, loss_scale)
    if not (0 < g < math.inf):
        raise InputError(f"--upstream {upstream:g} × --loss-scale {loss_scale:g} = {upstream * loss_scale:g} rounds to "
                         f"{g:g} in {dtype.name}: a gradient the gate's backward can receive must be positive and "
                         "finite there")
    return g


def gate_gradient(values: np.ndarray, dtype: np.dtype, fn: str, compiled: bool = False, g: float = 1.0) -> np.ndarray:
    """d/dx of the gate over ``values`` of ``dtype`` by autograd (upstream ``g``, a value of the format, in every
    element), eager or compiled, as float64."""
    import torch

    tdtype = formats.torch_dtype(dtype)
    gate = runners.compile_once(("gate", fn, dtype.name), lambda: gate_formula(fn)) if compiled else gate_formula(fn)

    def run(chunk: np.ndarray) -> np.ndarray:
        x = torch.from_numpy(chunk).to(tdtype).requires_grad_(True)
        with runners._inductor_settings(compiled, None):
            y = gate(x)
            (grad,) = torch.autograd.grad(y, x, torch.full_like(y, g))
        return grad.double().numpy()

    return runners.batched(values, run)


def first_zero(dtype: np.dtype, fn: str, side: str, compiled: bool = False, g: float = 1.0) -> formats.Switch:
    """The first value of the format, going out from 0 on ``side``, whose autograd gradient through the gate is 0
    (and, in its run_start, where the run of zeros up to the format's end begins)."""
    sign = 1.0 if side == "+" else -1.0
    return formats.find_switch(dtype, lambda v: gate_gradient(sign * v.astype(np.float64), dtype, fn, compiled, g) == 0.0)


def law_zero(dtype: np.dtype, fn: str, side: str, g: float) -> formats.Switch:
    """The same switch under torch's formula for upstream g (laws.gates.torch_backward_values)."""
    sign = 1.0 if side == "+" else -1.0
    return formats.find_switch(dtype, lambda v: torch_backward_values(sign * v.astype(np.float64), dtype, fn, g) == 0.0)


def _agrees(measured: float | None, exact: float | None, torch_formula: float | None, g: float = 1.0) -> str:
    if g != 1.0:  # no correctly rounded law for another upstream
        return "torch's formula" if measured == torch_formula else "neither"
    if measured == exact and measured == torch_formula:
        return "both"
    if measured == exact:
        return "the correctly rounded law"
    if measured == torch_formula:
        return "torch's formula"
    return "neither"


def _signed(v: float | None, side: str) -> float | None:
    return None if v is None else (v if side == "+" else -v)


def gate_rows(dtype: np.dtype, fn: str, engines: list[str], no_compiler: str = "", g: float = 1.0) -> list[dict]:
    """Per side and engine: the first input whose gradient is 0, and from which every gradient is 0 (every_zero_from;
    the same where the switch is monotone); the laws beside them: the correctly rounded one (g = 1 only) and torch's
    formula for this g."""
    rows = []
    for side in ("+", "−"):
        key = ZERO_POINT[(fn, side)]
        law = gate_point(dtype, key) if key and g == 1.0 else None
        exact = law.first_input if law else None
        formula = law.torch_formula if law else (_signed(law_zero(dtype, fn, side, g).first_true, side)
                                                 if g != 1.0 else None)
        for engine in engines:
            row = {"fn": fn, "dtype": dtype.name, "side": side, "engine": engine, "upstream": g,
                   "first_zero_grad_input": None, "every_zero_from": None, "monotone": None, "law_exact": exact,
                   "law_torch_formula": formula, "agrees_with": "",
                   "source": "measured", "reason": ""}
            if engine == "compiled" and no_compiler:
                rows.append({**row, "source": "not measured", "reason": no_compiler})
                continue
            switch = first_zero(dtype, fn, side, engine == "compiled", g)
            value = _signed(switch.first_true, side)
            rows.append({**row, "first_zero_grad_input": value, "monotone": switch.monotone if value is not None else None,
                         "every_zero_from": _signed(switch.run_start, side) if value is not None else None,
                         "agrees_with": _agrees(value, exact, formula, g)})
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


def _upstream_answer(rows: list[dict], dtype: np.dtype, fn: str, g: float) -> tuple[str, ...]:
    """For an upstream g ≠ 1: where the product first underflows on each side, and from where every gradient is 0."""
    def side(s: str) -> str:
        def one(r: dict) -> str:
            every = r["every_zero_from"]
            return (f"{_from(r['first_zero_grad_input'])} ({r['engine']}" + (")" if every == r["first_zero_grad_input"]
                    else (f"; not monotone: non-zero again past it, 0 for every input from x = {every:.8g} on)"
                          if every is not None else "; not monotone: non-zero again past it up to the format's end)")))
        return "; ".join(one(r) for r in rows if r["side"] == s and r["source"] == "measured") or "never (not measured)"
    first = (f"In {dtype.name}, with an upstream gradient g = {g:.8g} (in {dtype.name}), autograd's {fn} backward is "
             f"exactly 0 for x > 0 {side('+')}, and for x < 0 {side('−')}.")
    odd = [r for r in rows if r["agrees_with"] == "neither"]
    formula = _values(rows, "law_torch_formula")
    second = (f"torch's formula ({FORMULA[fn]}, times g in the kernel's order) gives {formula} (x > 0, x < 0)"
              + (", as measured." if not odd else "; the measurement differs " +
                 ", ".join(f"{r['engine']} on side {r['side']}" for r in odd) + "."))
    return first, second


def gate_answer(rows: list[dict], dtype: np.dtype, fn: str, g: float = 1.0) -> tuple[str, ...]:
    if g != 1.0:
        return _upstream_answer(rows, dtype, fn, g)
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


def gate_horizon_report(fn: str, dtype: np.dtype, upstream: float = 1.0, loss_scale: float = 1.0,
                        engines: tuple[str, ...] = ENGINES) -> Report:
    """``horizon --fn sigmoid|softplus [--upstream G --loss-scale S]``: the first zero of torch's real backward on each
    side, eager and compiled, for the upstream gradient G·S in the gate's format, against the gate law."""
    no_compiler = runners.cxx_compiler_missing()
    g = upstream_in(dtype, upstream, loss_scale)
    rows = gate_rows(dtype, fn, list(engines), no_compiler, g)
    return Report(
        command="horizon",
        params={"fn": fn, "dtype": dtype.name, "engines": list(engines), "upstream": upstream, "loss_scale": loss_scale,
                "g": g},
        tables=(Table("rows", f"first input whose autograd gradient through torch's {fn} is exactly 0, in {dtype.name}"
                      + (f", upstream g = {g:.8g}" if g != 1.0 else ""),
                      rows, ("side", "engine", "first_zero_grad_input", "every_zero_from", "law_exact",
                             "law_torch_formula", "agrees_with"),
                      wide=("monotone", "upstream", "source", "reason"), digits=9),),
        notes=(
            "first zero-grad input: autograd of torch.sigmoid(x) / torch.nn.functional.softplus(x) over every value of "
            "the format (bisection on the bit patterns for wider ones) going out from 0 on each side, upstream gradient "
            "g in every element (G·S, --upstream times --loss-scale, in float64 rounded once to the format; 1 by "
            "default); every zero from: where the run of zeros up to the format's end begins (the first zero where "
            "the switch is monotone); compiled: torch.compile of the same function (inductor), forward and backward",
            "law exact: the first input of the format where a correctly rounded σ is stored as 1.0 or 0 "
            "(softcapgrad knee --fn " + fn + "); law torch formula: the same with σ = 1/(1 + e^−x) (softplus' "
            "gradient e^x/(e^x + 1), 1 past 20) in float32 (float64 for fp64), rounded once; for g ≠ 1 the law exact "
            "is not given and the torch formula multiplies by g in the kernel's order ((g·(1 − y))·y; g·eˣ/(eˣ + 1); "
            "fp16's sigmoid rounds each product to fp16); — means never",
        ),
        answer=gate_answer(rows, dtype, fn, g),
    )
