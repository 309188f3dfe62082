"""The real stacks' knees as rows of the knee table (laws.knee.BackendKnee): the composition of the
format-level knee search with the stacks' registry, handed to ``knee_report`` as its ``stack_knee``."""

from __future__ import annotations

import numpy as np

from softcapgrad.laws.knee import BackendKnee
from softcapgrad.stacks import registry as stacks


def stack_knee(dtype: np.dtype, backend: str, caps: list[float], fn: str = "tanh") -> BackendKnee:
    """A real stack's knee as a knee row: live where it runs here, else recorded, else not measured."""
    stack = stacks.STACKS[backend]
    if dtype.name not in stack.formats:
        return BackendKnee(dtype.name, backend, fn, False, source="not measured",
                           reason=f"{backend} takes {', '.join(stack.formats)}")
    r = stacks.knee(backend, dtype.name, fn)
    found = r.source != "not measured"
    return BackendKnee(
        dtype=dtype.name, backend=backend, fn=fn, supported=found, first_saturating_input=r.value,
        monotone=r.monotone, method=r.reason if found else "", reason="" if found else r.reason,
        horizons=[{"cap": c, "horizon": None if r.value is None else c * r.value} for c in caps],
        saturated_run_start=r.saturated_run_start, source=r.source,
    )
