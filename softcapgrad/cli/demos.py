"""The gate documents' demonstrations: gate-demo and tether-demo."""

from typing import Annotated, Optional

import typer

from softcapgrad.core.names import GATE_SECTIONS, TETHER_SECTIONS
from softcapgrad.cli.common import (
    emit, InputError, Json, not_with, pick, Plot, Report, sections_option, seed_in_range, Wide
)
from softcapgrad.cli.limits import Bound, SEED

SIZE = "the cost table's sizes"  # the cost section counts, it allocates nothing: any size a model could have


def gate_demo(
    section: sections_option(GATE_SECTIONS) = None,
    seed: Annotated[Optional[int], typer.Option(callback=SEED, help="Seed of the random inputs of backward and laguna "
                                                                    "(0 to 2^63 − 1; default 0).")] = None,
    tokens: Annotated[Optional[list[int]], typer.Option("--tokens", callback=Bound(1, 2**40, SIZE),
                                                        help="Prefill lengths T for the cost table (repeatable; "
                                                             "1 to 2^40).")] = None,
    heads: Annotated[
        Optional[list[int]], typer.Option("--heads", callback=Bound(1, 2**20, SIZE),
                                          help="Query heads of each layer (repeatable, one per layer; 1 to 2^20; "
                                               "default 48).")
    ] = None,
    model_dim: Annotated[Optional[int], typer.Option("--model-dim", callback=Bound(1, 2**24, SIZE),
                                                     help="Model width D (1 to 2^24; default 3072).")] = None,
    kv_heads: Annotated[Optional[int], typer.Option("--kv-heads", callback=Bound(1, 2**20, SIZE),
                                                    help="Key/value heads H_kv (1 to 2^20; default 8).")] = None,
    head_dim: Annotated[Optional[int], typer.Option("--head-dim", callback=Bound(1, 2**20, SIZE),
                                                    help="Channels per head d_h (1 to 2^20; default 128).")] = None,
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
        cfg = Config(D=3072 if model_dim is None else model_dim, H_kv=8 if kv_heads is None else kv_heads,
                     d_h=128 if head_dim is None else head_dim)
        return gate_demo_report(sections, seed_ok, Shape(), cfg, heads or [48], tokens or [1024, 8192, 131072])

    emit(build, json_out, wide, plot, "gate-demo")


def tether_demo(
    section: sections_option(TETHER_SECTIONS) = None,
    seed: Annotated[Optional[int], typer.Option(callback=SEED, help="Seed of the collapse section's toy signal "
                                                                    "(0 to 2^63 − 1; default 0).")] = None,
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
