"""One parity run: the reference, each engine in its child process, a verdict per engine and cap.

``prepare`` builds the reference (fp32 eager) and writes the transformers directories every engine converts:
the model as it is, the same weights with the final cap off (and with every cap off, where an attention cap is
set). A model built tiny, or a folder with ``--bind``, runs on random token ids with its weights rescaled so that
each cap binds (reference.bind), saved in fp32 beside the stand-in tokenizer; a model folder otherwise runs as
saved, on text its own tokenizer reads, its files copied to the engines unchanged (folder.py).
``parity_run.measure_all`` runs the engines and returns plain rows; ``as_dict`` and ``markdown`` give the results
files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from softcapgrad.core.checks import InputError
from softcapgrad.engines.forward import reference as ref
from softcapgrad.engines.forward import catalog, conditioning, modeltypes, runner
from softcapgrad.engines.forward.alternatives import (all_local_alternatives, gelu_alternatives, gelu_whole,
                                                      scaling_alternatives, swapped_alternatives, window_alternatives)
from softcapgrad.engines.forward.vocabulary import write_tokenizer

FOLDERS = {"capped": "capped", "final off": "final-off", "uncapped": "uncapped"}  # variant -> folder name
TIMES = ("cpu_s", "wall_s")  # printed, and in make bench; left out of the files, which stay the same run to run


@dataclass(frozen=True)
class Parity:
    model: str
    reference: object  # reference.Reference
    rows: list = field(default_factory=list)  # one per engine and cap
    engines: list = field(default_factory=list)  # one per engine: how, versions, times, reason
    kept: Path | None = None  # with measure_all's keep: the model folders and each route's outputs (repro bundles)
    conditioning: object = None  # conditioning.Conditioning of the model built
    inputs: object = None  # folder.Inputs of a model folder (None: a model built tiny)


def prepare(src, seq_len: int, seed: int, work: Path, inputs=None):
    """The reference and the engines' input folders under ``work``."""
    return _prepare(src, seq_len, seed, work, inputs)[0]


def _prepare(src, seq_len: int, seed: int, work: Path, inputs=None):
    """The reference, the model and its token ids; the engines' input folders under ``work``. ``inputs``
    (folder.Inputs) of a model folder run as saved; None, or bound ones: random ids, the weights rescaled."""
    from softcapgrad.engines.forward import folder
    from softcapgrad.models import audit

    ref.check(src.config)
    if not 2 <= seq_len <= ref.MAX_TOKENS:
        raise InputError(f"--seq-len {seq_len}: must lie in 2..{ref.MAX_TOKENS}")
    model = ref.build(src, seed)
    as_saved = inputs is not None and not inputs.bound
    ids = inputs.ids if as_saved else audit.random_ids(src.config, 1, seq_len, seed).numpy().reshape(-1)
    scales = {} if as_saved else ref.bind(model, ids)
    reference = ref.reference(model, ids, scales)
    if reference.alternatives:
        reference.alternatives.update(window_alternatives(model, ids))
        reference.alternatives.update(scaling_alternatives(model, ids))
        reference.alternatives.update(gelu_alternatives(model, ids))
        reference.final_alternatives.update(swapped_alternatives(model, ids))
    reference.final_alternatives.update(all_local_alternatives(model, ids))
    reference.final_alternatives.update(gelu_whole(model, ids))
    runner.write_ids(work, ids)
    for variant in variants(reference):
        if as_saved:
            folder.write(src, work / FOLDERS[variant], ref.VARIANTS[variant], inputs.tokenizer)
            continue
        saved = ref.save(model, work / FOLDERS[variant], ref.VARIANTS[variant])
        write_tokenizer(saved, model.config.to_dict())  # engines load a tokenizer beside the weights
    return reference, model, ids


def variants(reference) -> list[str]:
    """What each engine runs: the model, and without its final cap; also without any cap where an attention cap is
    set: the engine's own effect of that cap (verdict.differential), and where transformers leaves it unused,
    whether the engine applies it."""
    return ["capped", "final off"] + (["uncapped"] if reference.caps["attention"] is not None else [])


def recorded(info: dict, outcome, precision: str) -> dict:
    """``info`` with what the route's child reported: its times, reason, what it did, its precision and versions."""
    reported = outcome.info.get("versions") if isinstance(outcome.info.get("versions"), dict) else {}
    info.update(cpu_s=round(outcome.cpu_s, 1), wall_s=round(outcome.wall_s, 1), reason=outcome.reason,
                did=str(outcome.info.get("did", "")), precision=str(outcome.info.get("precision", precision)))
    if reported:
        info["versions"] = reported
    return info


def _generation_cell(entry: dict) -> str:
    g = generation(entry)
    return f"{g}" if g == ref.GENERATION else f"{g} (earlier models)"


def _left_out(row: dict) -> str:
    n = row.get("left_out")
    return f" ({n} below fp32's smallest normal on both sides, left out)" if n else ""


def not_here() -> list[dict]:
    return [{"engine": name, "verdict": "not measured here (needs a GPU)", "would_check": what}
            for name, what in catalog.NOT_HERE]


def private(value):
    """``value`` with this machine's engines cache and home folder written as ``<engines>`` and ``~``: an engine's
    error quotes the files of its environment, and the results files are shared."""
    if isinstance(value, str):
        from softcapgrad.engines.environments.environments import cache_root

        return value.replace(str(cache_root()), "<engines>").replace(str(Path.home()) + "/", "~/")
    if isinstance(value, dict):
        return {k: private(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [private(v) for v in value]
    return value


def _clean(value):
    if isinstance(value, str):
        return private(value)
    if isinstance(value, float):
        return float(f"{value:.6g}") if np.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def as_dict(results: list[Parity], provenance: dict | None = None) -> dict:
    """The results as parity.json holds them; with ``provenance`` (provenance.record), each row names the CPU."""
    cpu = provenance_cpu(provenance)
    return _clean({
        "models": [{"model": r.model, "caps": r.reference.caps, "reach": r.reference.reach,
                    "tokens": int(r.reference.ids.size), "vocabulary": int(r.reference.logits["capped"].shape[1]),
                    "scales": r.reference.scales, "note": modeltypes.NOTES.get(r.model, ""),
                    "generation": ref.GENERATION,
                    **({"conditioning": r.conditioning.as_dict()} if r.conditioning is not None else {}),
                    **({"inputs": inputs_entry(r)} if getattr(r, "inputs", None) is not None else {})}
                   for r in results],
        "rows": [{**row, **({"cpu": cpu} if cpu else {})} for r in results for row in r.rows],
        "engines": [{k: v for k, v in e.items() if k not in TIMES} for r in results for e in r.engines],
        "not_measured": not_here(),
        "model_types_not_yet": [{"model_type": t, "why": why} for t, why in ref.NOT_YET],
        **({"provenance": provenance} if provenance else {}),
    })


def inputs_entry(result: Parity) -> dict:
    """A model folder's inputs: how they were made, and per cap whether they exercise it: the knee below which it
    changes nothing (verdict.py), and how many of its entries lie at or past fp32's first zero of the gradient."""
    from softcapgrad.engines.forward.judging import exercised_from

    reference = result.reference
    return {**result.inputs.as_dict(), "first_zero": ref.first_zero(),
            "caps": {cap: {"reach": reference.reach.get(cap), "knee": exercised_from(reference, cap),
                           **(reference.past or {}).get(cap, {})}
                     for cap in ref.CAPS if reference.caps[cap] is not None}}


def provenance_cpu(provenance: dict | None) -> str | None:
    from softcapgrad.engines.environments.provenance import cpu_label

    return cpu_label(provenance.get("cpu")) if provenance else None


def _fmt(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def _of(data: dict, key: str, model: str) -> list[dict]:
    return [x for x in data[key] if x["model"] == model]


# What merge, the Markdown, the answer and the figure read of each entry of earlier results (parity --update): the
# keys an entry must hold, with the types their values may take (object: any), then the keys it may hold.
ENTRY = {"models": {"model": str, "reach": dict, "caps": object, "tokens": object, "vocabulary": object},
         "rows": {"engine": str, "route": str, "model": str, "cap": str, "verdict": str, "error": object,
                  "error_off": object, "tolerance": object, "where": object},
         "engines": {"engine": str, "route": str, "model": str, "versions": dict, "did": object, "how": object}}
MAY_HOLD = {"rows": {"hint": str, "outside": (int, float, type(None)), "cpu": (str, type(None)), "other_cpu": bool,
                     "generation": int},
            "models": {"generation": int, "conditioning": dict, "inputs": dict}, "engines": {"generation": int}}


def unmergeable(old: dict) -> str | None:
    """What in earlier results (a dict with the lists models, rows and engines and a params dict) ``merge`` and the
    files made from its result could not read, in words: the first entry that is not an object, lacks a key or
    holds a value of another type; None when every entry can be read."""
    for key, needed in ENTRY.items():
        for i, entry in enumerate(old[key]):
            if not isinstance(entry, dict):
                return f"{key}[{i}] is not an object"
            for name, kind in {**needed, **MAY_HOLD.get(key, {})}.items():
                if name not in entry and name in needed:
                    return f"{key}[{i}] has no {name!r}"
                if name in entry and not isinstance(entry[name], kind):
                    return f"{key}[{i}] holds {name!r} as {type(entry[name]).__name__}"
    if not isinstance(old["params"].get("updated", []), list):
        return "params holds 'updated' but not as a list"
    if not isinstance(old.get("provenance", {}), dict) or not isinstance(old.get("provenance", {}).get("earlier", []),
                                                                         list):
        return "its provenance is not an object with a list of earlier runs"
    return None


def merge(old: dict, new: dict) -> dict:
    """``old`` results with every engine that ``new`` measured on a model replaced by ``new``'s rows for it; models
    and engines keep the order of ``old``, then of the catalog (``parity --update``)."""
    order = {name: i for i, name in enumerate(catalog.engines())}
    models = {m["model"]: m for m in old["models"]}
    models.update({m["model"]: m for m in new["models"]})
    merged = {**old, **{k: v for k, v in new.items() if k not in ("models", "rows", "engines")},
              "models": list(models.values()), "rows": [], "engines": []}
    for model in models:
        measured = {e["engine"] for e in _of(new, "engines", model)}
        for key in ("rows", "engines"):
            kept = [x for x in _of(old, key, model) if x["engine"] not in measured] + _of(new, key, model)
            merged[key] += sorted(kept, key=lambda x: order.get(x["engine"], len(order)))  # stable: routes stay
    from softcapgrad.engines.environments.provenance import carried, mark_other_cpus

    merged["rows"] = mark_other_cpus(merged["rows"])
    if carried(old.get("provenance"), new.get("provenance")):
        merged["provenance"] = carried(old.get("provenance"), new.get("provenance"))
    return private(merged)


def generation(entry: dict) -> int:
    """The builder generation an entry was measured on; entries written before generations were kept are the first."""
    return entry.get("generation", 1)


def precap_beyond(row: dict) -> bool:
    """Whether the engine's own logits without the final cap (a) differ from transformers' by more than the final
    cap's tolerance taken at a's scale (n·u·M with M the largest |a|: the row's tolerance × its largest |a/c|)."""
    e, tol, reach = row.get("precap_error"), row.get("tolerance"), row.get("reach")
    return e is not None and bool(tol) and isinstance(reach, (int, float)) and e > tol * max(reach, 1.0)


def _precap_cell(row: dict) -> str:
    if row.get("precap_error") is None:
        return ""
    return _fmt(row["precap_error"]) + (" (beyond)" if precap_beyond(row) else "")


def markdown(data: dict, answer: tuple[str, ...]) -> str:
    """parity.md from the results as ``as_dict`` (or ``merge``) gives them."""
    from softcapgrad.engines.environments.provenance import said

    earlier = [r for r in data["rows"] if generation(r) != ref.GENERATION]
    mixed = ([f"{len(earlier)} of the {len(data['rows'])} rows were measured on the models an earlier builder made "
              f"(engines {', '.join(dict.fromkeys(r['engine'] for r in earlier))}), not re-run on the current "
              f"generation {ref.GENERATION}: the 'models' column of each table says which.", ""] if earlier else [])
    lines = ["# Do the caps survive leaving transformers?", "", *answer, ""]
    lines += [said(data.get("provenance")), ""] if data.get("provenance") else []
    lines += [*mixed, *conditioning.table(data["models"], generation)]
    lines += ["Pre-cap error (final cap rows): the largest |Δ| between the engine's raw logits without the final cap "
              "and transformers', beyond when it exceeds the row's tolerance times the largest |a/c| (the same "
              "rounding bound at the logits' own scale), whatever the verdict.", ""]
    for m in data["models"]:
        reach = ", ".join(f"{k} {v:.3g}" for k, v in m["reach"].items() if isinstance(v, float))
        rows = _of(data, "rows", m["model"])
        older = sorted({generation(r) for r in rows} - {ref.GENERATION})
        caps = {k: m["caps"][k] for k in sorted(m["caps"])}  # as the JSON (sort_keys) holds them, whichever path
        lines += [f"## {m['model']}", "", f"caps {caps}; largest |a/c| reached: {reach}; "
                  f"{m['tokens']} tokens, full vocabulary of {m['vocabulary']}."
                  + (f" {m['note']}." if m.get("note") else "")
                  + (f" Inputs: {m['inputs']['how']}." if isinstance(m.get("inputs"), dict) else "")
                  + (f" Rows of generation {', '.join(map(str, older))} were measured on the models an earlier "
                     f"builder made, not re-run on the current ones (generation {ref.GENERATION}): the model "
                     f"facts above are generation {generation(m)}'s." if older else ""), "",
                  "| engine | route | cap | verdict | largest \\|logit\\| | log-prob error | to uncapped | tolerance "
                  "| pre-cap error | where | models | note |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for row in rows:
            top = f" (top {row['top_k']})" if row.get("top_k") else ""
            top += " (measured on another CPU)" if row.get("other_cpu") else ""
            lines.append(f"| {row['engine']} | {row['route']} | {row['cap']} | {row['verdict']}{top} | "
                         f"{_fmt(row.get('max_logit'))} | {_fmt(row['error'])} | "
                         f"{_fmt(row['error_off'])} | {_fmt(row['tolerance'])} | {_precap_cell(row)} | "
                         f"{_fmt(row['where'])}{_left_out(row)} | "
                         f"{_generation_cell(row)} | {row.get('hint', '')} |")
        lines += ["", "| engine | route | what ran | versions |", "| --- | --- | --- | --- |"]
        for e in _of(data, "engines", m["model"]):
            versions = ", ".join(f"{k} {v}" for k, v in e["versions"].items())
            lines.append(f"| {e['engine']} | {e['route']} | {e['did'] or e['how']} | {versions} |")
        lines.append("")
    lines += ["## Model types not built yet", "", "| model type | why |", "| --- | --- |"]
    lines += [f"| {t} | {why} |" for t, why in ref.NOT_YET]
    lines += ["", "## Not measured here", "", "| engine | would check |", "| --- | --- |"]
    lines += [f"| {row['engine']} | {row['would_check']} |" for row in not_here()]
    return "\n".join(lines) + "\n"
