"""parity-releases: which transformers releases leave Gemma 2's attention cap out at their default attention.

A command of its own rather than an option of ``parity``: it builds a light environment per release (not the engine
environments parity lists), runs one engine on one model type, and answers in release ranges, not in rows per engine.
"""

from pathlib import Path
from typing import Annotated, Optional

import typer

from softcapgrad.cli.common import emit, InputError, Json, one_torch_thread, Report, Wide
from softcapgrad.cli.limits import Bound, out_folder, path_given

FILES = ("default-attention.json", "default-attention.md")


def releases_report(data: dict, said: tuple, written: tuple = ()) -> Report:
    from softcapgrad.core.report import Table

    rows = [{k: r.get(k) for k in ("release", "attention", "verdict", "to_capped", "to_attention_off",
                                    "eager_verdict", "reason")} for r in data["rows"]]
    return Report(
        command="parity-releases",
        params={"releases": data["releases"], "method": data["method"]},
        tables=(Table("ranges", "ranges of releases", data["ranges"],
                      ("first", "last", "releases", "measured", "attention", "verdict")),
                Table("rows", "releases run", rows, ("release", "attention", "verdict", "to_capped",
                                                     "to_attention_off", "eager_verdict"), wide=("reason",)),
                Table("dependents", "projects that pin their own transformers",
                      [{"project": d["project"], "admits": d["admits"],
                        "falls": "; ".join(f"{f['first']}..{f['last']} {f['verdict']}" for f in d["falls"])}
                       for d in data["dependents"]], ("project", "falls"), wide=("admits",))),
        notes=((f"assumption: {data['assumption']}",) if data["assumption"] else ())
        + (f"written: {', '.join(map(str, written))}" if written else "nothing written (--out none)",),
        answer=said,
    )


def _say(line: str) -> None:
    typer.echo(f"softcapgrad parity-releases: {line}", err=True)


def parity_releases(
    release: Annotated[Optional[list[str]], typer.Option(
        "--release", help="Releases to walk (repeatable; default every release from 4.51.0 to "
                          "5.25.0).")] = None,
    every: Annotated[bool, typer.Option("--every", help="Run every release instead of bisecting.")] = False,
    timeout: Annotated[float, typer.Option(callback=Bound(1.0, 3600.0, "seconds each release's route may take"),
                                           help="Seconds each route of a release may take (1 to 3600).")] = 300.0,
    out: Annotated[Optional[Path], typer.Option(parser=path_given, callback=out_folder, metavar="<path>",
                                                help="Folder for default-attention.json and .md (default results; "
                                                     "'none' writes nothing).")] = Path("results"),
    json_out: Json = False,
    wide: Wide = False,
) -> None:
    """transformers' default attention on Gemma 2, release by release: which ranges drop the attention cap."""

    def build() -> Report:
        import importlib.util

        from softcapgrad.engines.releases import releases

        given = [releases.listed(v) for v in release or ()]  # a release it cannot walk: one line, before any work
        if importlib.util.find_spec("transformers") is None:
            raise InputError("parity-releases needs transformers: pip install 'softcapgrad[hf]'")
        import json

        from softcapgrad.core.files import check_targets, replace_all, writable_folder
        from softcapgrad.engines.releases import releases
        from softcapgrad.engines.forward import runner

        from packaging.version import Version

        versions = sorted(set(given or releases.RELEASES), key=Version)  # a bisection walks them in order
        target = out
        if target is not None:
            writable_folder(target, "--out")
            check_targets([target / name for name in FILES], "--out")
        with one_torch_thread(), runner.terminations():
            data = releases.walk(versions, every, 16, 0, timeout, _say)
        said = releases.answer(data)
        written: list = []
        if target is not None:
            text = json.dumps({**data, "answer": list(said)}, indent=1, sort_keys=True) + "\n"
            written = replace_all({target / FILES[0]: text, target / FILES[1]: releases.markdown(data, said)},
                                  target)
        return releases_report(data, said, tuple(written))

    emit(build, json_out, wide, command="parity-releases")
