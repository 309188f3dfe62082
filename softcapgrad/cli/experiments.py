"""experiment: does the bf16 dead zone change training, and does the patch buy anything back?"""

import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from softcapgrad.core.names import (EXPERIMENT_ARMS as ARM_NAMES, EXPERIMENT_BUDGET_STEPS as BUDGET_STEPS,
                                   EXPERIMENT_STEP_SECONDS as STEP_SECONDS)
from softcapgrad.cli.common import emit, InputError, Json, one_of, pick, PROG, Report, result_set, Wide
from softcapgrad.cli.limits import Bound, out_folder, path_given

FILES = ("experiment.json", "experiment.md", "figures/experiment.png")
MAX_DEPTH = 1e28  # a largest pre-cap logit near 1e30, past which scaled weights and their products overflow fp32 and bf16
LONG_S = 60  # a run estimated longer says so on stderr before it starts
Force = Annotated[bool, typer.Option("--force", help="Let a --quick or partial run replace the full run's results "
                                                    "in --out.")]
BUDGET = (f"at most {BUDGET_STEPS:,} training steps in all (seeds × arms × depths × steps), about "
          f"{BUDGET_STEPS * STEP_SECONDS / 3600:.0f} h here")


def _design(quick: bool, seeds: Optional[int], steps: Optional[int], arms: Optional[list[str]],
            depths: Optional[list[float]], shifts: Optional[list[str]] = None):
    from softcapgrad.experiments.design import DESIGN, QUICK, SHIFTS

    design = QUICK if quick else DESIGN
    changes: dict = {}
    if seeds is not None:
        changes["seeds"] = tuple(range(seeds))
        changes["sgd_seeds"] = tuple(s for s in design.sgd_seeds if s < seeds)  # SGD reuses those seeds' phase 1
    if steps is not None:
        changes["phase2_steps"] = steps
    if arms:
        changes["arms"] = tuple(pick("--arm", arms, ARM_NAMES))
    if depths:
        changes["depths"] = changes["band_depths"] = tuple(sorted(set(depths)))
    if shifts:
        changes["shifts"] = tuple(s for s in SHIFTS if s in set(pick("--shift", shifts, SHIFTS)))
    if steps is not None or arms or depths or shifts:  # a partial comparison: no SGD setting, no long run
        changes.update(sgd_seeds=(), natural_steps=0)
    return design.with_(**changes) if changes else design


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
    seeds: Annotated[Optional[int], typer.Option("--seeds", callback=Bound(1, 10_000, BUDGET),
                                                 help="Number of seeds, at least 1 and at most 10,000 (seeds 0 to N − 1; "
                                                      f"default 24, --quick 2); {BUDGET}.")] = None,
    steps: Annotated[Optional[int], typer.Option("--steps", callback=Bound(1, 1_000_000, BUDGET),
                                                 help="Most steps after the shift, at least 1 and at most 1,000,000 "
                                                      f"(default 200, --quick 100); {BUDGET}.")] = None,
    arm: Annotated[Optional[list[str]], typer.Option("--arm", help=f"Arms (repeatable): {one_of(ARM_NAMES)}, or all.")] = None,
    depth: Annotated[Optional[list[float]], typer.Option(
        "--depth", callback=Bound(0.0, MAX_DEPTH, "a depth times the bf16 horizon (about 104) must stay far "
                                                  "inside fp32's range", lo_open=True),
        help="Depths past the bf16 horizon, > 0 and at most 1e28 (repeatable; default 0.5 1.1 1.25 1.5 2 4).")] = None,
    shift: Annotated[Optional[list[str]], typer.Option("--shift", help="Shifts (repeatable): rotation, band.")] = None,
    model: Annotated[Optional[Path], typer.Option("--model", parser=path_given, metavar="<path>", help="A saved transformers model with caps "
                                                                  "(safetensors): the same measurement on it.")] = None,
    out: Annotated[Optional[Path], typer.Option(parser=path_given, callback=out_folder, metavar="<path>",
                                                help="Folder for experiment.json, experiment.md and "
                                                     "figures/experiment.png (default results; 'none' writes "
                                                     "nothing).")] = Path("results"),
    force: Force = False,
    json_out: Json = False,
    wide: Wide = False,
) -> None:
    """Does the bf16 dead zone cost training steps, and does the patch buy them back? (tiny Gemma 2, label shift)"""

    def build() -> Report:
        import importlib.util

        from softcapgrad.experiments.design import DESIGN, within_budget

        design = _design(quick, seeds, steps, arm, depth, shift)
        most, seconds = within_budget(design, "--seeds × --arm × --depth × --steps")
        if importlib.util.find_spec("transformers") is None:
            raise InputError("experiment needs transformers: pip install 'softcapgrad[hf]'")
        from softcapgrad.core.files import check_targets, replace_all, writable_folder

        target = out
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

        if seconds >= LONG_S:  # on stderr, so that --json stays one object; a terminal shows the bar as well
            took = f"{seconds / 3600:.1f} h" if seconds >= 7200 else f"{seconds / 60:.0f} min"
            typer.echo(f"{PROG}: experiment: at most {most:,} training steps, about {took} here "
                       f"({STEP_SECONDS * 1000:g} ms a step)", err=True)

        wall = time.perf_counter()
        cpu = _cpu(resource)
        measured = runner.measure(design, base, initial, name)
        res = report.results(measured)
        wall, cpu = time.perf_counter() - wall, _cpu(resource) - cpu
        note = [f"the run took {wall:.0f} s wall and {cpu:.0f} s CPU (user + system, this process and its compile "
                "workers)"]
        if target is not None:
            from softcapgrad.experiments.figure import experiment_figure

            files = result_set(target, {"experiment.json": json.dumps(res, indent=1, sort_keys=True) + "\n",
                                        "experiment.md": report.markdown(res, design)},
                               "figures/experiment.png", lambda: experiment_figure(res))
            if target / "figures" / "experiment.png" not in files:
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


TETHER_SCENARIOS = ("train-all", "gates-only")  # tether_design.SCENARIOS, without importing it here
TETHER_BUDGET = f"at most {BUDGET_STEPS:,} training steps in all (seeds × arms × steps)"


def tether_experiment(
    quick: Annotated[bool, typer.Option("--quick", help="The same design with 2 seeds and fewer steps (under a "
                                                        "minute).")] = False,
    scenario: Annotated[str, typer.Option("--scenario", help="train-all (every weight trains in phase A; "
                                                             "results/tether-experiment.*) or gates-only (phase A "
                                                             "trains the gates alone; results/tether-collapse.*)."
                                          )] = "train-all",
    seeds: Annotated[Optional[int], typer.Option("--seeds", callback=Bound(1, 10_000, TETHER_BUDGET),
                                                 help="Number of seeds, 1 to 10,000 (seeds 0 to N − 1; default 24, "
                                                      f"--quick 2); {TETHER_BUDGET}.")] = None,
    steps: Annotated[Optional[int], typer.Option("--steps", callback=Bound(1, 1_000_000, TETHER_BUDGET),
                                                 help="Most steps after the switch, 1 to 1,000,000 (default 200, "
                                                      f"--quick 60); {TETHER_BUDGET}.")] = None,
    out: Annotated[Optional[Path], typer.Option(parser=path_given, callback=out_folder, metavar="<path>",
                                                help="Folder for the scenario's .json, .md and figure (default "
                                                     "results; 'none' writes nothing).")] = Path("results"),
    force: Force = False,
    json_out: Json = False,
    wide: Wide = False,
) -> None:
    """Does the TetherGate patch keep a model's gates open while its branch is useless, and recover sooner after?"""

    def build() -> Report:
        import importlib.util

        from softcapgrad.experiments.tether_design import FILE_STEM, SCENARIOS, STEP_SECONDS as STEP_S, within_budget

        if scenario not in SCENARIOS:
            raise InputError(f"--scenario {scenario}: not a scenario; {one_of(tuple(SCENARIOS))}")
        full, short = SCENARIOS[scenario]
        stem = FILE_STEM[scenario]
        names = (f"{stem}.json", f"{stem}.md", f"figures/{stem}.png")
        design = short if quick else full
        if seeds is not None:
            design = design.with_(seeds=tuple(range(seeds)))
        if steps is not None:
            design = design.with_(steps_b=steps)
        most, seconds = within_budget(design, "--seeds × --steps")
        if importlib.util.find_spec("transformers") is None:
            raise InputError("tether-experiment needs transformers: pip install 'softcapgrad[hf]'")
        from softcapgrad.core.files import check_targets, replace_all, writable_folder

        target = out
        if target is not None:
            writable_folder(target, "--out")
            check_targets([target / f for f in names], "--out")
            if design != full and not force and _tether_full(target / names[0], full):
                raise InputError(f"--out {target} holds the full run's results; a --quick or partial run does not "
                                 "replace them: pass --force, or another --out")
        import json
        import resource

        from softcapgrad.experiments import tether_report as report

        if seconds >= LONG_S:
            typer.echo(f"{PROG}: tether-experiment: at most {most:,} training steps, about {seconds / 60:.0f} min "
                       f"here ({STEP_S * 1000:g} ms a step)", err=True)
        wall, cpu = time.perf_counter(), _cpu(resource)
        runs = report.measure(design)
        if not report.finite(runs):
            raise InputError("a loss became NaN or infinite: no verdict is given from it")
        res = report.results(runs, design)
        wall, cpu = time.perf_counter() - wall, _cpu(resource) - cpu
        note = [f"the run took {wall:.0f} s wall and {cpu:.0f} s CPU"]
        if target is not None:
            files = result_set(target, {names[0]: json.dumps(res, indent=1, sort_keys=True) + "\n",
                                        names[1]: report.markdown(res, design)}, names[2], lambda: report.figure(res))
            if target / names[2] not in files:
                note.append("matplotlib is not installed: no figure drawn")
            note.append("written: " + ", ".join(str(p) for p in replace_all(files, target)))
        else:
            note.append("nothing written (--out none)")
        return report.tether_report(res, tuple(note))

    emit(build, json_out, wide, command="tether-experiment")


def _tether_full(path: Path, full) -> bool:
    """Whether ``path`` holds a full run of the scenario whose full design is ``full``."""
    import json

    try:
        res = json.loads(path.read_text())
        return res["quick"] is False and tuple(res["design"]["seeds"]) == full.seeds and \
            res["design"]["steps_b"] == full.steps_b
    except (OSError, ValueError, KeyError, TypeError):
        return False
