"""The real stacks: stacks (the table, or a new recording on a CUDA machine)."""

from pathlib import Path
from typing import Annotated, Optional

import typer

from softcapgrad.cli.common import emit, Json, not_with, Report, Wide
from softcapgrad.cli.laws import LossScale, Upstream
from softcapgrad.cli.limits import path_given


def stacks(
    record: Annotated[
        Optional[Path],
        typer.Option("--record", parser=path_given, metavar="<path>", help="Measure every CUDA stack on this machine's GPU and write the recording to "
                                      "this JSON file (needs CUDA)."),
    ] = None,
    upstream: Upstream = None,
    loss_scale: LossScale = None,
    json_out: Json = False,
    wide: Wide = False,
) -> None:
    """The real stacks: what each computes, and whether its figures are measured here or recorded."""

    def build() -> Report:
        if record is not None:
            not_with({"--upstream": upstream, "--loss-scale": loss_scale}, "with --record: a recording is of the "
                                                                           "caps' stacks")
            from softcapgrad.core.files import writable_target
            from softcapgrad.models.record import record_report

            return record_report(writable_target(record, "--record"))
        from softcapgrad.stacks.reports import stacks_report

        return stacks_report(1.0 if upstream is None else upstream, 1.0 if loss_scale is None else loss_scale)

    emit(build, json_out, wide, command="stacks")
