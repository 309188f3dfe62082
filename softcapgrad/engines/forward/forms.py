"""The final-cap forms an engine might compute instead of c·tanh(a/c), on the engine's own pre-cap logits a.

Each takes a (float64) and c and returns what the engine would give: the cap in bf16 or fp16 (every step
rounded to the format), a hard clip, x/√(1+x²), x·tanh(x/c), the cap applied twice. ``verdict`` names the
one an engine's output fits.
"""

from __future__ import annotations

import numpy as np


def _round(x: np.ndarray, fmt: str) -> np.ndarray:
    import ml_dtypes

    kind = {"bf16": ml_dtypes.bfloat16, "fp16": np.float16}[fmt]
    return np.asarray(x, dtype=np.float32).astype(kind).astype(np.float64)


def cap_in(fmt: str):
    """c·tanh(a/c) with a, a/c, the tanh and the product each rounded to ``fmt``."""
    def f(a, c):
        x = _round(_round(a, fmt) / _round(np.float64(c), fmt), fmt)
        return _round(_round(np.tanh(x), fmt) * _round(np.float64(c), fmt), fmt)
    return f


ALTERNATIVES = {  # final-cap forms an engine might compute instead, on the engine's own a (float64)
    "the cap computed in bf16": cap_in("bf16"),
    "the cap computed in fp16": cap_in("fp16"),
    "a hard clip to [-c, c]": lambda a, c: np.clip(a, -c, c),
    "c·x/sqrt(1+x²) instead of tanh": lambda a, c: a / np.sqrt(1 + (a / c) ** 2),
    "x·tanh(x/c) instead of c·tanh(x/c)": lambda a, c: a * np.tanh(a / c),
    "the cap applied twice": lambda a, c: exact_cap(exact_cap(a, c), c),
}
ALTERNATIVE_UNITS = {"the cap computed in bf16": 2.0 ** -8, "the cap computed in fp16": 2.0 ** -11}

# Whole-model forms that differ from transformers outside the caps (engines/forward/alternatives.py plants them): a row
# that matches one is judged on the model as the engine computes it, with the cap's verdict the form implies.
EXACT_GELU = "GELU's exact erf form in place of its tanh approximation"
EXACT_GELU_DROPPED = EXACT_GELU + ", the attention cap dropped"
EXACT_GELU_WINDOWLESS = EXACT_GELU + ", the sliding window and the attention cap both dropped"
OUTSIDE = {EXACT_GELU: "applied", EXACT_GELU_DROPPED: "ignored", EXACT_GELU_WINDOWLESS: "different"}


def exact_cap(a: np.ndarray, c: float) -> np.ndarray:
    return c * np.tanh(np.asarray(a, dtype=np.float64) / c)
