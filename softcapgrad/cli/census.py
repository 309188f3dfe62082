"""census: every soft-cap and gate of the installed transformers, found by running each model type tiny."""

import dataclasses
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from softcapgrad.cli.common import emit, InputError, Json, not_with, pick, Report, result_set, Wide
from softcapgrad.cli.limits import Bound, out_folder, path_given

FILES = ("census.json", "census.md", "figures/census.png")


def _fuller(path: Path, model_types: list[str]) -> bool:
    """The census in ``path`` holds a model type this run leaves out (writing would drop its rows)."""
    import json

    try:
        rows = json.loads(path.read_text(encoding="utf-8"))["rows"]
        return not {r["model_type"] for r in rows} <= set(model_types)
    except (OSError, ValueError, KeyError, TypeError):
        return False  # no census there, or not one this tool wrote: nothing to keep


def refusal_kind(row) -> str:
    from softcapgrad.models.census import refusal_kind as kind

    return kind(row)


def census_report(result, seconds: float, out: Optional[Path], cpu: float | None = None,
                  written: tuple = ()) -> Report:
    """The census as a report; ``written``: the files put in place (none: nothing was written)."""
    from softcapgrad.core.report import Table

    counts = result.counts()
    dead = result.dead()
    kinds = result.refusals()
    answer = (
        f"Of {counts['candidates']} model types whose modeling source calls tanh, softplus or sigmoid, "
        f"{counts['audited']} built and ran tiny: {counts['model types that apply a cap']} apply a tanh soft-cap; "
        f"cap fields dead config: {counts['caps dead config']}, off at their default: {counts['caps off']}; "
        f"{counts['model types with a gate']} have gates ({counts['gate sites']} sites), apart from "
        f"{counts['activation sites (x·σ(αx), not gates)']} activation sites and "
        f"{counts['attention-sink rescales']} attention-sink rescales.",
        f"{counts['not audited']} model types could not be built or run, each a row with its reason"
        + (f" ({'; '.join(f'{k}: {n}' for k, n in kinds.items())})" if kinds else "")
        + f"; the census took {seconds:.0f} s" + (f" ({cpu:.0f} s of CPU)." if cpu is not None else "."),
    )
    return Report(
        command="census",
        params={"implementations": list(result.implementations), "out": str(out) if out else None,
                "transformers": result.transformers, "torch": result.torch},
        tables=(
            Table("counts", "the census", [{"quantity": k, "count": v} for k, v in counts.items()], ("quantity", "count")),
            Table("dead_config", "dead config: set, applied by no implementation",
                  [{"model_type": m, "field": f, "cap": v} for m, f, v in dead], ("model_type", "field", "cap")),
            Table("not_audited", "model types not audited", [
                {"model_type": r.model_type, "status": r.status, "kind": refusal_kind(r), "reason": r.reason}
                for r in result.rows if r.status != "audited"], ("model_type", "status"), wide=("kind", "reason")),
        ),
        notes=(f"written: {', '.join(map(str, written))}" if written else "nothing written (--out none)",
               "every row, cap and gate contract is in census.json and census.md"),
        answer=answer,
    )


def census(
    out: Annotated[Optional[Path], typer.Option(parser=path_given, callback=out_folder, metavar="<path>",
                                                help="Folder for census.json, census.md and figures/census.png "
                                                     "(default results; 'none' writes nothing).")] = Path("results"),
    model_type: Annotated[Optional[list[str]], typer.Option("--model-type", help="Only these model types (repeatable).")] = None,
    attn: Annotated[Optional[list[str]], typer.Option("--attn", help="Attention implementations (repeatable; default "
                                                                    "eager and sdpa).")] = None,
    workers: Annotated[Optional[int], typer.Option(
        callback=Bound(1, 64, "each worker holds its own torch and transformers"),
        help="Processes to share the model types among (1 to 64; default: the CPUs, at most 4); the files are the "
             "same for any number.")] = None,
    force: Annotated[bool, typer.Option("--force", help="With --model-type: write the partial census over a "
                                                      "fuller one in --out.")] = False,
    json_out: Json = False,
    wide: Wide = False,
) -> None:
    """Every soft-cap and gate in the installed transformers, found by running each model type tiny."""

    def build() -> Report:
        import importlib.util

        if importlib.util.find_spec("transformers") is None:
            raise InputError("census needs transformers: pip install 'softcapgrad[hf]'")
        import json

        import torch

        from softcapgrad.core import progress
        from softcapgrad.core.files import check_targets, replace_all
        from softcapgrad.models import audit, census as run

        target = out
        implementations = tuple(pick("--attn", attn, audit.IMPLEMENTATIONS)) if attn else run.IMPLEMENTATIONS
        if not model_type:
            not_with({"--force": force or None}, "without --model-type: a full census always writes its files")
        kept = target is not None and not force and bool(model_type) and _fuller(target / "census.json", model_type)
        if kept:
            target = None  # a partial census never replaces a fuller one without --force
        if target is not None:
            check_targets([target / name for name in FILES], "--out")
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # tiny models: one thread is faster, and the same numbers on every machine
        import os
        import resource

        processes = min(4, os.cpu_count() or 1) if workers is None else workers
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        start, cpu = time.perf_counter(), time.process_time() - children.ru_utime - children.ru_stime
        try:
            total = len(model_type) if model_type else len(run.candidates())
            with progress.task("census: every candidate model type, tiny", total) as advance:
                result = run.census(model_type, implementations, advance=advance, workers=processes)
        finally:
            torch.set_num_threads(threads)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        seconds = time.perf_counter() - start
        cpu = time.process_time() + children.ru_utime + children.ru_stime - cpu  # the workers' CPU time too
        written: list = []
        if target is not None:  # the set is staged whole (the figure too), then put in place together
            from softcapgrad.models.census_figure import census_figure

            written = replace_all(result_set(target, {"census.json": json.dumps(run.as_dict(result), indent=1,
                                                                                  sort_keys=True) + "\n",
                                                      "census.md": run.markdown(result)},
                                             "figures/census.png", lambda: census_figure(result)), target)
        report = census_report(result, seconds, target, cpu, tuple(written))
        if kept:
            said = f"This partial census left the fuller one in {out} in place; --force writes it over that one."
            report = dataclasses.replace(report, answer=(*report.answer, said),
                                         notes=("nothing written (--force writes it)", *report.notes[1:]))
        return report

    emit(build, json_out, wide, command="census")
