"""Measurements of the stacks that do not run on this machine, with the device, versions and date.

The package ships ``data/cuda-h200.json``: the CUDA stacks measured on one NVIDIA H200. A row is
one quantity of one stack: the first zero-gradient input of c·tanh(a/c) for a scores format and a
cap, or the first input whose tanh a backend returns as exactly 1.0. ``softcapgrad stacks --record
FILE`` measures the same rows on a machine with CUDA (softcapgrad.models.record) and writes them in this format.
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from softcapgrad.core.checks import InputError

FORMAT = "softcapgrad recorded stacks 1"
QUANTITIES = ("first_zero_grad_input", "first_saturating_input")
FORMULA = "formula"  # the site of a row measured on the bare formula (other sites: a model's own code)
PACKAGED = "cuda-h200.json"
WHAT = ("first_zero_grad_input: the first pre-cap input a (smallest, searched over the scores format's own positive "
        "values) at which d/da of c·tanh(a/c) is exactly 0 for an upstream gradient of ones; first_saturating_input: "
        "the first x whose tanh is returned as exactly 1.0. monotone: every searched value past it is also 0 (1.0); "
        "last_unsaturated: where it is not, the last searched value past it that is not.")


@dataclass(frozen=True)
class Row:
    path: str
    quantity: str  # one of QUANTITIES
    scores: str  # canonical format name of the searched values
    cap: float | None  # None for first_saturating_input
    value: float | None  # None: no value of the format gets there
    monotone: bool | None
    last_unsaturated: float | None = None  # past ``value``, the last searched input that is not 0 (1.0)
    site: str = FORMULA
    note: str = ""


@dataclass(frozen=True)
class Recording:
    device: str
    date: str
    versions: dict[str, str]  # torch, cuda, driver, triton, jax, transformers
    provenance: str
    rows: tuple[Row, ...]
    what: str = WHAT

    @property
    def source(self) -> str:
        return f"recorded on {self.device}"

    def find(self, path: str, quantity: str, scores: str, cap: float | None, site: str = FORMULA) -> Row | None:
        for row in self.rows:
            if (row.path, row.quantity, row.scores, row.cap, row.site) == (path, quantity, scores, cap, site):
                return row
        return None


def _number(value, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{where}: expected a number or null, got {value!r}")
    return float(value)


def parse(text: str, origin: str) -> Recording:
    """A recording from its JSON text; anything malformed is one line naming ``origin`` and the field."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(f"{origin}: not JSON ({err.msg}, line {err.lineno})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise InputError(f"{origin}: not a softcapgrad recording (its 'format' must be {FORMAT!r})")
    for key in ("device", "date", "provenance"):
        if not isinstance(doc.get(key), str) or not doc[key]:
            raise InputError(f"{origin}: '{key}' must be a non-empty string")
    versions = doc.get("versions")
    if not isinstance(versions, dict) or not all(isinstance(v, str) for v in versions.values()):
        raise InputError(f"{origin}: 'versions' must map names to version strings")
    rows = []
    names = [f.name for f in fields(Row)]
    for i, raw in enumerate(doc.get("rows") or []):
        where = f"{origin}: rows[{i}]"
        if not isinstance(raw, dict) or set(raw) - set(names) or not {"path", "quantity", "scores"} <= set(raw):
            raise InputError(f"{where}: expected the keys {', '.join(names)}")
        if raw["quantity"] not in QUANTITIES:
            raise InputError(f"{where}: quantity {raw['quantity']!r} is not one of {', '.join(QUANTITIES)}")
        monotone = raw.get("monotone")
        if monotone is not None and not isinstance(monotone, bool):
            raise InputError(f"{where}: monotone must be true, false or null")
        rows.append(Row(path=str(raw["path"]), quantity=raw["quantity"], scores=str(raw["scores"]),
                        cap=_number(raw.get("cap"), where), value=_number(raw.get("value"), where), monotone=monotone,
                        last_unsaturated=_number(raw.get("last_unsaturated"), where),
                        site=str(raw.get("site", FORMULA)), note=str(raw.get("note", ""))))
    return Recording(doc["device"], doc["date"], dict(versions), doc["provenance"], tuple(rows),
                     str(doc.get("what", WHAT)))


def dumps(recording: Recording) -> str:
    """The file's text: the same recording always gives the same bytes."""
    doc = {"format": FORMAT, "device": recording.device, "date": recording.date, "versions": recording.versions,
           "provenance": recording.provenance, "what": recording.what, "rows": [asdict(r) for r in recording.rows]}
    return json.dumps(doc, indent=1, ensure_ascii=False) + "\n"


@functools.cache
def packaged() -> Recording:
    from importlib.resources import files

    return parse(files("softcapgrad.stacks").joinpath("data", PACKAGED).read_text(encoding="utf-8"), PACKAGED)


def load(path: Path | None = None) -> Recording:
    if path is None:
        return packaged()
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    return parse(path.read_text(encoding="utf-8"), str(path))
