"""Measurements of the stacks that do not run on this machine, with the device, versions and date.

The package ships ``data/cuda-h200.json``: the CUDA stacks measured on one NVIDIA H200. A row is
one quantity of one stack: the first zero-gradient input of c·tanh(a/c) for a scores format and a
cap, or the first input whose tanh a backend returns as exactly 1.0. ``softcapgrad stacks --record
FILE`` measures the same rows on a machine with CUDA (:func:`measure`) and writes them in this format.
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from softcapgrad.checks import InputError

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

    return parse(files("softcapgrad").joinpath("data", PACKAGED).read_text(encoding="utf-8"), PACKAGED)


def load(path: Path | None = None) -> Recording:
    if path is None:
        return packaged()
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    return parse(path.read_text(encoding="utf-8"), str(path))


# --- a new recording, on a machine with CUDA ---------------------------------------------------

CAPS = (30.0, 50.0)


def _versions() -> dict[str, str]:
    import shutil
    import subprocess

    import torch

    out = {"torch": torch.__version__, "cuda": str(torch.version.cuda), "driver": "not recorded"}
    if shutil.which("nvidia-smi"):
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, check=False)
        if smi.returncode == 0 and smi.stdout.strip():
            out["driver"] = smi.stdout.strip().splitlines()[0]
    for name in ("triton", "jax", "transformers"):
        try:
            out[name] = __import__(name).__version__
        except ImportError:
            out[name] = "not installed"
    return out


def _model_rows(device: str) -> list[Row]:
    """transformers' Gemma 2 on ``device``, eager and compiled: its final-logit cap and attention-score cap."""
    import numpy as np
    import torch

    from softcapgrad import gemma2
    from softcapgrad.formats import positive_values, resolve

    values = positive_values(resolve("bf16"))
    model = gemma2.tiny_model(final_cap=CAPS[0], attn_cap=CAPS[1], device=device)
    rows = []
    for path, compile_ in (("torch-eager-cuda", False), ("torch-compile-cuda", True)):
        final = torch.compile(model) if compile_ else None
        attention = torch.compile(model.model.layers[0].self_attn) if compile_ else None
        for site, c, (_, grad) in (("Gemma 2 final logits", CAPS[0], gemma2.final_cap(model, values, final)),
                                   ("Gemma 2 eager attention", CAPS[1],
                                    gemma2.attention_cap(model, values, attention))):
            zero = grad == 0.0
            i = int(np.argmax(zero))
            misses = np.flatnonzero(~zero[i:])
            value = float(values[i].astype(np.float64)) if zero.any() else None
            last = float(values[i + misses[-1]].astype(np.float64)) if zero.any() and misses.size else None
            rows.append(Row(path, QUANTITIES[0], "bfloat16", c, value, None if value is None else last is None, last,
                            site, "transformers' Gemma 2 in bf16, its own capping code"))
    return rows


def measure() -> Recording:
    """Every CUDA stack measured live on this machine's GPU: first zero-gradient inputs at c = 30 and 50 for each
    scores format it takes, its fp32 knee, and transformers' Gemma 2 when installed."""
    import datetime

    import torch

    from softcapgrad import stacks

    if not torch.cuda.is_available():
        raise InputError("stacks --record needs a CUDA device: torch.cuda.is_available() is False on this machine")
    rows, skipped = [], []
    for stack in stacks.STACKS.values():
        if stack.device != "cuda":
            continue
        why = stacks.runs_here(stack)
        if why:
            skipped.append(f"{stack.name} ({why})")
            continue
        for fmt in stack.formats:
            for c in CAPS:
                r = stacks.first_zero(stack.name, fmt, c)
                rows.append(Row(stack.name, QUANTITIES[0], fmt, c, r.value, r.monotone, r.last_unsaturated))
        if stack.has_knee:
            r = stacks.knee(stack.name, "float32")
            rows.append(Row(stack.name, QUANTITIES[1], "float32", None, r.value, r.monotone, r.last_unsaturated))
    try:
        rows += _model_rows("cuda")
    except ImportError:
        skipped.append("transformers' Gemma 2 (transformers is not installed)")
    device = torch.cuda.get_device_name()
    today = datetime.date.today().isoformat()
    provenance = f"measured on one {device} on {today} by softcapgrad stacks --record"
    if skipped:
        provenance += f"; not measured: {', '.join(skipped)}"
    return Recording(device, today, _versions(), provenance, tuple(rows))


def record_report(path: Path):
    """Measure, write the recording atomically, and report its rows."""
    from softcapgrad.files import write_atomic
    from softcapgrad.report import Report, Table

    recording = measure()
    write_atomic(path, dumps(recording))
    rows = [{"path": r.path, "site": r.site, "scores": r.scores, "cap": r.cap, "quantity": r.quantity,
             "value": r.value, "monotone": r.monotone} for r in recording.rows]
    return Report(
        command="stacks",
        params={"record": str(path), "device": recording.device, "versions": recording.versions},
        tables=(Table("rows", f"recorded on {recording.device}", rows,
                      ("path", "scores", "cap", "quantity", "value", "monotone"), wide=("site",)),),
        notes=(f"wrote {path}", recording.provenance),
        answer=(f"Measured {len(rows)} rows on {recording.device} (torch {recording.versions['torch']}) and wrote {path}.",),
    )
