"""Is an engine's model one model? A route with a finding loads its capped folder a second time, in a child of its
own, and compares the two runs' log-probabilities: a model that changes from load to load (an uninitialised
buffer, a random draw at load time) gets no cap verdict, *not deterministic*, whatever the first run showed."""

from __future__ import annotations

import numpy as np

from softcapgrad.engines.forward.verdict import FP32, _nonfinite, error, log_probs, model_scale, tolerance

NOT_DETERMINISTIC = "not deterministic"
FINDINGS = ("different", "ignored", "not finite", "ignores the folder's caps")  # verdicts a second load re-checks


def reloaded(rows: list[dict], first, second, reason: str | None, reference, info: dict, unit: float = FP32,
             once: float = 0.0) -> list[dict]:
    """The rows of a route whose capped folder was loaded twice, by two children (``first`` and ``second``, the
    second child's ``reason`` where it gave nothing): where the two runs' log-probabilities differ by more than
    the whole-model tolerance (in the route's format) the engine's model is not one model, and no row is a cap's
    verdict; else ``info`` records how far apart they were, and the rows stand."""
    if first is None or second is None or np.shape(first) != np.shape(second):
        info["second_load"] = f"not compared: {reason or 'no capped logits'}"
        return rows
    if _nonfinite(first) or _nonfinite(second):
        apart = 0.0 if np.array_equal(first, second, equal_nan=True) else float("inf")
    else:
        apart = error(log_probs(first), log_probs(second)).value
    info["second_load"] = apart
    tol = tolerance(unit, model_scale(reference), reference.width, once)
    if apart <= tol:
        return rows
    said = (f"the same folder loaded twice gives log-probs {apart:.3g} apart (beyond the whole-model tolerance "
            f"{tol:.3g}): the engine's model changes from load to load, so no cap verdict is given")
    return [dict(r, verdict=NOT_DETERMINISTIC, hint=said) if r["verdict"] != "not set" else r for r in rows]
