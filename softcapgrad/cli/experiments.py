"""experiment: does the bf16 dead zone change training, and does the patch buy anything back?"""

import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from softcapgrad.cli.common import emit, InputError, Json, one_of, pick, Report, Wide
from softcapgrad.experiments.design import ARMS as ARM_NAMES

FILES = ("experiment.json", "experiment.md", "figures/experiment.png")
MAX_DEPTH = 1e28



def _design(quick: bool, seeds: Optional[int], steps: Optional[int], arms: Optional[list[str]],
            depths: Optional[list[float]], shifts: Optional[list[str]] = None):
    from softcapgrad.core.checks import at_least, positive
    from softcapgrad.experiments.design import DESIGN, QUICK, SHIFTS

    design = QUICK if quick else DESIGN
    changes: dict = {}
    if seeds is not None:
        changes["seeds"] = tuple(range(at_least("--seeds", seeds, 1)))
    if steps is not None:
        changes["phase2_steps"] = at_least("--steps", steps, 1)
    if arms:
        changes["arms"] = tuple(pick("--arm", arms, ARM_NAMES))
    if depths:
        changes["depths"] = changes["band_depths"] = tuple(sorted({_depth(positive("--depth", d)) for d in depths}))
    if shifts:
        changes["shifts"] = tuple(s for s in SHIFTS if s in set(pick("--shift", shifts, SHIFTS)))
    if steps is not None or arms or depths or shifts:  # a partial comparison: no SGD setting, no long run
        changes.update(sgd_seeds=(), natural_steps=0)
    return design.with_(**changes) if changes else design


def _depth(d: float) -> float:
    """A depth whose largest pre-cap logit (d × the bf16 horizon, about 104) is far inside fp32's range."""
    from softcapgrad.core.checks import InputError

    if d > MAX_DEPTH:
        raise InputError(f"--depth must be at most {MAX_DEPTH:g} (a largest pre-cap logit near 1e30, past which "
                         f"scaled weights and their products overflow fp32 and bf16), got {d:g}")
    return d


def _full(target: Path) -> bool:
    """Whether ``target`` holds the results of a full default run (not --quick, every seed, arm, depth and shift)."""
    import json

    from softcapgrad.experiments.design import DESIGN, TINY

    try:
        res = json.loads((target / "experiment.json").read_text())
        d = res["design"]
        return (res["quick"] is False and res["model"] == TINY
                and tuple(d["seeds"]) == DESIGN.seeds and tuple(d["arms"]) == DESIGN.arms
                and tuple(d["depths"]) == DESIGN.depths and tuple(d.get("shifts", ())) == DESIGN.shifts)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def experiment(
    quick: Annotated[bool, typer.Option("--quick", help="The same design with fewer seeds, depths and steps, "
                                                        "without the compiled arm (under a minute).")] = False,
    seeds: Annotated[Optional[int], typer.Option("--seeds", help="Number of seeds, at least 1 (seeds 0 to N − 1; "
                                                                 "default 24, --quick 2).")] = None,
    steps: Annotated[Optional[int], typer.Option("--steps", help="Most steps after the shift, at least 1 (default "
                                                                 "200, --quick 100).")] = None,
    arm: Annotated[Optional[list[str]], typer.Option("--arm", help=f"Arms (repeatable): {one_of(ARM_NAMES)}, or all.")] = None,
    depth: Annotated[Optional[list[float]], typer.Option("--depth", help="Depths past the bf16 horizon, > 0 and "
                                                                         "at most 1e28 (repeatable; default 0.5 1.1 "
                                                                         "1.25 1.5 2 4).")] = None,
    shift: Annotated[Optional[list[str]], typer.Option("--shift", help="Shifts (repeatable): rotation, band.")] = None,
    model: Annotated[Optional[Path], typer.Option("--model", help="A saved transformers model with caps "
                                                                  "(safetensors): the same measurement on it.")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Folder for experiment.json, experiment.md and "
                                                     "figures/experiment.png (default results; 'none' writes "
                                                     "nothing).")] = Path("results"),
    force: Annotated[bool, typer.Option("--force", help="Let a --quick or partial run replace the full run's "
                                                        "results in --out.")] = False,
    json_out: Json = False,
    wide: Wide = False,
) -> None:
    """Does the bf16 dead zone cost training steps, and does the patch buy them back? (tiny Gemma 2, label shift)"""

    def build() -> Report:
        import importlib.util

        from softcapgrad.experiments.design import DESIGN

        design = _design(quick, seeds, steps, arm, depth, shift)
        if importlib.util.find_spec("transformers") is None:
            raise InputError("experiment needs transformers: pip install 'softcapgrad[hf]'")
        from softcapgrad.core.files import check_targets, replace_all, writable_folder

        target = None if out is not None and str(out).lower() == "none" else out
        if target is not None:
            writable_folder(target, "--out")
            check_targets([target / f for f in FILES], "--out")
            if (design != DESIGN or model is not None) and not force and _full(target):
                raise InputError(f"--out {target} holds the full run's results; a --quick or partial run does not "
                                 "replace them: pass --force, or another --out")
        base = initial = None
        name = ""
        if model is not None:
            from softcapgrad.experiments.model_dir import load

            design, base, initial, name = load(model, design)
        import json
        import resource

        from softcapgrad.experiments import report, runner

        wall = time.perf_counter()
        cpu = _cpu(resource)
        measured = runner.measure(design, base, initial, name)
        res = report.results(measured)
        wall, cpu = time.perf_counter() - wall, _cpu(resource) - cpu
        note = [f"the run took {wall:.0f} s wall and {cpu:.0f} s CPU (user + system, this process and its compile "
                "workers)"]
        if target is not None:
            files: dict = {target / "experiment.json": json.dumps(res, indent=1, sort_keys=True) + "\n",
                           target / "experiment.md": report.markdown(res, design)}
            try:
                from softcapgrad.core.plot import png_bytes
                from softcapgrad.experiments.figure import experiment_figure

                files[target / "figures" / "experiment.png"] = png_bytes(experiment_figure(res))
            except InputError:
                note.append("matplotlib is not installed: no figure drawn")
            written = replace_all(files, target)
            note.append("written: " + ", ".join(str(p) for p in written))
        else:
            note.append("nothing written (--out none)")
        return report.experiment_report(res, tuple(note))

    emit(build, json_out, wide, command="experiment")


def _cpu(resource) -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
