"""The census: every soft-cap and gate in the installed transformers, found by running each model type tiny.

Which model types to run is chosen by a static scan of the installed modeling sources (a ``tanh(``,
``softplus`` or ``sigmoid(`` in a ``modeling_*.py``: every model type whose configuration lives in
that folder); what each one caps and gates is decided by running it (``audit-model``'s discovery,
then one forward and backward per attention implementation). A model type that cannot be built or
run is a row with its reason. Nothing is downloaded; the weights are random, seeded.
"""

from __future__ import annotations

import re
import signal
from dataclasses import asdict, dataclass
from pathlib import Path

from softcapgrad.core.checks import InputError
from softcapgrad.models.tiny import address_space

IMPLEMENTATIONS = ("eager", "sdpa")  # flex_attention compiles per model (minutes on a CPU); flash-attn needs CUDA
OPS = {"tanh": r"\btanh\(", "softplus": r"softplus", "sigmoid": r"\bsigmoid\("}
SHAPE = (2, 8)  # batch and tokens of the census's own forward and backward
SECONDS = 120  # one model type's budget; past it the row says so
HEADROOM = 6 << 30  # bytes of address space a model type may add: past it an allocation fails, a row says so


@dataclass(frozen=True)
class Candidate:
    model_type: str
    folder: str  # transformers/models/<folder>
    ops: tuple  # which of OPS its modeling sources hold


def _models_dir() -> Path:
    import transformers

    return Path(transformers.__file__).parent / "models"


def candidates() -> list[Candidate]:
    """Model types whose modeling sources hold a tanh, softplus or sigmoid call (static; the run decides)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    root = _models_dir()
    flagged: dict[str, tuple] = {}
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        text = "\n".join(f.read_text(encoding="utf-8", errors="replace") for f in sorted(folder.glob("modeling_*.py")))
        ops = tuple(name for name, pattern in OPS.items() if re.search(pattern, text))
        if ops:
            flagged[folder.name] = ops
    out = []
    for model_type, class_name in sorted(CONFIG_MAPPING_NAMES.items()):
        folder = _folder_of(model_type, class_name)
        if folder in flagged:
            out.append(Candidate(model_type, folder, flagged[folder]))
    return out


def _folder_of(model_type: str, class_name: str) -> str | None:
    import transformers

    cls = getattr(transformers, class_name, None)
    module = getattr(cls, "__module__", "") or ""
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[1] == "models" else None


@dataclass(frozen=True)
class Row:
    model_type: str
    folder: str
    ops: tuple  # what the static scan found
    status: str  # audited | cannot build | cannot run | timed out | internal error
    reason: str  # one line, for every status but audited
    model_class: str
    implementations: dict  # implementation -> its run status
    caps: list  # dicts: field, cap, status, per implementation verdict, dtype, first_zero_grad_input, modules
    gates: list  # dicts: the contract


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout


def _clean(text: str) -> str:
    """One line without machine paths (the library's folder as ``transformers/``, other paths by file name) or
    object addresses (a number of nine digits or more, which changes from run to run)."""
    text = re.sub(r"\b\d{9,}\b", "<address>", " ".join(text.split()))
    text = re.sub(r"(/[^\s:'\"]+)+/(transformers/)", r"\2", text)
    return re.sub(r"/(?:[^\s/:'\"]+/)+([^\s/:'\"]+)", r"\1", text)[:240]


def census_row(candidate: Candidate, implementations=IMPLEMENTATIONS, seconds: int = SECONDS) -> Row:
    """One model type, audited tiny (never raises: every failure is the row's status and reason)."""
    import torch

    from softcapgrad.models import audit
    from softcapgrad.models.audit_report import config_rows, site_rows

    def row(status, reason="", model_class="", runs=None, caps=(), gates=()):
        return Row(candidate.model_type, candidate.folder, candidate.ops, status, _clean(reason), model_class,
                   runs or {}, list(caps), list(gates))

    previous = signal.signal(signal.SIGALRM, _alarm) if seconds else None
    if seconds:
        signal.alarm(seconds)
    try:
        try:
            src = audit.source(None, candidate.model_type, [])
        except InputError as err:
            return row("cannot build", str(err))
        ids = torch.randint(0, audit.text_tokens(src.config), SHAPE, generator=torch.Generator().manual_seed(0))
        try:
            result = audit.audit(src, list(implementations), audit.Batch(ids, 1.0, None, 0, "cpu"), "bfloat16")
        except InputError as err:
            return row("cannot run", str(err))
        sites = site_rows(result)
        caps = []
        for c in config_rows(result):
            eager = [s for s in sites if s["implementation"] == "eager" and s["field"] == c["field"]]
            caps.append({
                "field": c["field"], "cap": c["cap"], "status": c["status"], "modules": c["modules"],
                "divisor": c["divisor"], "dtype": c["dtype"],
                "first_zero_grad_input": eager[0]["first_zero_grad_input"] if eager else None,
                **{i: c[i] for i in implementations}, "evidence": _clean(c["evidence"]),
            })
        runs = {r.implementation: r.status + (f": {_clean(r.reason)}" if r.reason else "") for r in result.runs}
        return row("audited", "", result.model, runs, caps, [asdict(g) for g in result.gates])
    except _Timeout:
        return row("timed out", f"past {seconds} s on this machine")
    except Exception as err:  # noqa: BLE001 -- the census records it; the tests require there be none
        return row("internal error", f"{type(err).__name__}: {err}")
    finally:
        if seconds:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)


@dataclass(frozen=True)
class Census:
    transformers: str
    torch: str
    implementations: tuple
    rows: list

    def counts(self) -> dict:
        rows = self.rows
        caps = [c for r in rows for c in r.caps]
        return {
            "candidates": len(rows),
            "audited": sum(r.status == "audited" for r in rows),
            "not audited": sum(r.status != "audited" for r in rows),
            "model types that apply a cap": sum(any(c["status"] == "applied" for c in r.caps) for r in rows),
            "model types with a cap field": sum(any(c["field"] != "(hard-coded)" for c in r.caps) for r in rows),
            "caps applied": sum(c["status"] == "applied" for c in caps),
            "caps off": sum(c["status"] == "off" for c in caps),
            "caps dead config": sum(c["status"] == "dead config" for c in caps),
            "hard-coded capped tanh": sum(c["status"] == "hard-coded" for c in caps),
            "model types with a gate": sum(bool(r.gates) for r in rows),
            "gate sites": sum(len(r.gates) for r in rows),
        }

    def dead(self) -> list[tuple[str, str, float | None]]:
        return [(r.model_type, c["field"], c["cap"]) for r in self.rows for c in r.caps if c["status"] == "dead config"]


def census(model_types: list[str] | None = None, implementations=IMPLEMENTATIONS, seconds: int = SECONDS,
           advance=None) -> Census:
    """The census over ``model_types`` (default: every static candidate), in model-type order."""
    import torch
    import transformers

    chosen = candidates()
    if model_types is not None:
        known = {c.model_type: c for c in chosen}
        missing = [m for m in model_types if m not in known]
        if missing:
            raise InputError(f"--model-type {missing[0]}: not a model type whose modeling source has a tanh, softplus "
                             "or sigmoid in this transformers")
        chosen = [known[m] for m in model_types]
    rows = []
    with address_space(HEADROOM):
        for c in chosen:
            rows.append(census_row(c, implementations, seconds))
            if advance is not None:
                advance(1)
    return Census(transformers.__version__, torch.__version__.split("+")[0], tuple(implementations), rows)


def as_dict(c: Census) -> dict:
    return {"transformers": c.transformers, "torch": c.torch, "implementations": list(c.implementations),
            "shape": list(SHAPE), "dtype": "bfloat16", "counts": c.counts(),
            "dead_config": [{"model_type": m, "field": f, "cap": v} for m, f, v in c.dead()],
            "rows": [asdict(r) for r in c.rows]}


def _cell(value) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value).replace("|", "\\|")


def markdown(c: Census) -> str:
    """results/census.md: the counts, the caps per model type, the gate contracts, the model types not audited."""
    counts = c.counts()
    impl = list(c.implementations)
    lines = [
        "# Soft-caps and gates in transformers, found by running",
        "",
        f"transformers {c.transformers}, torch {c.torch} (CPU), every model type tiny with random seeded weights, "
        f"bf16, batch {SHAPE[0]} × {SHAPE[1]} tokens, attention implementations {', '.join(impl)}. "
        "Regenerate with `make census`.",
        "",
        f"Of {counts['candidates']} model types whose modeling source calls tanh, softplus or sigmoid, "
        f"{counts['audited']} built and ran; {counts['model types that apply a cap']} apply a tanh soft-cap from "
        f"their configuration; dead config (a cap set, applied by no implementation): {counts['caps dead config']}; "
        f"off at their default (0 or unset, the code skips the cap): {counts['caps off']}; "
        f"{counts['model types with a gate']} model types have softplus or sigmoid sites "
        f"({counts['gate sites']} contracts).",
        "",
        "| count | value |",
        "| --- | ---: |",
        *(f"| {k} | {v} |" for k, v in counts.items()),
        "",
        "## Caps",
        "",
        "A field is a cap when moving it moves a tanh's divisor (applied), when setting it from 0 or unset makes a "
        "capped tanh run (off), or, named like a cap, when it moves nothing (dead config; unused when unset).",
        "",
        "| model type | field | value | status | " + " | ".join(impl) + " | format | first zero-grad input | where |",
        "| --- | --- | ---: | --- | " + " | ".join("---" for _ in impl) + " | --- | ---: | --- |",
    ]
    for r in c.rows:
        for cap in r.caps:
            lines.append(f"| {r.model_type} | {_cell(cap['field'])} | {_cell(cap['cap'])} | {cap['status']} | "
                         + " | ".join(_cell(cap.get(i)) for i in impl)
                         + f" | {_cell(cap['dtype'])} | {_cell(cap['first_zero_grad_input'])} | {_cell(cap['modules'])} |")
    lines += [
        "",
        "## Dead config",
        "",
        *([f"- {m}: `{f}` = {_cell(v)}" for m, f, v in c.dead()] or ["- none"]),
        "",
        "## Gates: softplus and sigmoid contracts",
        "",
        "Shapes from a forward of batch 3 × 7 tokens, axes named by the tiny configuration's sizes; `runs in` is the "
        "format the op ran in, `cast to` the one it is cast to before its consumer.",
        "",
        "| model type | module | fn | source | shape | broadcast over | runs in | cast to | consumer | role |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in c.rows:
        for g in r.gates:
            lines.append(f"| {r.model_type} | {_cell(g['module'])} | {g['fn']} | {_cell(g['source'])} | {g['shape']} | "
                         f"{_cell(g['broadcast'])} | {g['runs_in']} | {_cell(g['cast_to'] or '—')} | "
                         f"{_cell(g['consumer'])} | {_cell(g['role'])} |")
    lines += [
        "",
        "## Not audited",
        "",
        "| model type | status | reason |",
        "| --- | --- | --- |",
        *(f"| {r.model_type} | {r.status} | {_cell(r.reason)} |" for r in c.rows if r.status != "audited"),
        "",
    ]
    return "\n".join(lines)
