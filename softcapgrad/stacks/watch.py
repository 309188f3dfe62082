"""The dead-zone monitor composed with the real-stack table: ``softcapgrad.DeadZoneMonitor``.

softcapgrad.training.monitor counts what a step's tanh and sigmoid do; which input a path's gradient
first dies at is a measurement of that path, kept here (measured live, or recorded on another device).
"""

from __future__ import annotations

from softcapgrad.core.checks import InputError
from softcapgrad.stacks import registry as stacks
from softcapgrad.training import monitor


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
