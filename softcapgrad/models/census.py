"""The census: every soft-cap and gate in the installed transformers, found by running each model type tiny.

Which model types to run is chosen by a static scan of the installed modeling sources (a ``tanh(``,
``softplus`` or ``sigmoid(`` in a ``modeling_*.py``: every model type whose configuration lives in
that folder); what each one caps and gates is decided by running it (``audit-model``'s discovery,
then one forward and backward per attention implementation). A model type that cannot be built or
run is a row with its reason, and a row says which fields its tiny configuration set other than by
shrinking (an override, a repair). Nothing is downloaded; the weights are random, seeded. Each type's
budget is CPU time of its own process (a busy machine slows the clock on the wall, not the work), and
the types can be shared among worker processes: the files come out the same either way.
"""

from __future__ import annotations

import json
import re
import signal
from dataclasses import asdict, dataclass
from pathlib import Path

from softcapgrad.core.checks import InputError
from softcapgrad.models.census_kinds import REFUSALS, SHAPE, _kind, refusal_kind  # noqa: F401 -- old addresses
from softcapgrad.models.tiny import address_space

IMPLEMENTATIONS = ("eager", "sdpa")  # flex_attention compiles per model (minutes on a CPU); flash-attn needs CUDA
OPS = {"tanh": r"\btanh\(", "softplus": r"softplus", "sigmoid": r"\bsigmoid\("}
CPU_SECONDS = 120  # one model type's budget in CPU time (user + system), not wall-clock time: the same on a busy
# machine. The costliest tiny row takes about 20 s of CPU; a row past six times that is a model that is not tiny.
SECONDS = CPU_SECONDS  # the old name
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
    """Model types whose modeling sources hold a tanh, softplus or sigmoid call (static; the run decides).

    A configuration class registered under two model types (``evolla`` and ``EvollaModel``) is one
    candidate, under its lower-case name. Folders come from the library's own type -> module rule,
    so no configuration module is imported here.
    """
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES, model_type_to_module_name

    root = _models_dir()
    flagged: dict[str, tuple] = {}
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        text = "\n".join(f.read_text(encoding="utf-8", errors="replace") for f in sorted(folder.glob("modeling_*.py")))
        ops = tuple(name for name, pattern in OPS.items() if re.search(pattern, text))
        if ops:
            flagged[folder.name] = ops
    out, classes = [], set()
    for model_type, class_name in sorted(CONFIG_MAPPING_NAMES.items(), key=lambda kv: (kv[0] != kv[0].lower(), kv[0])):
        folder = model_type_to_module_name(model_type).removeprefix("deprecated.")
        if folder in flagged and class_name not in classes:
            classes.add(class_name)
            out.append(Candidate(model_type, folder, flagged[folder]))
    return sorted(out, key=lambda c: c.model_type)


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
    gates: list  # dicts: the contract (kind: gate, activation, attention-sink rescale)
    changes: list = ()  # the tiny configuration's fields set other than by shrinking: overrides, repairs


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout


class _CpuBudget:
    """Raise _Timeout in this process after ``seconds`` of its own CPU time (SIGPROF counts user + system time,
    so a loaded machine, which slows the wall clock, does not bring the end nearer)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __enter__(self):
        if self.seconds:
            self.previous = signal.signal(signal.SIGPROF, _alarm)
            signal.setitimer(signal.ITIMER_PROF, self.seconds)
        return self

    def __exit__(self, *exc) -> None:
        if self.seconds:
            signal.setitimer(signal.ITIMER_PROF, 0)
            signal.signal(signal.SIGPROF, self.previous)


def _clean(text: str) -> str:
    """One line without machine paths (the library's folder as ``transformers/``, other paths by file name) or
    object addresses (a number of nine digits or more, which changes from run to run)."""
    text = re.sub(r"\b\d{9,}\b", "<address>", " ".join(text.split()))
    text = re.sub(r"(/[^\s:'\"]+)+/(transformers/)", r"\2", text)
    return re.sub(r"/(?:[^\s/:'\"]+/)+([^\s/:'\"]+)", r"\1", text)[:240]


def census_row(candidate: Candidate, implementations=IMPLEMENTATIONS, seconds: float = CPU_SECONDS) -> Row:
    """One model type, audited tiny (never raises: every failure is the row's status and reason).

    ``seconds`` is CPU time of this process, not wall-clock time (0: no budget)."""
    import torch

    from softcapgrad.models import audit
    from softcapgrad.models.audit_report import config_rows, site_rows

    changes: list = []

    def row(status, reason="", model_class="", runs=None, caps=(), gates=()):
        return Row(candidate.model_type, candidate.folder, candidate.ops, status, _clean(reason), model_class,
                   runs or {}, list(caps), list(gates), [_clean(c) for c in changes])

    try:
        with _CpuBudget(seconds):
            try:
                config = audit.model_type_config(candidate.model_type, {}, changes)
            except InputError as err:
                return row("cannot build", str(err))
            src = audit.Source(config, None, False, changes=tuple(changes))
            ids = torch.randint(0, audit.text_tokens(src.config), SHAPE, generator=torch.Generator().manual_seed(0))
            batch = audit.Batch(ids, 1.0, None, 0, "cpu")
            try:
                result = audit.audit(src, list(implementations), batch, "bfloat16")
            except InputError as err:
                mix = audit.mixed_formats(src, batch)  # decided by the tensors an op was given, not by the error
                if mix is None:
                    return row("cannot run", str(err))
                changes.append(f"run in float32: {audit.MIXED_FORMATS} ({mix.said()})")
                try:
                    result = audit.audit(src, list(implementations), batch, "float32")
                except InputError as err2:
                    return row("cannot run", str(err2))
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
        return row("timed out", f"past {seconds:g} s of CPU time: not a tiny model")
    except Exception as err:  # noqa: BLE001 -- the census records it; the tests require there be none
        return row("internal error", f"{type(err).__name__}: {err}")


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
            "model types with a gate": sum(any(_kind(g) == "gate" for g in r.gates) for r in rows),
            "gate sites": sum(_kind(g) == "gate" for r in rows for g in r.gates),
            "activation sites (x·σ(αx), not gates)": sum(_kind(g) == "activation" for r in rows for g in r.gates),
            "attention-sink rescales": sum(_kind(g) == "attention-sink rescale" for r in rows for g in r.gates),
            "audited with a changed tiny configuration": sum(bool(r.changes) for r in rows if r.status == "audited"),
        }

    def refusals(self) -> dict[str, int]:
        """Model types not audited, by the kind of reason (most first)."""
        kinds: dict[str, int] = {}
        for r in self.rows:
            if r.status != "audited":
                kinds[refusal_kind(r)] = kinds.get(refusal_kind(r), 0) + 1
        return dict(sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0])))

    def dead(self) -> list[tuple[str, str, float | None]]:
        return [(r.model_type, c["field"], c["cap"]) for r in self.rows for c in r.caps if c["status"] == "dead config"]


def census(model_types: list[str] | None = None, implementations=IMPLEMENTATIONS, seconds: float = CPU_SECONDS,
           advance=None, workers: int = 1) -> Census:
    """The census over ``model_types`` (default: every static candidate), in model-type order.

    With ``workers`` > 1 the model types are shared among that many fresh processes, each type in
    the one of index ``i % workers`` (a fixed split); a row depends only on its model type either way.
    """
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
    workers = max(1, min(workers, len(chosen)))
    if workers == 1:
        rows = _rows(chosen, tuple(implementations), seconds, advance)
    else:
        rows = _in_workers(chosen, tuple(implementations), seconds, advance, workers)
    return Census(transformers.__version__, torch.__version__.split("+")[0], tuple(implementations), rows)


def from_json(line: str) -> Row:
    d = json.loads(line)
    return Row(**{**d, "ops": tuple(d["ops"])})


def _plain(row: Row) -> Row:
    """The row as its JSON gives it back (lists for tuples): the same whether it was made here or in a worker."""
    return from_json(json.dumps(asdict(row)))


def _rows(chosen, implementations, seconds, advance=None) -> list:
    rows = []
    with address_space(HEADROOM):
        for c in chosen:
            rows.append(_plain(census_row(c, implementations, seconds)))
            if advance is not None:
                advance(1)
    return rows


def _in_workers(chosen, implementations, seconds, advance, workers: int) -> list:
    """The model types shared among isolated child processes (softcapgrad.core.child), rows back as JSON lines."""
    import contextlib
    import queue
    import threading

    from softcapgrad.core import child

    shares = [chosen[k::workers] for k in range(workers)]
    lines: queue.Queue = queue.Queue()

    def read(k, process):
        for line in process.stdout:
            lines.put((k, line))
        lines.put((k, None))

    rows = []
    with contextlib.ExitStack() as stack:
        processes = [stack.enter_context(child.started("softcapgrad.models.census_worker")) for _ in shares]
        for process, share in zip(processes, shares):
            process.stdin.write(json.dumps({"model_types": [c.model_type for c in share],
                                            "implementations": list(implementations), "seconds": seconds}))
            process.stdin.close()
            threading.Thread(target=read, args=(len(rows), process), daemon=True).start()
            rows.append([])
        open_ = len(processes)
        while open_:
            k, line = lines.get()
            if line is None:
                open_ -= 1
                continue
            rows[k].append(from_json(line))
            if advance is not None:
                advance(1)
        for k, (process, share) in enumerate(zip(processes, shares)):
            if process.wait() != 0 or len(rows[k]) != len(share):
                raise RuntimeError(f"census worker {k} exited {process.returncode} after {len(rows[k])} of "
                                   f"{len(share)} model types: {child.stderr(process)}")
    order = {c.model_type: i for i, c in enumerate(chosen)}
    return sorted((r for share in rows for r in share), key=lambda r: order[r.model_type])


def as_dict(c: Census) -> dict:
    return {"transformers": c.transformers, "torch": c.torch, "implementations": list(c.implementations),
            "shape": list(SHAPE), "dtype": "bfloat16", "cpu_seconds_per_type": CPU_SECONDS, "counts": c.counts(),
            "not_audited_by_kind": c.refusals(),
            "dead_config": [{"model_type": m, "field": f, "cap": v} for m, f, v in c.dead()],
            "rows": [asdict(r) for r in c.rows]}


def markdown(c: Census) -> str:
    """census.md (models/census_markdown.py)."""
    from softcapgrad.models.census_markdown import markdown as render

    return render(c)
