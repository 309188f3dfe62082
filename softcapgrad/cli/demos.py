"""The gate documents' demonstrations: gate-demo and tether-demo."""

from typing import Annotated, Optional

import typer

from softcapgrad.core.names import GATE_SECTIONS, TETHER_SECTIONS
from softcapgrad.cli.common import (
    bounded, emit, InputError, Json, not_with, pick, Plot, Report, sections_option, seed_in_range, Wide
)


def gate_demo(
    section: sections_option(GATE_SECTIONS) = None,
    seed: Annotated[Optional[int], typer.Option(help="Seed of the random inputs of backward and laguna (0 to 2^63 − 1; default 0).")] = None,
    tokens: Annotated[Optional[list[int]], typer.Option("--tokens", help="Prefill lengths T for the cost table (repeatable).")] = None,
    heads: Annotated[
        Optional[list[int]], typer.Option("--heads", help="Query heads of each layer (repeatable, one per layer; default 48).")
    ] = None,
    model_dim: Annotated[Optional[int], typer.Option("--model-dim", help="Model width D (default 3072).")] = None,
    kv_heads: Annotated[Optional[int], typer.Option("--kv-heads", help="Key/value heads H_kv (default 8).")] = None,
    head_dim: Annotated[Optional[int], typer.Option("--head-dim", help="Channels per head d_h (default 128).")] = None,
    json_out: Json = False,
    wide: Wide = False,
    plot: Plot = None,
) -> None:
    """Softmax (competition) vs softplus (independence), their backward laws, and the Laguna per-head gate."""

    def build() -> Report:
        from softcapgrad.demos.gates import Config, Shape, gate_demo_report

        sections = pick("--section", section, GATE_SECTIONS)
        if plot is not None and "competition" not in sections:
            raise InputError("--plot draws the competition section; add --section competition")
        if "cost" not in sections:
            not_with({"--tokens": tokens, "--heads": heads, "--model-dim": model_dim, "--kv-heads": kv_heads,
                      "--head-dim": head_dim}, "without --section cost")
        if not {"backward", "laguna"} & set(sections):
            not_with({"--seed": seed}, "without --section backward or laguna")
        seed_ok = seed_in_range(seed)
        layer_heads = [bounded("--heads", h, 1, 2**20) for h in heads or [48]]
        lengths = [bounded("--tokens", t, 1, 2**40) for t in tokens or [1024, 8192, 131072]]
        cfg = Config(D=bounded("--model-dim", 3072 if model_dim is None else model_dim, 1, 2**24),
                     H_kv=bounded("--kv-heads", 8 if kv_heads is None else kv_heads, 1, 2**20),
                     d_h=bounded("--head-dim", 128 if head_dim is None else head_dim, 1, 2**20))
        return gate_demo_report(sections, seed_ok, Shape(), cfg, layer_heads, lengths)

    emit(build, json_out, wide, plot, "gate-demo")


def tether_demo(
    section: sections_option(TETHER_SECTIONS) = None,
    seed: Annotated[Optional[int], typer.Option(help="Seed of the collapse section's toy signal (0 to 2^63 − 1; default 0).")] = None,
    json_out: Json = False,
    wide: Wide = False,
    plot: Plot = None,
) -> None:
    """Does TetherGate hold a gate open that a plain learned gate lets collapse; where does θ settle."""

    def build() -> Report:
        from softcapgrad.demos.tether_demo import tether_demo_report

        sections = pick("--section", section, TETHER_SECTIONS)
        if plot is not None and not {"collapse", "wd"} <= set(sections):
            raise InputError("--plot draws the collapse and wd sections; include both")
        if "collapse" not in sections:
            not_with({"--seed": seed}, "without --section collapse")
        return tether_demo_report(sections, seed_in_range(seed), curve=plot is not None)

    emit(build, json_out, wide, plot, "tether-demo")
