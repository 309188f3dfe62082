"""``train-parity --repro DIR``: for each training route with a finding, a folder its maintainers run without softcapgrad.

A finding is a row whose verdict says the step trains without a cap or with another gradient (training/verdict.py's
``BAD``: ignored, applied forward with another gradient, applied to another tensor, not finite, different), the rows
results.answer leads with. A bundle ``<model>--<engine>--<route>/`` holds the tiny model the route trained
(``capped/``: config.json, model.safetensors, the stand-in tokenizer; the float64 reference model cast back to the
fp32 it was built in, which is exact) and ``ids.npy``; ``reference/*.npz``: the float64 reference steps as data (the
loss, the logits, dL/dz, and every parameter's gradient for the models the recorded rows lie in, and each cap's
named backwards where the step lies in the capped model); ``bundle.json``; ``adapter/``: the training adapter
train-parity ran, with the adapter modules it imports; ``reproduce.py``: the step taken through that adapter as
the library's users take it, then the comparison of repro/train_check.py (the standard library and numpy);
``requirements.txt`` and ``REPORT.md``. Nothing in a bundle is run when it is written.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import numpy as np

from softcapgrad.engines.forward import catalog
from softcapgrad.engines.repro import repro, report as parity_report
from softcapgrad.engines.training import reference as tr, routes as train_routes, verdict as tv
from softcapgrad.engines.training.results import _fix

CHECK = Path(__file__).with_name("train_check.py")
FORWARD_ONLY = (tv.IGNORED, tv.ELSEWHERE, tv.NOT_FINITE)  # verdicts the script decides as train-parity does


def is_finding(row: dict) -> bool:
    return row["verdict"] in tv.BAD and row.get("c") is not None


def findings(rows: list[dict]) -> dict:
    """(model, engine, route) -> that route's rows, for every route with at least one finding, in the rows' order."""
    runs: dict = {}
    for r in rows:
        runs.setdefault((r["model"], r["engine"], r["route"]), []).append(r)
    return {key: found for key, found in runs.items() if any(is_finding(r) for r in found)}


def expect(row: dict) -> str | None:
    """The verdict the script should print: where it rests on the forward placement alone (the script repeats that);
    None where it rests on the gradients train-parity carried back through the float64 model."""
    hint = row.get("hint") or ""
    forward = row["verdict"] in FORWARD_ONLY or (row["verdict"] == tv.DIFFERENT and not hint.startswith(
        ("forward applied", "the returned logits are c·tanh(a/c)")))  # the gradients, or the route's own a
    return row["verdict"] if forward else None


def _kind(name: str) -> str:
    if name in tr.WHOLE_FORMS:
        return "whole"
    if name in (tr.HIDDEN, tr.HIDDEN_EXCHANGED):
        return "elsewhere"
    return "window" if name == tv.WINDOWLESS else "cell"


def _file(i: int, name: str) -> str:
    return f"reference/{i:02d}-" + "".join(ch if ch.isalnum() else "-" for ch in name).strip("-")[:60] + ".npz"


def _save(path: Path, step, grads: bool) -> None:
    values = {"loss": np.float64(step.loss), "logits": step.logits}
    if step.logits_grad is not None:
        values["logits_grad"] = step.logits_grad
    if grads:
        values.update({f"grad/{k}": v for k, v in step.grads.items()})
    np.savez_compressed(path, **values)


def references(bundle: Path, reference, run_rows: list[dict], unit: float) -> tuple[list, list]:
    """The reference models a step of this precision is placed among (training/verdict.py's), into reference/:
    each one's loss and logits, the gradients of those the recorded rows lie in and of the capped model; each cap's
    named backwards where a row lies in the capped model. bundle.json's cells and forms."""
    refs = tv.distinct(reference)
    if reference.swapped is not None:
        refs[tr.SWAPPED] = reference.swapped
    refs.update(tv.placeable(reference.others or {}, unit))
    lying = {"capped"} | {r.get(k) for r in run_rows for k in ("forward_cell", "loss_cell")}
    (bundle / "reference").mkdir()
    cells = []
    for i, (name, step) in enumerate(refs.items()):
        _save(bundle / _file(i, name), step, name in lying)
        cells.append({"name": name, "file": _file(i, name), "kind": _kind(name), "on": sorted(tv.ON.get(name, ()))})
    forms = []
    if any(r.get("forward_cell") == "capped" for r in run_rows):
        for cap, named in reference.forms.items():
            for form, step in named.items():
                file = _file(len(cells) + len(forms), f"{cap} {form}")
                _save(bundle / file, step, True)
                forms.append({"cap": cap, "form": form, "file": file})
    return cells, forms


def engine_code(engine: str, route) -> str:
    """The lines of reproduce.py that take the step: the adapter train-parity ran, beside the script, on a copy of the
    folder (the library may write beside it), as the runner calls it; its arrays read back without pickle."""
    adapter = f"{catalog.PREFIX}{train_routes.ADAPTERS.get(engine, train_routes.ADAPTER)}.py"
    return (f"import runpy\nimport shutil\nimport sys\nimport tempfile\nfrom pathlib import Path as _Path\n\n"
            f"import numpy as np\n\nADAPTERS = _Path(__file__).resolve().parent / \"adapter\"\n\n\n"
            f"def run_step(folder, ids):\n"
            f"    # route {route.id}: {route.text}\n"
            f"    work = _Path(tempfile.mkdtemp(prefix=\"train-step-\"))\n"
            f"    argv, cwd = sys.argv, os.getcwd()\n"
            f"    try:\n"
            f"        np.save(work / \"ids.npy\", ids, allow_pickle=False)\n"
            f"        shutil.copytree(folder, work / folder.name)\n"
            f"        sys.path.insert(0, str(ADAPTERS))\n"
            f"        sys.argv = [str(ADAPTERS / {adapter!r}), str(work), {route.id!r}, folder.name]\n"
            f"        os.chdir(work)\n"
            f"        try:\n"
            f"            runpy.run_path(sys.argv[0], run_name=\"__main__\")\n"
            f"        except SystemExit as done:\n"
            f"            if done.code:\n"
            f"                raise RuntimeError(f\"the step failed (exit code {{done.code}}): its reason is on \"\n"
            f"                                   \"stderr above\") from None\n"
            f"        with np.load(work / \"out\" / {route.id!r} / f\"{{folder.name}}.npz\", allow_pickle=False) as data:\n"
            f"            return {{k: np.asarray(data[k]) for k in data.files}}\n"
            f"    finally:\n"
            f"        sys.argv = argv\n"
            f"        os.chdir(cwd)\n"
            f"        shutil.rmtree(work, ignore_errors=True)\n")


def script(engine: str, route, model: str) -> str:
    return repro.assemble(f"Reproduces what train-parity found for {engine}, route {route.id}, on a tiny {model}: "
                          f"python reproduce.py [--json].\n\nRun offline in the library's environment "
                          f"(requirements.txt). It takes one training step on capped/ and prints, for each cap, where "
                          f"the step lies among the references and the verdict.", engine_code(engine, route), CHECK,
                          "run_step")


def write_bundle(bundle: Path, result, run_rows: list[dict], info: dict, pinned: dict | None) -> list[str]:
    """One bundle in the new folder ``bundle``; the caps it holds."""
    engine, route_id = run_rows[0]["engine"], run_rows[0]["route"]
    route = next(r for r in train_routes.routes(engine) if r.id == route_id)
    reference = result.reference
    unit = catalog.LOW.get(info.get("precision", "fp32"), tv.verdict.FP32)
    bundle.mkdir(parents=True)
    tr.save_folder(copy.deepcopy(reference.model).float().eval(), bundle / "capped")  # fp32 built, fp64 exact of it
    np.save(bundle / "ids.npy", np.asarray(reference.ids, dtype=np.int64), allow_pickle=False)
    cells, forms = references(bundle, reference, run_rows, unit)
    caps = [{"cap": r["cap"], "c": r["c"], "recorded": r["verdict"], "expect": expect(r), "hint": r.get("hint") or ""}
            for r in run_rows if is_finding(r)]
    data = {"engine": engine, "route": route_id, "model": run_rows[0]["model"], "precision": info.get("precision"),
            "tolerance": tv.tolerances(reference, unit),  # as train-parity judged the step
            "cells": cells, "forms": forms, "caps": caps, "versions": info.get("versions", {})}
    (bundle / "bundle.json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    repro.copy_adapter(catalog.script(train_routes.ADAPTERS.get(engine, train_routes.ADAPTER)), bundle)
    (bundle / "reproduce.py").write_text(script(engine, route, run_rows[0]["model"]), encoding="utf-8")
    versions = {"transformers": None, **info.get("versions", {}), "accelerate": None}  # the adapter's, Trainer's
    (bundle / "requirements.txt").write_text(repro.requirements(train_routes.ENGINES[engine], versions, pinned),
                                             encoding="utf-8")
    return [c["cap"] for c in caps]


def _number(value) -> str:
    return "—" if value is None else f"{value:.3g}"


def report_text(run_rows: list[dict], rows: list[dict], info: dict, reference, requirements_text: str) -> str:
    first = run_rows[0]
    caps = ", ".join(f"{k} {v}" for k, v in reference.caps.items() if v is not None)
    lines = [f"# {first['engine']} ({first['route']}): a training step's soft-caps on a tiny {first['model']}", "",
             f"Library: {first['engine']}, route `{first['route']}`: {info.get('how')}"
             + (f"; it reported: {info['did']}" if info.get("did") else "") + f"; precision {info.get('precision')}.",
             f"Versions: {first.get('versions') or 'not recorded'}.",
             f"Model: a tiny {reference.model_type} in capped/ (config.json, model.safetensors, a stand-in tokenizer), "
             f"caps {caps}, its weights scaled so that every cap binds; {reference.ids.size} token ids in ids.npy as "
             "inputs and labels.",
             "The reference is the same model in float64 through transformers' own code, one step with the caps on, "
             "each off and in other forms: its loss, logits and every parameter's gradient are in reference/.", ""]
    for row in (r for r in run_rows if is_finding(r)):
        lines += [f"## The {row['cap']} cap (c = {row['c']}): {row['verdict']}"
                  + (f" ({row['form']})" if row.get("form") else ""), "",
                  "- Expected: the step of the model with both caps (`capped`), forward and backward.",
                  f"- Came back: the returned logits lie in `{row.get('forward_cell') or 'no reference'}` (largest "
                  f"|Δ log-prob| {_number(row.get('forward_error'))}, tolerance {_number(row.get('forward_tolerance'))}"
                  f"), the loss in `{row.get('loss_cell') or 'no reference'}`; the gradients' largest relative |Δ| "
                  f"{_number(row.get('grad_error'))} at {row.get('grad_where') or '—'}, tolerance "
                  f"{_number(row.get('grad_tolerance'))}.",
                  f"- train-parity's note: {row.get('hint') or '—'}.",
                  f"- The setting that fixes it: {_fix(rows, row)}.", ""]
    return "\n".join(lines + parity_report.reproduce(requirements_text))


def write_all(stage: Path, results: list, pinned: dict | None = None) -> list[dict]:
    """Every bundle of ``results`` (TrainParity) in the folder ``stage``, with INDEX.md; one entry per bundle."""
    rows = [r for p in results for r in p.rows]
    written = []
    for p in results:
        infos = {(e["engine"], e["route"]): e for e in p.routes}
        for (model, engine, route_id), run_rows in findings(p.rows).items():
            info = infos.get((engine, route_id), {})
            bundle = stage / repro.folder_name(model, engine, route_id)
            caps = write_bundle(bundle, p, run_rows, info, pinned)
            pins = (bundle / "requirements.txt").read_text(encoding="utf-8")
            (bundle / "REPORT.md").write_text(report_text(run_rows, rows, info, p.reference, pins), encoding="utf-8")
            written.append({"bundle": bundle.name, "caps": ", ".join(caps),
                            "verdicts": ", ".join(r["verdict"] for r in run_rows if is_finding(r))})
    index = ["# Reproduction bundles", "", "One folder per training route with a finding; each has its REPORT.md.", ""]
    index += [f"- `{w['bundle']}`: {w['caps']} ({w['verdicts']})" for w in written] or [
        "No finding: every cap judged was applied forward and backward, or could not be decided."]
    (stage / "INDEX.md").write_text("\n".join(index) + "\n", encoding="utf-8")
    return written


def write(path: Path, results: list, pinned: dict | None = None) -> list[Path]:
    """The bundles written into a stage beside ``path`` (--repro DIR, checked with ``target`` before the run), then
    the stage renamed to it; nothing left behind on an error or Ctrl-C. The bundles' folders."""
    staged = parity_report.stage(path)
    try:
        written = write_all(staged, results, pinned)
        parity_report.put_in_place(staged, path)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    return [path / w["bundle"] for w in written]


target = parity_report.target
