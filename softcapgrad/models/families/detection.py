"""Overrides and inputs of the detection model types the shrunk defaults do not build or feed (see families/__init__)."""

from __future__ import annotations

from typing import Any, Callable

OVERRIDES: dict[str, dict[str, Any]] = {}
INPUTS: dict[str, Callable] = {}
