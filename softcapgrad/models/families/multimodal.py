"""Overrides and inputs of the multimodal model types the shrunk defaults do not build or feed (see families/__init__)."""

from __future__ import annotations

from typing import Any, Callable

OVERRIDES: dict[str, dict[str, Any]] = {
    # PaliGemma reads the cap from its text model's config: PaliGemma 2's Gemma 2 text model has one
    "paligemma": {"text_config.model_type": "gemma2"},
}
INPUTS: dict[str, Callable] = {}
