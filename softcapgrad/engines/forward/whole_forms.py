"""The whole-model forms an engine judged on its capped run alone may match (the caps swapped, the final cap on
the hidden state, every layer local, GELU's exact form): named on both cap rows, and where the form differs from
transformers only outside the caps, both caps judged on the model as the engine computes it."""

from __future__ import annotations

import numpy as np

from softcapgrad.engines.forward.forms import OUTSIDE
from softcapgrad.engines.forward.judging import SWAPPED, error, log_probs, model_scale, tolerance, top


def name_whole_form(capped: np.ndarray, attention: dict, final: dict, reference, k: int, unit: float,
                once: float) -> None:
    """An engine judged on its capped run alone that differs: the whole-model form it matches (the final cap on
    another tensor, the caps swapped), said on both rows; one that keeps the attention cap makes that applied."""
    tol = tolerance(unit, model_scale(reference), reference.width, once)
    lp = log_probs(capped)
    mask = top(lp, k)
    fits = sorted((error(lp, log_probs(v), mask).value, name) for name, v in reference.final_alternatives.items())
    if not fits or fits[0][0] > tol or final["verdict"] == "applied":
        return
    e, name = fits[0]
    attention.pop("outside", None)  # a named form explains the whole difference, the first token's too
    if name in OUTSIDE:  # another model outside the caps, with both caps applied
        said = f"judged on the model as the engine computes it outside the caps: matches {name} ({e:.2g})"
        final.update(verdict="applied", error=e, hint=said, outside_form=name)
        if attention["verdict"] == "different":
            attention.update(verdict="applied", error=e, hint=said, outside_form=name)
        return
    said = f"matches {name} ({e:.2g})"
    final["hint"] = said if final["verdict"] == "different" else f"{final['hint']}; {said}"
    if final["verdict"] == "different":
        final["fits"] = name  # the answer names the form, not a bare "altered"
    if attention["c"] is None or attention["verdict"] in ("not set", "unused by transformers"):
        return
    if name.startswith(SWAPPED):
        attention.update(verdict="different", hint=said)
    elif attention["verdict"] == "different":
        attention.update(verdict="applied", error=e,
                         hint=f"judged with the final cap as the engine computes it: {said}")
