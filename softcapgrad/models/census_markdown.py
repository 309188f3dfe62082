"""census.md: the census's rows as tables, the refusals by kind, the gates apart from activations."""

from __future__ import annotations

from softcapgrad.models.census_kinds import SHAPE, _kind, refusal_kind


def _cell(value) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value).replace("|", "\\|")


def markdown(c) -> str:
    """results/census.md of a ``census.Census``: the counts, the caps per model type, the gate contracts, the model types not audited."""
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
        "The last column is what the tiny configuration that ran set other than by shrinking: the type's own "
        "overrides and the repairs its class or its first forward asked for (″: as above).",
        "",
        "| model type | field | value | status | " + " | ".join(impl) + " | format | first zero-grad input | where "
        "| tiny configuration changed |",
        "| --- | --- | ---: | --- | " + " | ".join("---" for _ in impl) + " | --- | ---: | --- | --- |",
    ]
    for r in c.rows:
        for n, cap in enumerate(r.caps):
            changed = "; ".join(r.changes) if n == 0 and r.changes else ("″" if r.changes else "—")
            lines.append(f"| {r.model_type} | {_cell(cap['field'])} | {_cell(cap['cap'])} | {cap['status']} | "
                         + " | ".join(_cell(cap.get(i)) for i in impl)
                         + f" | {_cell(cap['dtype'])} | {_cell(cap['first_zero_grad_input'])} | {_cell(cap['modules'])} "
                         f"| {_cell(changed)} |")
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
        for g in (g for g in r.gates if _kind(g) == "gate"):
            lines.append(f"| {r.model_type} | {_cell(g['module'])} | {g['fn']} | {_cell(g['source'])} | {g['shape']} | "
                         f"{_cell(g['broadcast'])} | {g['runs_in']} | {_cell(g['cast_to'] or '—')} | "
                         f"{_cell(g['consumer'])} | {_cell(g['role'])} |")
    lines += [
        "",
        "## Activations and attention-sink rescales: sigmoid sites that are not gates",
        "",
        "An activation scales its own input by its sigmoid (x·σ(αx): QuickGELU, a clamped GLU); an attention-sink "
        "rescale multiplies the attention output by σ(logsumexp − sink).",
        "",
        "| model type | module | kind | source | shape | operand | count |",
        "| --- | --- | --- | --- | --- | --- | ---: |",
        *(f"| {r.model_type} | {_cell(g['module'])} | {_kind(g)} | {_cell(g['source'])} | {g['shape']} | "
          f"{_cell(g['operand'])} | {g['count']} |" for r in c.rows for g in r.gates if _kind(g) != "gate"),
        "",
        "## Tiny configurations changed",
        "",
        "| model type | status | changed |",
        "| --- | --- | --- |",
        *(f"| {r.model_type} | {r.status} | {_cell('; '.join(r.changes))} |" for r in c.rows if r.changes),
        "",
        "## Not audited",
        "",
        "| kind | model types |",
        "| --- | ---: |",
        *(f"| {k} | {n} |" for k, n in c.refusals().items()),
        "",
        "| model type | status | kind | reason |",
        "| --- | --- | --- | --- |",
        *(f"| {r.model_type} | {r.status} | {refusal_kind(r)} | {_cell(r.reason)} |" for r in c.rows
          if r.status != "audited"),
        "",
    ]
    return "\n".join(lines)
