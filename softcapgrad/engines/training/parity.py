"""One training check run: each route's training step on parity's tiny models, a verdict per cap, and each route's
first zeros of the caps' gradients.

``measure`` builds the model and its float64 references (engines/training/reference.py), writes the
folder the routes load (``capped``) and the folders that push the caps' inputs past the horizons
(engines/training/zeros.py), runs every route's adapter in its environment's interpreter (engines/forward/runner.py:
isolated, time-limited, a crash or hang is a reason), judges the capped step (engines/training/verdict.py) and
reads each step's first zeros (engines/training/zeros.py).
"""

from __future__ import annotations

import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path

from softcapgrad.core import child
from softcapgrad.engines.forward import catalog, runner
from softcapgrad.engines.forward.parity import recorded
from softcapgrad.engines.training import folder, reference as tr, signature, verdict as tv, watch
from softcapgrad.engines.training.routes import (  # noqa: F401
    ADAPTER, ADAPTERS, AXOLOTL_ROUTES, EASYDEL_ROUTES, ENGINES, FUSED_ROUTES, GEMMA_JAX_ROUTES, KERAS_ROUTES, LIBRARIES,
    LIBRARY_ROUTES, LIT_ROUTES, MLX_ROUTES, PENZAI_ROUTES, ROUTES, ROUTES_OF, TRAINER_ROUTES, TUNE_ROUTES,
    UNSLOTH_RL_ROUTES, UNSLOTH_ROUTES, _short, routes,
)
from softcapgrad.engines.training.zeros import (  # noqa: F401
    ATTENTION_ADAPTERS, ATTENTION_FOLDER, CAP_STACK, FORMATS, HIDDEN_NOTE, NO_ZERO, ROW_SPAN, ROWS, ROWS_FOLDER, STACK,
    SWEEP, HeadRows, _attention_zero, _no_zero, _rows_readable, attention_folder, first_zero, first_zero_attention,
    row_folder, rows_first_zero, stack_agreement, stacks_within, sweep_folders, upstream_agreement,
)

TIMES = ("cpu_s", "wall_s")
_JUDGING = threading.Lock()


@dataclass(frozen=True)
class TrainParity:
    model: str
    reference: object  # training.reference.TrainReference
    rows: list = field(default_factory=list)
    routes: list = field(default_factory=list)  # one per engine and route: how, versions, times, reason
    inputs: str = ""  # a saved model's (train-parity DIR): where its token ids came from


def _info(engine: str, route, state) -> dict:
    return {"engine": engine, "route": route.id, "how": route.text, "precision": route.precision,
            "environment": ENGINES[engine], "versions": dict(state.versions) if state else {}, "did": "",
            "cpu_s": None, "wall_s": None, "reason": None}


def _route(engine: str, route, state, reference, tmp: Path, folders: list[str], timeout: float):
    info = _info(engine, route, state)
    if state is None or state.state != "installed":
        why = "not installed" if state is None else f"{state.state} {state.reason}".strip()
        info["reason"] = f"environment {ENGINES[engine]} {why} (train-parity --install --engine {engine} builds it)"
        return tv.could_not_run(reference, info["reason"]), {}, info
    used = [f for f in folders if f != ATTENTION_FOLDER or ADAPTERS.get(engine, ADAPTER) in ATTENTION_ADAPTERS]
    work = runner.prepare(tmp / f"run-{engine}-{route.id}", tmp, used)
    try:
        outcome = runner.run(state.python, ADAPTERS.get(engine, ADAPTER), route.id, work, used, timeout)
        steps, unread = {}, {}
        for name in used:
            path = work / "out" / route.id / f"{name}.npz"
            if outcome.reason is None and path.exists():
                why = tr.readable(path)
                if why:
                    unread[name] = why
                else:
                    steps[name] = tr.read_step(path)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    recorded(info, outcome, route.precision)
    if outcome.no_architecture:
        return tv.could_not_run(reference, outcome.reason, tv.NO_ARCHITECTURE), {}, info
    failed = {**(outcome.info.get("failed") or {}), **unread}
    if failed:
        info["variants_failed"] = failed  # a sweep or rows folder that did not run: no first zero from it
    if outcome.reason or "capped" not in steps:
        info["reason"] = outcome.reason or failed.get("capped", "no step written")
        return tv.could_not_run(reference, info["reason"]), {}, info
    shape = reference.steps["capped"].logits.shape
    wrong = [f"{name}: logits of shape {s.logits.shape}" for name, s in steps.items()
             if s.logits is not None and s.logits.shape != shape]
    wrong += [f"{name}: token log-probs of shape {s.token_log_probs.shape}" for name, s in steps.items()
              if s.logits is None and s.token_log_probs.shape != (shape[0] - 1,)]
    if wrong:
        info["reason"] = f"{wrong[0]}, expected {shape}"
        return tv.could_not_run(reference, info["reason"]), {}, info
    unit = catalog.LOW.get(info["precision"], tv.verdict.FP32)
    with _JUDGING:  # judging runs the float64 reference model (backprop, patched caps): one route at a time
        return watch.judged(steps["capped"], reference, unit, steps), steps, info


def measure(src, label: str, engines: list[str], states: dict, seq_len: int, seed: int, timeout: float,
            advance=None, jobs: int = 1, given: tuple | None = None) -> TrainParity:
    """Every route of every engine on one model type; ``states`` maps an environment to its State (None: absent);
    ``given``: a saved model and its token ids (train-parity DIR: engines/training/folder.py), trained as saved."""
    from concurrent.futures import ThreadPoolExecutor

    from softcapgrad.stacks import registry

    with child.scratch("softcapgrad-train-") as work:  # named by this pid: a killed run's is cleared later
        reference, model = tr.prepare(src, seq_len, seed, work) if given is None else folder.prepare(*given, work)
        design = row_folder(model, reference.ids, work)
        folders = ["capped", *sweep_folders(model, reference.ids, work), *([ROWS_FOLDER] if design else []),
                   *attention_folder(model, reference.ids, work)]
        pairs = [(engine, route) for engine in engines for route in routes(engine)]

        def one(pair):
            engine, route = pair
            done = _route(engine, route, states.get(ENGINES[engine]), reference, work, folders, timeout)
            if advance:
                advance()
            return done

        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            outcomes = list(pool.map(one, pairs))
    result = TrainParity(label, reference)
    other_model = {engine for (engine, _), (rows, _, _) in zip(pairs, outcomes)  # an engine whose model is not the
                   for r in rows if r["verdict"] == tv.DIFFERENT}  # reference's on some route: its head inputs differ
    for (engine, route), (rows, steps, info) in zip(pairs, outcomes):
        for row in rows:
            row.update(engine=engine, route=route.id, model=label, precision=info["precision"],
                       versions=_short(info["versions"], engine))
            if row["cap"] == "final" and steps and reference.caps["final"] is not None:
                zero = first_zero(list(steps.values()), reference.caps["final"], reference.ids)
                if zero["largest"] is None and design is not None and _rows_readable(row, engine, other_model):
                    # no a exposed: the head rows' gradients, where the route computes the reference's model (its
                    # head inputs are those the rows were designed on; where the cap is ignored, a row's gradient
                    # dies with its softmax probability, which underflows once other rows' logits are uncapped)
                    zero = rows_first_zero(steps.get(ROWS_FOLDER), design, reference.caps["final"])
                    if zero["largest"] is not None:
                        row["first_dead_note"] = HIDDEN_NOTE
                if zero["first_dead"] is None:
                    readable = None if design is None else _rows_readable(row, engine, other_model)
                    row["first_dead_note"] = _no_zero(zero, info, row, engine in other_model, readable)
                path, scores, why = CAP_STACK.get((engine, route.id), (STACK, info["precision"], ""))
                if why:
                    row["first_dead_note"] = "; ".join(n for n in (row.get("first_dead_note"), why) if n)
                row["stacks_within"] = stacks_within(zero, reference.caps["final"])
                pointwise = registry.STACKS[path].upstream_sets_zero
                row.update(zero, **(upstream_agreement(list(steps.values()), reference.caps["final"], reference.ids,
                                                       path, scores) if pointwise else
                                    stack_agreement(zero, scores, reference.caps["final"], path)))
            elif row["cap"] == "attention" and steps and reference.caps["attention"] is not None:
                _attention_zero(row, list(steps.values()), reference.caps["attention"], info["precision"])
            row.update(signature.decided(row))  # an undecided row's own zeros: the exact backward's or not
        result.rows.extend(rows)
        result.routes.append({**info, "model": label})
    return result
