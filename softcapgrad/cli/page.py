"""page: the committed results as a static page, one index.html that opens from file://."""

from pathlib import Path
from typing import Annotated

import typer

from softcapgrad.cli.common import emit, Json, Report, Wide
from softcapgrad.cli.limits import out_folder, path_given


def page_report(site, written: tuple) -> Report:
    from softcapgrad.core.report import Table

    lines = [{"engine": line.engine, "stage": line.stage, **{f"{cap} cap": said for cap, said in line.caps},
              "keeps it": line.fix} for line in site.lines]
    return Report(
        command="page",
        params={"files": sorted(site.files)},
        tables=(Table("rows", "cells by tone", [{"tone": t, "cells": n} for t, n in site.counts.items()]),
                Table("engines", "engine by engine", lines, ("engine", "stage", "attention cap", "final cap"),
                      wide=("keeps it",))),
        notes=(f"written: {', '.join(map(str, written)) or 'nothing (--out none)'}",),
        answer=site.answer,
    )


def page(
    results: Annotated[Path, typer.Option(parser=path_given, metavar="<path>",
                                          help="Folder of the results the page is built from.")] = Path("results"),
    out: Annotated[Path | None, typer.Option(
        parser=path_given, callback=out_folder, metavar="<path>",
        help="Folder for index.html ('none': build it, write nothing).")] = Path("results/page"),
    json_out: Json = False,
    wide: Wide = False,
) -> None:
    """The results as a static page: a matrix per model type, a cell per verdict (opens from file://)."""

    def build() -> Report:
        from softcapgrad.core.files import check_targets, replace_all, writable_folder
        from softcapgrad.page import build as build_site

        if out is not None:
            writable_folder(out, "--out")
        site = build_site(results)
        if out is None:
            return page_report(site, ())
        targets = {out / name: text for name, text in site.files.items()}
        check_targets(list(targets), "--out")
        return page_report(site, tuple(replace_all(targets, out)))

    emit(build, json_out, wide, command="page")
