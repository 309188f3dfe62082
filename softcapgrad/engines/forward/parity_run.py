"""Running parity's engines: every model's reference first, then each engine's children, side by side.

The references are cheap (tiny models, about 0.1 s of CPU each, measured) and are all built before any engine starts. An
engine's work is then cut into tasks: each group of routes its adapter lets share a process
(catalog.processes) on a chunk of the models, at most as many as the adapter's ``MODELS_PER_PROCESS`` literal
allows (one where it says nothing), so that what a child pays once (starting, importing the engine, its
compiler's first warm-up) is paid once per chunk and not per model. ``jobs`` tasks run at a time, the largest
first (routes times models); the rows come out in catalog order whatever the order they ran in.
"""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from softcapgrad.core import child
from softcapgrad.engines.forward import catalog, conditioning, determinism, runner, verdict
from softcapgrad.engines.forward import reference as ref
from softcapgrad.engines.forward.parity import FOLDERS, Parity, _prepare, recorded, variants


@dataclass(frozen=True)
class Model:
    result: Parity  # its reference, and the rows and engine records as they are collected
    work: Path  # its input folders (the engines' WORKs are prepared from them)
    keep: Path | None  # parity --repro: where its outputs are kept


def measure_all(sources: list, engines: list, states: dict, seq_len: int, seed: int, timeout: float,
                advance=None, jobs: int = 1, inputs: dict | None = None) -> list[Parity]:
    """Every route of every engine on each model of ``sources`` ((label, source, keep) triples); ``states`` maps an
    environment to its State (None: absent). ``keep``: a new folder that receives the model folders, the token ids
    and each route's outputs (parity --repro). ``inputs``: label -> folder.Inputs of each model folder."""
    from concurrent.futures import ThreadPoolExecutor

    runner.clear_stop()
    done: dict = {}  # (model index, engine, route id) -> (rows, info)
    with contextlib.ExitStack() as folders, ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        try:
            models = []
            for label, src, keep in sources:
                work = folders.enter_context(child.scratch("softcapgrad-parity-"))  # a killed run's: cleared later
                models.append(Model(_prepared(src, seq_len, seed, work, label, keep, (inputs or {}).get(label)),
                                    work, keep))
            tasks = []
            for engine in engines:
                tasks += _tasks(engine, states.get(engine.environment), models, timeout, done, advance)
            tasks.sort(key=lambda task: -task[0])  # the largest first; sorted() keeps catalog order among equals
            for future in [pool.submit(task[1]) for task in tasks]:
                future.result()
        except BaseException:  # Ctrl-C, SIGTERM: no engine starts, those running are killed; the folders go last
            pool.shutdown(wait=False, cancel_futures=True)
            runner.stop_all()
            raise
    return [_collected(i, m.result, engines, done) for i, m in enumerate(models)]


def _prepared(src, seq_len: int, seed: int, work: Path, label: str, keep: Path | None, inputs=None) -> Parity:
    """The model's reference and conditioning, its input folders under ``work`` (and copied to ``keep``)."""
    reference, model, ids = _prepare(src, seq_len, seed, work, inputs)
    result = Parity(label, reference, kept=keep, conditioning=conditioning.measure(model, ids, reference, label),
                    inputs=inputs)
    if keep is not None:
        (keep / "model").mkdir(parents=True)
        for name in ["ids.npy", *(FOLDERS[v] for v in variants(reference))]:
            (shutil.copytree if (work / name).is_dir() else shutil.copy2)(work / name, keep / "model" / name)
    return result


def _collected(index: int, result: Parity, engines: list, done: dict) -> Parity:
    """The model's rows and engine records, in catalog order."""
    for engine in engines:
        for route in engine.routes:
            rows, info = done[(index, engine.name, route.id)]
            for row in rows:
                row.update(engine=engine.name, route=route.id, model=result.model,
                           reach=result.reference.reach.get(row["cap"]), generation=ref.GENERATION)
            result.rows.extend(rows)
            result.engines.append({**info, "model": result.model, "generation": ref.GENERATION})
    return result


def _tasks(engine, state, models: list, timeout: float, done: dict, advance) -> list:
    """(size, callable) for each child the engine needs; the models it cannot run get their rows now."""
    runnable = []
    for i, model in enumerate(models):
        refused = _refused(engine, state, model.result.reference)
        if refused is None:
            runnable.append(i)
            continue
        for route in engine.routes:
            rows, why = refused
            done[(i, engine.name, route.id)] = ([dict(r) for r in rows], {**_info(engine, route, state), "reason": why})
            if advance:
                advance()
    size = max(1, catalog.models_per_process(engine))
    chunks = [runnable[k:k + size] for k in range(0, len(runnable), size)]
    return [(len(group) * len(chunk), _task(engine, group, state, [(i, models[i]) for i in chunk], timeout, done,
                                            advance))
            for group in catalog.processes(engine) for chunk in chunks]


def _task(engine, group: tuple, state, chunk: list, timeout: float, done: dict, advance):
    def run() -> None:
        by_argument = {route.adapter_route: route for route in engine.routes}
        name = by_argument[group[0]].id
        items = [(m.work / f"run-{engine.name}-{name}", m.work, [FOLDERS[v] for v in variants(m.result.reference)])
                 for _, m in chunk]
        outcomes = runner.run_copied_batch(state.python, engine.adapter, list(group), items, timeout)
        for (i, model), got in zip(chunk, outcomes):
            for argument, outcome in got.items():
                route = by_argument[argument]
                done[(i, engine.name, route.id)] = _checked(engine, route, state, model, timeout, outcome)
                if advance:
                    advance()
    return run


def _refused(engine, state, reference) -> tuple[list, str] | None:
    """The rows and reason of a model the engine cannot run (not its architecture, or no environment); None if it
    can."""
    if engine.types is not None and reference.model_type not in engine.types:
        why = f"{engine.name} converts {', '.join(engine.types)}, not {reference.model_type}"
        return verdict.no_architecture(reference, why), why
    if state is None or state.state != "installed":
        why = "not installed" if state is None else f"{state.state} {state.reason}".strip()
        why = f"environment {engine.environment} {why}: softcapgrad engines install {engine.name}"
        return verdict.could_not_run(reference, why), why
    return None


def route_rows(engine, route, state, reference, work: Path, timeout: float) -> tuple[list, dict]:
    """One route of the engine on one model (its input folders under ``work``), in a child of its own."""
    refused = _refused(engine, state, reference)
    if refused is not None:
        return refused[0], {**_info(engine, route, state), "reason": refused[1]}
    outcome = runner.run_copied(state.python, engine.adapter, route.adapter_route, work / f"run-{engine.name}-"
                                f"{route.id}", work, [FOLDERS[v] for v in variants(reference)], timeout)
    return _checked(engine, route, state, Model(Parity(reference.model_type, reference), work, None), timeout, outcome)


def _info(engine, route, state) -> dict:
    return {"engine": engine.name, "route": route.id, "how": route.text, "precision": route.precision,
            "environment": engine.environment, "versions": dict(state.versions) if state else {},
            "did": "", "cpu_s": None, "wall_s": None, "reason": None, "failed": {}}


def _checked(engine, route, state, model: Model, timeout: float, outcome) -> tuple[list, dict]:
    """A route's rows; where one is a finding, the model loaded again in a new child and compared."""
    reference, tmp = model.result.reference, model.work
    rows, info = _judged(engine, route, reference, outcome, _info(engine, route, state), model.keep)
    if not any(r["verdict"] in determinism.FINDINGS for r in rows):
        return rows, info
    again = runner.run_copied(state.python, engine.adapter, route.adapter_route, tmp / f"again-{engine.name}-"
                              f"{route.id}", tmp, [FOLDERS["capped"]], timeout)  # a new child loads it once more
    return determinism.reloaded(rows, outcome.logits.get(FOLDERS["capped"]), again.logits.get(FOLDERS["capped"]),
                                again.reason, reference, info, _as_judged(route, info).unit, route.once), info


def _keep_outputs(kept: Path | None, engine, route, outcome) -> None:
    """A route's outputs, as the engine gave them, for its reproduction bundle (parity --repro)."""
    if kept is None:
        return
    folder = kept / "outputs" / f"{engine.name}--{route.id}"
    folder.mkdir(parents=True)
    for name, values in outcome.logits.items():
        np.save(folder / f"{name}.npy", values, allow_pickle=False)
    (folder / "output.txt").write_text(str(outcome.info.get("output", "logits")), encoding="utf-8")


def _as_judged(route, info: dict):
    """The route with the precision its child reported."""
    return catalog.Route(route.id, route.text, info["precision"], route.argument, route.once)


def _judged(engine, route, reference, outcome, info: dict, kept: Path | None) -> tuple[list, dict]:
    """The rows of one route's outcome."""
    recorded(info, outcome, route.precision)
    _keep_outputs(kept, engine, route, outcome)
    if outcome.no_architecture:
        return verdict.no_architecture(reference, outcome.reason), info
    if outcome.reason:
        return verdict.could_not_run(reference, outcome.reason), info
    logits = {v: outcome.logits[FOLDERS[v]] for v in variants(reference) if FOLDERS[v] in outcome.logits}
    failed = {v: str(outcome.info["failed"][FOLDERS[v]]) for v in variants(reference)
              if FOLDERS[v] in (outcome.info.get("failed") or {})}
    info["failed"] = failed
    shape = reference.logits["capped"].shape
    wrong = [v.shape for v in logits.values() if v.shape != shape]
    if wrong:
        info["reason"] = f"logits of shape {wrong[0]}, expected {shape}"
        return verdict.could_not_run(reference, info["reason"]), info
    judged = _as_judged(route, info)
    output = str(outcome.info.get("output", "logits"))
    return verdict.verdicts(logits, reference, judged.once, judged.top_k, judged.unit, failed, output), info
