"""The dead-zone monitor composed with the real-stack table: ``softcapgrad.DeadZoneMonitor``.

softcapgrad.training.monitor counts what a step's tanh and sigmoid do; which input a path's gradient
first dies at is a measurement of that path, kept here (measured live, or recorded on another device).
"""

from __future__ import annotations

import functools

from softcapgrad.core.checks import InputError
from softcapgrad.stacks import registry as stacks
from softcapgrad.training import gatehealth, monitor


def first_zero(path: str, scores: str, c: float, fn: str = "tanh"):
    """The first zero-gradient input of ``c·tanh(a/c)`` (of ``σ(x)`` for ``fn="sigmoid"``) on a real stack.

    From ``softcapgrad.stacks`` (measured here, or recorded on another device); a ``StackResult``
    with ``source="not measured"`` where the table has no such stack or format.
    """
    name = path if fn == "tanh" else f"{path}-sigmoid"
    if name not in stacks.STACKS:
        return stacks.StackResult(name, scores, c, None, None, "not measured", f"the real-stack table has no {name}")
    sigmoid = stacks.Sigmoid(m=1.0, s=1.0) if fn == "sigmoid" else stacks.Sigmoid()
    try:
        return stacks.first_zero(name, scores, c, sigmoid)
    except InputError as err:  # a format the stack does not take
        return stacks.StackResult(name, scores, c, None, None, "not measured", str(err))


class DeadZoneMonitor(monitor.DeadZoneMonitor):
    __doc__ = monitor.DeadZoneMonitor.__doc__

    def __init__(self, keep_inputs: bool = False, first_zero: monitor.FirstZeroLookup = first_zero, **options) -> None:
        super().__init__(keep_inputs, first_zero, **options)


def gate_first_zero(fn: str, dtype: str, device: str, upstream: float = 1.0):
    """Where autograd's gradient through torch's eager ``fn`` is exactly 0 in ``dtype`` under the upstream gradient
    ``upstream`` (rounded once to the format, as ``horizon --upstream`` takes it): stuck open, stuck shut, each the
    input from which every gradient on that side is 0.

    Measured on this CPU (softcapgrad.stacks.gates, every value of the format); a softmax router's depends on
    its whole row, and another device's gate stacks are not measured here."""
    from softcapgrad.laws import formats
    from softcapgrad.stacks import gates
    from softcapgrad.training.gatehealth import GateZero

    if fn not in ("sigmoid", "softplus"):
        return GateZero(None, None, "no single input: a softmax's gradient depends on its whole row")
    if device != "cpu":
        return GateZero(None, None, f"not measured: the gate stacks are measured on the CPU, this ran on {device}")
    g = gates.upstream_in(formats.resolve(dtype), upstream)
    if not 0 < g < float("inf"):
        return GateZero(None, None, f"not measured: an upstream gradient of {upstream!r} is {g!r} in {dtype}")
    return GateZero(*_gate_zero(fn, dtype, g), f"measured: torch eager CPU (softcapgrad horizon --fn {fn} --dtype "
                    f"{dtype}" + (f" --upstream {g!r})" if g != 1.0 else ")"))


@functools.cache
def _gate_zero(fn: str, dtype: str, g: float = 1.0) -> tuple[float | None, float | None]:
    from softcapgrad.laws import formats
    from softcapgrad.stacks import gates

    np_dtype = formats.resolve(dtype)
    ends = []
    for side in ("+", "−"):
        start = gates.first_zero(np_dtype, fn, side, g=g).run_start  # every gradient 0 from there (for g ≠ 1 the
        ends.append(None if start is None else start if side == "+" else -start)  # first zero may be isolated)
    return ends[0], ends[1]


class GateMonitor(gatehealth.GateMonitor):
    __doc__ = gatehealth.GateMonitor.__doc__

    def __init__(self, first_zero: gatehealth.GateZeroLookup = gate_first_zero, **options) -> None:
        super().__init__(first_zero, **options)
