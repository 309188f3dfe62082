"""The reports over the real stacks: ``horizon --path`` (first zero-gradient input per stack, scores
format and cap) and ``stacks`` (what each stack computes and where its figures come from here)."""

from __future__ import annotations

from softcapgrad.laws import formats
from softcapgrad.stacks import recording as recorded
from softcapgrad.core.checks import InputError
from softcapgrad.core.report import Report, Table
from softcapgrad.stacks.registry import (
    ALIASES, REMEDIES, STACKS, Sigmoid, first_zero, resolve_path, resolve_scores, runs_here
)

SHORT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
DEFAULT_SCORES = ("bfloat16", "float32")
REMEDY_CAP = 30.0  # the cap at which ``stacks`` shows where each remedy's gradient first becomes 0
BASELINE = "torch-eager-cpu"  # the plain cap the remedies are set against


def _row(path: str, scores: str, c: float, sigmoid: Sigmoid) -> dict:
    r = first_zero(path, scores, c, sigmoid)
    return {"path": r.path, "scores": r.scores, "cap": c, "first_zero_grad_input": r.value,
            "saturated_run_start": r.saturated_run_start, "last_nonzero_grad_input": r.last_unsaturated,
            "monotone": r.monotone, "source": r.source, "reason": r.reason}


def _span(mine: list[dict]) -> str:
    """'a = lo (path) to hi (path)' over some rows of one scores format and cap."""
    lo = min(mine, key=lambda r: r["first_zero_grad_input"])
    hi = max(mine, key=lambda r: r["first_zero_grad_input"])
    first = f"a = {lo['first_zero_grad_input']:.8g} ({lo['path']})"
    return first if lo is hi else f"{first} to {hi['first_zero_grad_input']:.8g} ({hi['path']})"


def _answer(rows: list[dict]) -> tuple[str, ...]:
    """The range over every row of the tables, and, when sigmoid or remedy rows widen it, the tanh stacks' own."""
    found = [r for r in rows if r["first_zero_grad_input"] is not None]
    sentences = []
    for scores in dict.fromkeys(r["scores"] for r in found):
        parts = []
        for c in dict.fromkeys(r["cap"] for r in found if r["scores"] == scores):
            mine = [r for r in found if r["scores"] == scores and r["cap"] == c]
            plain = [r for r in mine if STACKS[r["path"]].fn == "tanh"]
            part = f"at c = {c:g} from {_span(mine)}"
            if plain and len(plain) < len(mine):
                part += f" (the plain tanh stacks: from {_span(plain)})"
            parts.append(part)
        sentences.append(f"With {scores} scores the gradient through the cap is exactly 0 " + "; ".join(parts) + ".")
    odd = sorted({r["path"] for r in found if r["monotone"] is False})
    missing = sum(r["first_zero_grad_input"] is None for r in rows)
    tail = []
    if odd:
        tail.append(f"The dead zone is not monotone on {', '.join(odd)} (zeros come and go before the run that lasts)")
    if missing:
        cells = f"{missing} cell{'s' if missing > 1 else ''} of the table{'s' if len(sentences) > 1 else ''}"
        tail.append(f"{cells} {'have' if missing > 1 else 'has'} no figure here (see the source column)")
    if not found:
        sentences.append("No stack asked for has a figure here at these caps.")
    if tail:
        sentences.append("; ".join(tail[:1] + [t[0].lower() + t[1:] for t in tail[1:]]) + ".")
    return tuple(sentences)


def by_cap(rows: list[dict], scores: str) -> list[dict]:
    """One row per stack for one scores format, a column per cap: the table a person reads.

    monotone: no if any cap's dead zone is not, — if one has no figure; source: each distinct one.
    """
    grouped: dict[str, list[dict]] = {}
    for r in rows:
        if r["scores"] == scores:
            grouped.setdefault(r["path"], []).append(r)
    out = []
    for path, mine in grouped.items():
        flags = [r["monotone"] for r in mine]
        monotone = False if False in flags else (None if None in flags else True)
        out.append({"path": path, **{f"c = {r['cap']:g}": r["first_zero_grad_input"] for r in mine},
                    "monotone": monotone, "source": " / ".join(dict.fromkeys(r["source"] for r in mine))})
    return out


def horizon_paths_report(paths: list[str], scores: list[str] | None, caps: list[float], sigmoid: Sigmoid,
                         every: bool = False) -> Report:
    """One row per stack, scores format and cap. An old recipe name fixes its stack's format. ``every``: the paths
    are all the stacks, and one that takes none of the formats asked for is left out rather than refused."""
    rows, notes, shown = [], [], {}
    wanted = [formats.canonical_name(s) for s in scores] if scores else list(DEFAULT_SCORES)
    plan = []
    for name in paths:  # every name checked before anything runs
        stack, fixed = resolve_path(name)
        if fixed and scores and fixed not in wanted:  # an old recipe name fixes its format: never dropped
            resolve_scores(name, scores[0], "--scores")
        chosen = [fixed] if fixed else [f for f in wanted if f in stack.formats]
        if not chosen and every:
            continue
        if not chosen:
            raise InputError(f"--path {name} takes {', '.join(stack.formats)} scores; --scores gave {', '.join(wanted)}")
        plan.append((name, stack, fixed, chosen))
    for name, stack, fixed, chosen in plan:
        shown[stack.name] = stack
        if fixed:
            notes.append(f"{name} is {stack.name} with {fixed} scores (the recipe it named runs exactly this code)")
        for fmt in chosen:
            rows.extend(_row(stack.name, fmt, c, sigmoid) for c in caps)
    rec = recorded.packaged()
    checks = [{"path": r.path, "site": r.site, "scores": r.scores, "cap": r.cap, "first_zero_grad_input": r.value,
               "monotone": r.monotone} for r in rec.rows
              if r.path in shown and r.site != recorded.FORMULA and r.quantity == "first_zero_grad_input"]
    notes += [f"{s.name}: {s.computes}" for s in shown.values()]
    notes += [
        "first zero-grad input: the first value of the scores format whose gradient through the stack's cap is exactly "
        "0 (upstream gradient of ones); saturated from: where the run of zeros that lasts begins",
        "source: measured here by running the library, recorded on a device (the packaged recording, its date and "
        "versions in the JSON 'reason'), or not measured, with the reason",
    ]
    return Report(
        command="horizon",
        params={"paths": paths, "scores": wanted, "caps": caps, "sigmoid": sigmoid.__dict__},
        tables=(
            Table("rows", "first zero-gradient input per stack, scores format and cap", rows, show=False),
            *(Table(f"{fmt}_scores", f"{fmt} scores: the first input whose gradient through the cap is exactly 0",
                    by_cap(rows, fmt), ("path", *(f"c = {c:g}" for c in caps), "monotone", "source"), digits=9)
              for fmt in dict.fromkeys(r["scores"] for r in rows)),
            Table("model_checks", f"the same stacks inside transformers' code, recorded on {rec.device}", checks,
                  ("site", "path", "scores", "cap", "first_zero_grad_input"), digits=9),
        ),
        notes=tuple(notes),
        answer=_answer(rows),
    )


def remedy_rows(c: float = REMEDY_CAP) -> list[dict]:
    """Per remedy stack and scores format, the first input whose gradient is exactly 0, found by running the
    remedy (or its recording), beside the plain eager cap's."""
    rows = []
    for s in STACKS.values():
        if s.fn not in REMEDIES:
            continue
        for fmt in s.formats:
            r, plain = first_zero(s.name, fmt, c), first_zero(BASELINE, fmt, c)
            rows.append({"path": s.name, "scores": SHORT[fmt], "cap": c, "first_zero_grad_input": r.value,
                         "eager_first_zero_grad_input": plain.value, "monotone": r.monotone, "source": r.source,
                         "reason": r.reason})
    return rows


def _remedy_sentence(rows: list[dict]) -> str:
    def at(v) -> str:
        return "nowhere" if v is None else f"{v:.6g}"

    parts = [f"{path} " + ", ".join(f"{r['scores']} {at(r['first_zero_grad_input'])}" for r in rows if r["path"] == path)
             for path in dict.fromkeys(r["path"] for r in rows)]
    eager = ", ".join(f"{r['scores']} {at(r['eager_first_zero_grad_input'])}"
                      for r in rows if r["path"] == rows[0]["path"])
    return (f"At c = {rows[0]['cap']:g} the remedies' gradients first become exactly 0 at a = " + "; ".join(parts)
            + f" (the plain {BASELINE}: {eager}).")


GATE_FORMATS = ("bfloat16", "float16", "float32")


def gate_stack_rows(upstream: float = 1.0, loss_scale: float = 1.0) -> list[dict]:
    """The sigmoid and softplus gates on torch eager CPU: per format and side, the first input whose autograd
    gradient is exactly 0 (softcapgrad.stacks.gates) for the upstream G·S rounded to the format (refused in one line
    where that is 0 or ∞ there), beside the correctly rounded law's (G·S = 1) or torch's formula's."""
    from softcapgrad.stacks import gates

    g = {name: gates.upstream_checked(formats.resolve(name), upstream, loss_scale) for name in GATE_FORMATS}
    return [r for fn in ("sigmoid", "softplus") for name in GATE_FORMATS
            for r in gates.gate_rows(formats.resolve(name), fn, ["eager"], g=g[name])]


def _gate_sentence(rows: list[dict]) -> str:
    at = {(r["fn"], r["side"]): r["first_zero_grad_input"] for r in rows if r["dtype"] == "bfloat16"}
    g = next(r["upstream"] for r in rows if r["dtype"] == "bfloat16")

    def x(key) -> str:
        return "never" if at[key] is None else f"from x = {at[key]:g}"

    if g != 1.0:  # the product underflows first: not where σ is stored as 1 or 0
        return (f"The gates (torch eager CPU, bf16, upstream g = {g:.8g}): a sigmoid gate's gradient is first exactly 0 "
                f"{x(('sigmoid', '+'))} and {x(('sigmoid', '−'))}; a softplus gate's {x(('softplus', '−'))} and "
                f"{x(('softplus', '+'))} for x > 0 (every_zero_from in the wide table: from where every gradient is 0).")
    return (f"The gates (torch eager CPU, bf16): a sigmoid gate's gradient is exactly 0 {x(('sigmoid', '+'))} "
            f"(stuck open) and {x(('sigmoid', '−'))} (stuck shut); a softplus gate's {x(('softplus', '−'))} "
            f"only, {x(('softplus', '+'))} for x > 0.")


def stacks_report(upstream: float = 1.0, loss_scale: float = 1.0) -> Report:
    """Every stack: its device, the score formats it takes, where its figures come from on this machine, and
    where each remedy's gradient first becomes 0 per scores format."""
    rec = recorded.packaged()
    rows = []
    in_recording = {r.path for r in rec.rows}
    for s in STACKS.values():
        why = runs_here(s)
        source = "measured" if not why else rec.source if s.name in in_recording else "not measured"
        rows.append({"path": s.name, "device": s.device, "scores": ", ".join(SHORT[f] for f in s.formats),
                     "source": source, "reason": why, "computes": s.computes})
    live = [r["path"] for r in rows if r["source"] == "measured"]
    absent = {r["reason"]: [x["path"] for x in rows if x["reason"] == r["reason"]]
              for r in rows if r["source"] == "not measured"}
    remedies = remedy_rows()
    gates = gate_stack_rows(upstream, loss_scale)
    return Report(
        command="stacks",
        params={"recording": {"device": rec.device, "date": rec.date, "versions": rec.versions}, "remedy_cap": REMEDY_CAP,
                "upstream": upstream, "loss_scale": loss_scale},
        tables=(Table("rows", "the real stacks", rows, ("path", "device", "scores", "source"), wide=("reason", "computes")),
                Table("remedies", f"the first input whose gradient through each remedy is exactly 0 (c = {REMEDY_CAP:g}), "
                                  f"beside {BASELINE}'s", remedies,
                      ("path", "scores", "first_zero_grad_input", "eager_first_zero_grad_input", "source"),
                      wide=("monotone", "reason"), digits=9),
                Table("gates", "the first input whose autograd gradient through torch's sigmoid / softplus is exactly "
                               "0 (eager CPU), beside the correctly rounded law's", gates,
                      ("fn", "dtype", "side", "first_zero_grad_input", "law_exact", "agrees_with"),
                      wide=("law_torch_formula", "every_zero_from", "monotone", "upstream", "source"), digits=9)),
        notes=(*(f"{s.name}: {s.computes}" for s in STACKS.values()),
               f"old recipe names: {', '.join(f'{k} = {v[0]} ({SHORT[v[1]]})' for k, v in ALIASES.items())}",
               f"recording: {rec.provenance}",
               "gates: torch.sigmoid(x) / torch.nn.functional.softplus(x) differentiated by autograd over every value "
               "of the format (bisection for float32), upstream ones (--upstream G --loss-scale S: G·S in float64 rounded "
               "once to each format); law exact (G·S = 1 only): where a correctly rounded σ is "
               "stored as 1.0 or 0 (softcapgrad knee --fn sigmoid|softplus); compiled: softcapgrad horizon --fn"),
        answer=(f"{len(live)} of {len(rows)} stacks run on this machine and are measured live; the others come from "
                f"the recording made on {rec.device} on {rec.date} (torch {rec.versions.get('torch', '?')})"
                + "".join(f"; {', '.join(paths)}: {why}" for why, paths in absent.items()) + ".",
                _remedy_sentence(remedies), _gate_sentence(gates)),
    )
