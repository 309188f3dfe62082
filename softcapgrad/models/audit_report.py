"""The audit-model report: one row per soft-cap site and path, one per cap field, one per gate contract.

A cap the monitor saw is a row of the monitor's (module, format, first zero-gradient input, share
of the batch past it). A cap an implementation applies where the monitor cannot see it (a compiled
kernel) is one row with that path's dead zone and the share of the eager pre-cap values past it.
One cap is one row per implementation, never both.
"""

from __future__ import annotations

import math

HIDDEN_PATH = {"flex_attention": "flex-attention", "flash_attention_2": "tanh-approx"}  # flash-attn caps with tanh.approx.f32


def kind_of_site(module: str, root: str) -> str:
    """A label for the figure's colours: attention scores, the final logits, or another tensor."""
    last = module.rsplit(".", 1)[-1].lower()
    if "attn" in last or "attention" in last:
        return "attention"
    return "final logits" if module == root or last in ("logit_softcap", "lm_head") else "other"


def _field_of(result, module: str, cap: float | None) -> str:
    from softcapgrad.models.trace import layerless

    for c in result.caps:
        if c.divisor is not None and cap is not None and math.isclose(c.divisor, cap, rel_tol=1e-5) \
                and layerless(module) in c.modules:
            return c.field or "(hard-coded)"
    return ""


def site_rows(result) -> list[dict]:
    """One row per soft-cap site per implementation: the monitor's, then the applied-but-hidden caps."""
    import torch

    from softcapgrad.models.trace import layerless
    from softcapgrad.stacks.watch import first_zero

    rows = []
    eager = next((r for r in result.runs if r.implementation == "eager" and r.status in ("ran", "forward only")), None)
    for run in result.runs:
        for s in run.sites:
            if s.fn != "tanh" or s.cap is None:  # a tanh of an undivided input is an activation, not a cap
                continue
            rows.append({
                "implementation": run.implementation, "module": s.module, "field": _field_of(result, s.module, s.cap),
                "caps": kind_of_site(s.module, result.model), "cap": s.cap, "dtype": s.dtype, "path": s.path,
                "first_zero_grad_input": s.first_zero_grad_input, "fraction": s.saturated_fraction, "count": s.count,
                "saturated": s.saturated, "zero_grad": s.zero_grad, "max_abs": s.max_abs, "source": s.source,
                "basis": "measured: stored ±1",
            })
        for i, c in enumerate(result.caps):
            if result.verdicts[i].get(run.implementation) != "hidden":
                continue
            path = f"{HIDDEN_PATH.get(run.implementation, 'torch-compile')}-{result.device}"
            divisor = c.divisor if c.divisor is not None else c.value  # no tanh divided by it was traced: its value
            if divisor is None:
                continue
            stack = first_zero(path, "float32", divisor)
            values = [v for (module, cap), v in (eager.inputs.items() if eager else [])
                      if cap is not None and math.isclose(cap, divisor, rel_tol=1e-5) and layerless(module) in c.modules]
            fraction = None
            if values and stack.value is not None:
                a = torch.cat(values).abs() * divisor
                fraction = float((a >= stack.value).double().mean())
            rows.append({
                "implementation": run.implementation, "module": f"(inside {run.implementation}) {', '.join(c.modules)}",
                "field": c.field, "caps": kind_of_site(c.modules[0], result.model) if c.modules else "other",
                "cap": divisor, "dtype": "float32", "path": path, "first_zero_grad_input": stack.value,
                "fraction": fraction, "count": None, "saturated": None, "zero_grad": None,
                "max_abs": None, "source": stack.source or stack.reason,
                "basis": "eager pre-cap values of this batch" if fraction is not None else stack.reason,
            })
    return rows


def field_status(cap, verdicts: dict[str, str]) -> str:
    """Over every implementation: applied (by one at least), dead config (set, every run ignores it), not run, or the cap's own status."""
    if cap.status not in ("applied", "hard-coded", "dead config"):
        return cap.status
    if any(v in ("applied", "hidden") for v in verdicts.values()):
        return "applied"
    return "dead config" if any(v == "ignored" for v in verdicts.values()) else "not run"


def config_rows(result) -> list[dict]:
    """One row per cap: its field, value, status over the implementations, where it runs and each implementation's verdict."""
    implementations = [r.implementation for r in result.runs]
    rows = []
    for i, c in enumerate(result.caps):
        v = result.verdicts[i]
        applied = [k for k in implementations if v[k] == "applied"] + [f"{k} (hidden)" for k in implementations if v[k] == "hidden"]
        row = {"field": c.field or "(hard-coded)", "cap": c.value if c.field else c.divisor, "status": field_status(c, v),
               "modules": ", ".join(c.modules), "divisor": c.divisor, "dtype": c.dtype, "evidence": c.evidence,
               "applied_by": ", ".join(applied), "ignored_by": ", ".join(k for k in implementations if v[k] == "ignored")}
        row.update({k: v[k] for k in implementations})
        rows.append(row)
    return rows


def gate_rows(result) -> list[dict]:
    from dataclasses import asdict

    return [asdict(g) for g in result.gates]


def health_rows(result) -> list[dict]:
    """Gate health from the first run that ran: one row per census gate site (layer indices as *) and format,
    its counts summed over the layers; a softmax counts when it feeds a top-k (a router)."""
    from softcapgrad.models.trace import layerless

    run = next((r for r in result.runs if r.status in ("ran", "forward only")), None)
    census = {(g.module, g.fn) for g in result.gates if g.kind == "gate"}
    merged: dict = {}
    for r in run.gate_health if run else ():
        module = layerless(r.module)
        if r.fn != "softmax" and (module, r.fn) not in census:
            continue
        m = merged.setdefault((module, r.fn, r.dtype), {"row": r, "sums": [0] * 6, "layers": 0})
        m["layers"] += 1
        for count, closed, saturated, backward, zero, mean, *_ in r.per_step:
            for i, v in enumerate((count, closed, saturated, backward, zero, count * mean)):
                m["sums"][i] += v
    rows = []
    for (module, fn, dtype), m in merged.items():
        count, closed, saturated, backward, zero, total = m["sums"]
        r = m["row"]
        rows.append({"implementation": run.implementation, "module": module, "fn": fn, "dtype": dtype,
                     "stuck_open_from": r.stuck_open_from, "stuck_shut_from": r.stuck_shut_from,
                     "closed_share": closed / count if count else 0.0,
                     "saturated_share": saturated / count if count else 0.0,
                     "zero_grad_share": zero / backward if backward else None, "mean_gate": total / count if count else 0.0,
                     "layers": m["layers"], "count": count, "min_input": r.min_input, "max_input": r.max_input,
                     "source": r.source})
    return rows


def _health_sentence(health: list[dict]) -> str:
    if not health:
        return "No gate site of the census ran, and no softmax router (the gate health table)."
    low = [h for h in health if h["dtype"] in ("bfloat16", "float16") and h["stuck_open_from"] is not None]
    worst = max(health, key=lambda h: h["zero_grad_share"] or 0.0)
    return (f"Gate health (the gate health table): {worst['zero_grad_share'] or 0:.2%} of {worst['fn']} at {worst['module']} "
            f"got an exactly-zero gradient" + (f"; {low[0]['fn']} at {low[0]['module']} runs in {low[0]['dtype']}, "
                                                f"stuck open from x = {low[0]['stuck_open_from']:g}" if low else "") + ".")


def _value(row) -> str:
    return row["field"] if row["cap"] is None else f"{row['field']} = {row['cap']:g}"


def answer(result, rows: list[dict], fields: list[dict], gates: list[dict], health: list[dict] = ()) -> tuple[str, ...]:
    ran = [r.implementation for r in result.runs if r.status in ("ran", "forward only")]
    head = (f"{result.model} ({result.model_type}, {result.dtype}"
            + (f" under {result.autocast} autocast" if result.autocast else "")
            + f", batch {result.shape[0]}×{result.shape[1]}"
            + (f", logits ×{result.scale_logits:g}" if result.scale_logits != 1.0 else "") + "): ")
    by = {status: [_value(r) for r in fields if r["status"] == status]
          for status in ("applied", "off", "dead config", "not run", "hard-coded", "no head here", "no attention here")}
    parts = []
    if by["applied"]:
        parts.append(f"applied: {', '.join(by['applied'])}")
    if by["off"]:
        parts.append(f"off (0 or unset, the code skips the cap): {', '.join(by['off'])}")
    if by["dead config"]:
        parts.append(f"dead config (set, applied by no implementation): {', '.join(by['dead config'])}")
    if by["not run"]:
        parts.append(f"not run by any implementation: {', '.join(by['not run'])}")
    if by["no head here"]:
        parts.append(f"set but this class has no output head to apply it: {', '.join(by['no head here'])}")
    if by["no attention here"]:
        parts.append(f"set but the model has no attention layer to apply it in: {', '.join(by['no attention here'])}")
    if by["hard-coded"]:
        parts.append(f"a tanh divided by a constant no field moves: {', '.join(by['hard-coded'])}")
    head += "; ".join(parts) if parts else "no configuration field moves a tanh's divisor: no soft-cap"
    refused = [r.implementation for r in result.runs if r.status.startswith("refused")]
    head += (f"; ran under {', '.join(ran) or 'no implementation'}"
             + (f"; refused by {', '.join(refused)}" if refused else "") + ".")
    out = [head]
    measured = [r for r in rows if r["fraction"] is not None and r["first_zero_grad_input"] is not None]
    if measured:
        worst = max(measured, key=lambda r: (r["fraction"], r["caps"]))
        out.append(f"Largest share of this batch past its path's first zero-gradient input: {worst['fraction']:.2%} "
                   f"of the {worst['caps']} at {worst['module']} under {worst['implementation']} "
                   f"({worst['dtype']}, c = {worst['cap']:g}, gradient exactly 0 from {worst['first_zero_grad_input']:g}).")
    elif not rows:
        out.append("No capped tanh ran in any implementation.")
    if gates or health:
        kinds = sorted({f"{g['fn']} at {g['module']}" for g in gates})
        out.append((f"{len(gates)} softplus/sigmoid contract{'s' if len(gates) != 1 else ''} (the gates table): "
                    + "; ".join(kinds[:3]) + ("; …" if len(kinds) > 3 else "") + ". " if gates else "")
                   + _health_sentence(health))
    return tuple(out)


def audit_report(result, params: dict):
    from softcapgrad.core.report import Report, Table
    from softcapgrad.models.caps import ON, PROBE_CAP, SCALE

    rows = site_rows(result)
    fields = config_rows(result)
    gates = gate_rows(result)
    health = health_rows(result)
    implementations = [r.implementation for r in result.runs]
    columns = ("module", "cap", "dtype", "first_zero_grad_input", "fraction")
    wide = ("field", "caps", "max_abs", "path", "count", "saturated", "zero_grad", "source", "basis")
    per_run = tuple(
        Table(f"sites:{run.implementation}", f"soft-cap sites under {run.implementation} ({run.status}; path "
              f"{', '.join(sorted({r['path'] for r in rows if r['implementation'] == run.implementation})) or '—'})",
              [r for r in rows if r["implementation"] == run.implementation], columns, wide=wide, json=False)
        for run in result.runs if run.status in ("ran", "forward only")
    )
    versions = _versions()
    return Report(
        command="audit-model",
        params={**params, "model_class": result.model},
        tables=(
            Table("rows", "soft-cap sites, every implementation", rows, ("implementation", *columns), show=False, wide=wide),
            *per_run,
            Table("config", "soft-caps found by running: each field, its status, which implementation applies it", fields,
                  ("field", "cap", "status", "applied_by"), wide=("modules", "divisor", "dtype", "ignored_by", "evidence",
                                                                 *implementations)),
            Table("gate_health", "gate health: each site's format, its stuck-open input and this batch's shares",
                  health or [{"module": "(no gate ran)"}],
                  ("module", "fn", "dtype", "stuck_open_from", "closed_share", "zero_grad_share", "mean_gate"),
                  wide=("stuck_shut_from", "saturated_share", "layers", "count", "min_input", "max_input", "source")
                  if health else ()),
            Table("gates", "softplus and sigmoid sites: their contract (eager)", gates,
                  ("module", "fn", "shape", "broadcast", "runs_in", "cast_to"),
                  wide=("source", "consumer", "operand", "reader", "role", "count")),
            Table("implementations", "attention implementations",
                  [{"implementation": r.implementation, "status": r.status, "reason": r.reason, "hidden": r.hidden or "",
                    "warnings": "; ".join(r.warnings)} for r in result.runs],
                  ("implementation", "status"), wide=("reason", "hidden", "warnings")),
        ),
        notes=(
            *(f"{r.implementation} {r.status}: {r.reason}" for r in result.runs if r.reason),
            *(f"{r.implementation}: {r.hidden}" for r in result.runs if r.hidden),
            "run with " + ", ".join(f"{k} {v}" for k, v in versions.items()),
            "caps are found by running: a field is a cap when setting it to "
            f"{SCALE:g}× its value moves a tanh's divisor in proportion (applied), or when setting it from 0 or unset "
            f"to {ON:g} makes a capped tanh run (off); a field named like a cap that moves no tanh is dead config",
            "per implementation: applied, the monitor saw the tanh; hidden, not seen but setting the field to "
            f"{PROBE_CAP:g} changed the output (applied inside a kernel); ignored, the output stayed bit-identical",
            "fraction: share of the site's values whose tanh output was stored as exactly ±1 (eager gradient exactly 0); "
            "for hidden sites, share of the eager run's pre-cap values at or past that path's first zero-gradient input",
            "gates: shapes from a forward of batch 3 × 7 tokens, axes named by the configuration's sizes",
            "gate health: the census's gate sites (and softmax routers: a softmax that feeds a top-k) in this batch's "
            "forward and backward; stuck open from: the first input whose autograd gradient is exactly 0, σ stored as "
            "1.0 in that format (measured, torch eager CPU); closed: below 1e-3; zero grad: exactly 0 where the "
            "upstream gradient was not",
        ),
        answer=answer(result, rows, fields, gates, health),
        figures={"versions": versions},
    )


def _versions() -> dict[str, str]:
    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__}
