"""One cell per verdict row of the committed results: its verdict in words, its tone, its error against the tolerance
and the details a click shows.

parity.json holds the inference engines (one forward per route, each cap judged on the log-probs); train-parity.json
the training routes (one step, the loss and gradients judged as well). Both are read as plain data: a row's keys are
the files' own, and a key a row lacks is left out of its details rather than guessed.
"""

from __future__ import annotations

from dataclasses import dataclass

# Each verdict's tone: what the page colours it by, and the word its legend gives the colour.
TONES: dict[str, str] = {
    "applied": "kept",
    "applied forward and backward": "kept",
    "ignored": "lost",
    "different": "altered",
    "applied to another tensor": "altered",
    "ignores the folder's caps": "altered",
    "not bound": "undecided",
    "not deterministic": "undecided",
    "could not run": "failed",
    "unused by transformers": "inert",
    "not set": "inert",
    "no such architecture": "inert",
}
GLYPHS = {"kept": "✓", "lost": "✗", "altered": "≠", "undecided": "?", "failed": "!", "inert": "–"}
TONE_WORDS = {
    "kept": "the cap is computed as the model defines it",
    "lost": "the cap is not applied: the output matches the model without it",
    "altered": "something else is computed: another model, another tensor, or the engine's own cap",
    "undecided": "this precision cannot tell the capped from the uncapped model, or the model changes from load to load",
    "failed": "the route did not run here; the details say why",
    "inert": "nothing to judge: the model type has no such cap, the engine no such architecture, or transformers "
             "itself never uses the cap",
}
# What a verdict means when the row gives no cause of its own (an empty hint).
MEANINGS: dict[str, str] = {
    "applied": "the engine's log-probs match transformers' capped model within the tolerance, and are far from the "
               "same model with this cap removed",
    "applied forward and backward": "the step's logits, loss and gradients all match the capped reference",
    "ignored": "the engine's log-probs match the model with this cap removed, not the capped one",
    "not set": "this model type sets no such cap",
}
STAGES = ("inference", "training")
STAGE_WORDS = {"inference": "inference (forward)", "training": "training step (forward and backward)"}


@dataclass(frozen=True)
class Cell:
    id: str  # "p<row index>" in parity.json, "t<row index>" in train-parity.json
    stage: str  # inference or training
    model: str
    engine: str
    route: str
    cap: str
    verdict: str
    tone: str
    error: str  # the error beside its tolerance, in words; "" where the row measured none
    cause: str  # in plain words: the row's hint, or what its verdict means
    details: tuple[tuple[str, str], ...]  # the row's own
    route_details: tuple[tuple[str, str], ...]  # its route's record, shared by every cell of that run


def number(x) -> str:
    """A measured value in three significant digits; the files write non-finite values as strings."""
    if isinstance(x, bool) or x is None:
        return str(x)
    if isinstance(x, (int, float)):
        return f"{x:.3g}"
    return str(x)


def _versions(versions) -> str:
    if isinstance(versions, dict):
        return ", ".join(f"{k} {v}" for k, v in sorted(versions.items()))
    return str(versions or "")


def _pairs(*items: tuple[str, object]) -> tuple[tuple[str, str], ...]:
    """The details a row has: items whose value is None or empty leave no line."""
    return tuple((k, v if isinstance(v, str) else number(v)) for k, v in items if v not in (None, "", [], {}))


def _against(error, tolerance) -> str:
    if error is None:
        return ""
    return f"{number(error)} (tolerance {number(tolerance)})"


def _cause(row: dict) -> str:
    return row.get("hint") or MEANINGS.get(row["verdict"], row["verdict"])


def _record(records: dict, row: dict) -> dict:
    return records.get((row["engine"], row["route"], row["model"]), {})


def _records(data: dict, key: str) -> dict:
    return {(e["engine"], e["route"], e["model"]): e for e in data.get(key, [])}


def _c(row: dict) -> str:
    c = row.get("c")
    return f"the {row['cap']} cap, c = {number(c)}" if c is not None else f"the {row['cap']} cap (not set)"


def _cells(data: dict, key: str, stage: str, prefix: str, describe) -> list[Cell]:
    """A cell for every row of ``data``, in the file's order; ``describe(row, its route's record, the results'
    date)`` gives its error, its own details and its route's."""
    records = _records(data, key)
    date = data.get("provenance", {}).get("date", "")
    cells = []
    for i, row in enumerate(data.get("rows", [])):
        error, details, shared = describe(row, _record(records, row), date)
        cells.append(Cell(f"{prefix}{i}", stage, row["model"], row["engine"], row["route"], row["cap"],
                          row["verdict"], TONES.get(row["verdict"], "inert"), error, _cause(row), details, shared))
    return cells


def _provenance(row: dict, date: str) -> str:
    return f"{row.get('cpu', '')}; results of {date}".strip("; ")


def inference_cells(parity: dict) -> list[Cell]:
    """A cell for every row of parity.json."""
    return _cells(parity, "engines", "inference", "p", _inference)


def training_cells(train: dict) -> list[Cell]:
    """A cell for every row of train-parity.json."""
    return _cells(train, "routes", "training", "t", _training)


def _inference(row: dict, record: dict, date: str):
    error = _against(row.get("error"), row.get("tolerance"))
    judged = ("the whole vocabulary" if not row.get("top_k")
              else f"each position's {row['top_k']} most likely tokens")
    repro = (f"softcapgrad parity --model-type {row['model']} --engine {row['engine']}"
             + (f" --repro repro-{row['engine']}" if TONES.get(row["verdict"]) in ("lost", "altered") else ""))
    details = _pairs(
        ("cap", _c(row)),
        ("verdict", row["verdict"]),
        ("cause", _cause(row)),
        ("closest form", row.get("fits")),
        ("outside the caps", row.get("outside_form") or row.get("outside")),
        ("log-prob error", error),
        ("to the uncapped model", row.get("error_off")),
        ("largest error at", row.get("where")),
        ("pre-cap error", f"{number(row['precap_error'])} at {row.get('precap_where')}"
         if row.get("precap_error") is not None else None),
        ("judged on", judged),
        ("reproduce", repro),
    )
    shared = _pairs(
        ("route", record.get("how")),
        ("what ran", record.get("did")),
        ("precision", record.get("precision")),
        ("versions", _versions(record.get("versions"))),
        ("environment", record.get("environment")),
        ("why it could not run", record.get("reason")),
        ("second load", f"the same folder loaded twice differs by {number(record['second_load'])}"
         if record.get("second_load") else None),
        ("measured on", _provenance(row, date)),
    )
    return error, details, shared


def _training(row: dict, record: dict, date: str):
    forward = _against(row.get("forward_error"), row.get("forward_tolerance"))
    gradient = _against(row.get("grad_error"), row.get("grad_tolerance"))
    error = "; ".join(x for x in (forward and f"forward {forward}", gradient and f"gradient {gradient}") if x)
    zero = (f"{number(row['first_dead'])} (a/c = {number(row.get('first_dead_over_c'))}), last non-zero "
            f"{number(row.get('last_alive'))}" if row.get("first_dead") is not None else "")
    details = _pairs(
        ("cap", _c(row)),
        ("verdict", row["verdict"]),
        ("cause", _cause(row)),
        ("form computed", row.get("form")),
        ("forward error", forward),
        ("gradient error", gradient),
        ("largest gradient error in", row.get("grad_where")),
        ("loss and gradients scaled by", row.get("grad_scale")),
        ("cap value the route used", row.get("c_used")),
        ("first zero gradient", zero),
        ("about the first zero", row.get("first_dead_note")),
        ("stack whose first zero it matches", f"{row['stack']} (first zero {number(row.get('stack_first_zero'))})"
         if row.get("stack") else None),
        ("reproduce", f"softcapgrad train-parity --model-type {row['model']} --engine {row['engine']}"),
    )
    shared = _pairs(
        ("route", record.get("how")),
        ("what ran", record.get("did")),
        ("precision", row.get("precision") or record.get("precision")),
        ("versions", _versions(record.get("versions") or row.get("versions"))),
        ("environment", record.get("environment")),
        ("why it could not run", record.get("reason")),
        ("measured on", _provenance(row, date)),
    )
    return error, details, shared
