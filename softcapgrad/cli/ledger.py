"""The ledger: reproduce (every document number, checked, and the figures)."""

from pathlib import Path
from typing import Annotated, Optional

import typer

from softcapgrad.cli.common import emit, Json, not_with, Report, Wide
from softcapgrad.cli.limits import out_folder, path_given


def reproduce(
    out: Annotated[Optional[Path], typer.Option(parser=path_given, callback=out_folder, metavar="<path>",
                                                help="Folder for claims.json, claims.md and figures/ (default "
                                                     "results; 'none' writes nothing).")] = Path("results"),
    only: Annotated[Optional[str], typer.Option(help="Regular expression on claim ids: recompute only those.")] = None,
    figures: Annotated[Optional[bool], typer.Option("--figures/--no-figures", help="Also write figures/ (default yes; needs the 'plot' extra).")] = None,
    force: Annotated[bool, typer.Option("--force", help="With --only: write the partial ledger over the full one.")] = False,
    json_out: Json = False,
    wide: Wide = False,
) -> None:
    """Recompute every document number; write the ledger and figures; exit 1 if a verdict changed."""

    def build() -> Report:
        from softcapgrad.ledger.verdicts import reproduce_run

        if out is None:
            not_with({"--figures": figures or None}, "with --out none: nothing is written")
        if only is None:
            not_with({"--force": force or None}, "without --only: a full run always writes the ledger")
        else:
            not_with({"--figures": figures or None}, "with --only: figures are drawn from the full ledger's runs")
        return reproduce_run(out, only, figures is not False, force)

    emit(build, json_out, wide, command="reproduce")
