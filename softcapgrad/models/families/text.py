"""Overrides and inputs of the text model types the shrunk defaults do not build or feed (see families/__init__)."""

from __future__ import annotations

from typing import Any, Callable

OVERRIDES: dict[str, dict[str, Any]] = {
    # transformers' native mLSTM step sizes its state by the value head dim: q/k heads as wide as v heads
    "xlstm": {"qk_dim_factor": 1.0},
    # its decoder layers build an expert router whatever the config says: give it experts (6, top 2, width 128)
    "diffusion_gemma": {"text_config.num_experts": 6, "text_config.top_k_experts": 2,
                        "text_config.moe_intermediate_size": 128},
}
INPUTS: dict[str, Callable] = {}
