"""The training check's results: the dict of train-parity.json, its Markdown, and the answer in three sentences."""

from __future__ import annotations

from softcapgrad.engines.training import verdict as tv
from softcapgrad.engines.training.routes import DEFAULTS
from softcapgrad.engines.forward.parity import _clean, _fmt

SHORT_REASON = 140  # characters of a reason the answer quotes whole
ROW_KEYS = ("engine", "route", "model", "cap", "c", "verdict", "form", "precision", "versions", "forward_cell",
            "loss_cell", "forward_error", "forward_tolerance", "grad_error", "grad_tolerance", "grad_where", "grad_scale",
            "local_error", "local_grad_error", "local_grad_tolerance", "first_dead", "last_alive", "zeros",
            "first_dead_over_c", "stack", "stack_first_zero", "agrees", "pointwise", "stacks_within", "first_dead_note",
            "c_used", "hint")
TIMES = ("cpu_s", "wall_s")


def as_dict(results: list, params: dict, provenance: dict | None = None) -> dict:
    """The results as train-parity.json holds them; with ``provenance`` (provenance.record), each row names the CPU
    it was measured on (a compiled stack's first zero, and so a row's ``stacks_within``, can depend on it)."""
    from softcapgrad.engines.forward.parity import provenance_cpu

    cpu = provenance_cpu(provenance)
    return _clean({
        "params": params,
        "models": [{"model": r.model, "caps": r.reference.caps, "tokens": int(r.reference.ids.size),
                    "scales": r.reference.scales, "width": r.reference.width,
                    **({"reach": r.reference.reach, "inputs": r.inputs} if r.reference.reach is not None else {})}
                   for r in results],
        "rows": [{**{k: row.get(k) for k in ROW_KEYS}, **({"cpu": cpu} if cpu else {})}
                 for r in results for row in r.rows],
        "routes": [{k: v for k, v in e.items() if k not in TIMES} for r in results for e in r.routes],
        **({"provenance": provenance} if provenance else {}),
    })


def unmergeable(data) -> str | None:
    """Why ``data`` (a train-parity.json read back) cannot take an update; None when it can."""
    if not (isinstance(data, dict) and isinstance(data.get("params"), dict)
            and all(isinstance(data.get(k), list) for k in ("models", "rows", "routes"))):
        return "it holds no train-parity results (params, models, rows, routes)"
    for key in ("rows", "routes"):
        if not all(isinstance(e, dict) and isinstance(e.get("engine"), str) and isinstance(e.get("model"), str)
                   for e in data[key]):
            return f"an entry of its {key} names no engine and model"
    if not all(isinstance(m, dict) and isinstance(m.get("model"), str) for m in data["models"]):
        return "an entry of its models names no model"
    if not all(isinstance(r.get("cpu", ""), str) for r in data["rows"]):
        return "an entry of its rows holds a cpu that is not a string"
    then = data.get("provenance", {})
    if not isinstance(then, dict) or not isinstance(then.get("earlier", []), list):
        return "its provenance is not an object with a list of earlier runs"
    return None


def merge(old: dict, new: dict, engines: list[str]) -> dict:
    """``old`` results with each (engine, model) that ``new`` measured replaced by ``new``'s rows and routes;
    models in ``old``'s order, then the new ones; on each model the engines in ``engines``' order (the catalog's),
    each engine's routes as measured."""
    order = {name: i for i, name in enumerate(engines)}
    models = {m["model"]: m for m in old["models"]}
    models.update({m["model"]: m for m in new["models"]})
    measured = {(e["engine"], e["model"]) for e in new["routes"]}
    merged = {**old, "models": list(models.values()), "rows": [], "routes": []}
    for model in models:
        for key in ("rows", "routes"):
            kept = [e for e in old[key] if e["model"] == model and (e["engine"], model) not in measured]
            kept += [e for e in new[key] if e["model"] == model]
            merged[key] += sorted(kept, key=lambda e: order.get(e["engine"], len(order)))  # stable: routes stay
    from softcapgrad.engines.environments.provenance import carried, mark_other_cpus

    merged["rows"] = mark_other_cpus(merged["rows"])
    if carried(old.get("provenance"), new.get("provenance")):
        merged["provenance"] = carried(old.get("provenance"), new.get("provenance"))
    return merged


def _fix(rows: list[dict], bad: dict) -> str:
    """A route of the same engine, precision and model whose row for this cap is applied forward and backward."""
    keeps = [r["route"] for r in rows if r["engine"] == bad["engine"] and r["model"] == bad["model"]
             and r["cap"] == bad["cap"] and r["verdict"] == tv.APPLIED and r["precision"] == bad["precision"]]
    if not keeps:
        return "no route tried here keeps it"
    setting = ' (attn_implementation="eager")' if keeps[0].endswith(("eager", "eager-bf16")) else ""
    return f"route {keeps[0]}{setting} keeps it"


def _bracket(found: list[dict]) -> str:
    alive = [r["last_alive"] for r in found if r.get("last_alive") is not None]
    return f"above {max(alive, default=0):.6g}, by {min(r['first_dead'] for r in found):.6g}"


def _zeros(rows: list[dict], cap: str = "final") -> str:
    """Per format, cap value and compared stack: how many routes' brackets hold the stack's first zero (with the
    narrowest bracket they share), and each route whose bracket does not, with the stacks whose first zero lies in it."""
    groups: dict = {}
    for r in rows:
        if r["cap"] == cap and r.get("first_dead") is not None:
            own = "" if r.get("stack_first_zero") is not None else f"{r['engine']} "
            pointwise = r.get("pointwise") is not None
            key = (own, r["precision"], r.get("c_used") or r["c"], r.get("stack_first_zero"), r.get("stack"), pointwise)
            groups.setdefault(key, []).append(r)
    said = []
    for (own, precision, c, stack, name, pointwise), found in sorted(groups.items(),
                                                                     key=lambda kv: (kv[0][:3], kv[0][4] or "")):
        if stack is None:
            said.append(f"{own}{precision} at c = {c:g}: {_bracket(found)} (no stack compared)")
            continue
        if pointwise:
            said.append(_pointwise(precision, c, stack, name, found))
            continue
        agree = [r for r in found if r.get("agrees")]
        text = f"{precision} at c = {c:g}: {len(agree)} of {len(found)} routes' brackets hold {name}'s {stack:.6g}"
        text += f" ({_bracket(agree)})" if agree else ""
        for r in found:
            if not r.get("agrees"):
                within = ", ".join(r.get("stacks_within") or []) or "no stack's"
                text += (f", not {r['engine']} ({r['route']} on {r['model']}): {_bracket([r])}, where "
                         f"{within} first zero lies")
        said.append(text)
    return "; ".join(said)


def _pointwise(precision: str, c: float, stack: float, name: str, found: list[dict]) -> str:
    """Routes compared with a stack whose zeros depend on the gradient arriving at the cap: the stack run at each
    route's own a and dL/dz, zero where the route's gradient is zero and nowhere else, or not."""
    agree = [r for r in found if r.get("agrees")]
    text = (f"{precision} at c = {c:g}: {len(agree)} of {len(found)} routes give 0 exactly where {name} gives 0 at "
            f"the route's own a and dL/dz")
    text += (f" ({_bracket(agree)}; {sum(r['pointwise']['positions'] for r in agree)} positive a compared)"
             if agree else "")
    for r in found:
        if not r.get("agrees"):
            seen = r.get("pointwise")
            text += (f", not {r['engine']} ({r['route']} on {r['model']}): "
                     + (f"not compared ({seen['why']})" if seen.get("why") else
                        f"{seen['positions'] - seen['same']} of {seen['positions']} positions differ"))
    return text + f"; {name}'s own first zero, at dL/dz = 1, is {stack:.6g} (a smaller dL/dz moves it down)"


def answer(data: dict) -> tuple[str, ...]:
    rows = data["rows"]
    bad: dict = {}
    for r in rows:
        if r["verdict"] in tv.BAD:
            what = r["verdict"] + (f" ({r['form']})" if r.get("form") else "")
            bad.setdefault((r["engine"], r["route"], r["cap"], what, _fix(rows, r)), []).append(r["model"])
    said = [f"{e} ({route}) {what}: the {cap} cap of {', '.join(dict.fromkeys(m))}; {fix}"
            for (e, route, cap, what, fix), m in bad.items()]
    ran = [r for r in rows if r["verdict"] not in (tv.NOT_RUN, tv.NO_ARCHITECTURE, tv.NOT_SET)]
    first = ("Routes that train without a cap or with another gradient: " + "; ".join(said) + "." if said else
             "No route ran, so no cap was judged." if not ran else
             "No cap was judged applied or not: every row that ran is undecided (below)."
             if all(r["verdict"] == tv.NOT_BOUND for r in ran) else
             "Every route that ran applied every cap it could be judged on, forward and backward.")
    scaled: dict = {}
    for r in rows:
        if r.get("grad_scale") is not None:
            scaled.setdefault(f"{r['grad_scale']:.6g}", {})[f"{r['engine']} ({r['route']})"] = None
    first += (" Loss and every gradient scaled as a whole (a loss normalised by another count, not a cap's doing): "
              + "; ".join(f"{', '.join(who)} by {s}" for s, who in scaled.items()) + "." if scaled else "")
    unbound = [r for r in rows if r["verdict"] == tv.NOT_BOUND and (r.get("hint") or "").startswith(tv.UNBOUND)]
    open_ = [r for r in rows if r["verdict"] == tv.NOT_BOUND and r not in unbound]
    gaps = sorted({f"{r['engine']} ({r['route']}) {r['cap']} on {r['model']}" for r in open_ if default(r)})
    undecided = sorted({f"{r['engine']} ({r['route']}) {r['cap']}" for r in open_ if not default(r)})
    zeros, attention = _zeros(rows), _zeros(rows, "attention")
    second = (saved(data.get("models", []), unbound)
              + (f"Undecided on routes users run by default, a gap in the answer and not a verdict: {', '.join(gaps)}. "
                 if gaps else "")
              + (f"Undecided in their precision (no reference within the tolerance or {tv.verdict.RATIO:g} times "
                 f"nearer){' on other routes' if gaps else ''}: {', '.join(undecided)}. " if undecided else "")
              + (f"The final cap's gradient is first exactly 0 in {zeros}." if zeros else
                 "No route's final-cap gradient reached exactly 0 in the sweeps.")
              + (f" The attention cap's gradient is first exactly 0 in {attention}." if attention else ""))
    reasons: dict = {}
    ran = {(r["engine"], r["route"], r["model"]) for r in rows
           if r["verdict"] not in (tv.NOT_RUN, tv.NOT_SET, tv.NO_ARCHITECTURE)}
    for r in rows:
        if r["verdict"] == tv.NOT_RUN:
            hint = r.get("hint") or ""  # a long reason to its type and first clause
            why = hint if len(hint) <= SHORT_REASON else ": ".join(hint.split(": ")[:2])
            elsewhere = any(k[:2] == (r["engine"], r["route"]) for k in ran)  # then name the model type it failed on
            reasons.setdefault(why, {})[f"{r['engine']} ({r['route']}{' on ' + r['model'] if elsewhere else ''})"] = None
    third = ("Could not run: " + "; ".join(f"{', '.join(who)}: {why}" for why, who in reasons.items()) + "."
             if reasons else "Every route listed ran.")
    return first, second, third


def default(row: dict) -> bool:
    """Whether the row's route is one users run by default (routes.DEFAULTS)."""
    return row["route"] in DEFAULTS.get(row["engine"], ())


def saved(models: list[dict], unbound: list[dict]) -> str:
    """For each saved model (train-parity DIR): its inputs, each cap's largest |a/c| on them, the caps that do not
    bind there; "" for parity's tiny models."""
    said = ""
    for m in models:
        if "reach" not in m:
            continue
        reach = [f"{cap} {v:.3g}" for cap, v in m["reach"].items() if v is not None]
        caps = sorted({r["cap"] for r in unbound if r["model"] == m["model"]})
        said += (f"On {m['model']} (its weights as saved, not scaled), {m['inputs']}: each cap's largest |a/c| is "
                 f"{', '.join(reach) or 'not measured'}. "
                 + (f"The {' and '.join(caps)} cap{'s do' if len(caps) > 1 else ' does'} not bind there for some "
                    "route's precision, so those rows are neither applied nor ignored. " if caps else ""))
    return said


def _exact(value) -> str:
    return "" if value is None else f"{value:.7g}"


def _read_from(row: dict) -> str:
    """Where a route's first zero was read: the cap's input a itself, or the head rows' gradients (a hidden)."""
    if row["cap"] == "attention":
        return "the scores (each attention-cap call)"
    return "head rows (a hidden)" if "head rows" in (row.get("first_dead_note") or "") else "a"


def markdown(data: dict, said: tuple[str, ...]) -> str:
    from softcapgrad.engines.environments.provenance import said as measured_on

    lines = ["# Does training keep the caps?", "", *said, ""]
    if data.get("provenance"):
        lines += [measured_on(data["provenance"]).replace("parity.json", "train-parity.json"), ""]
    other = sorted({(r["engine"], r["route"]) for r in data["rows"] if r.get("other_cpu")})
    if other:
        lines += ["Measured on another CPU than the rest (train-parity.json names it per row): "
                  + ", ".join(f"{e} {r}" for e, r in other) + ".", ""]
    for m in data["models"]:
        weights = (f"weights as saved, not scaled; inputs: {m['inputs']}; each cap's largest |a/c| on them: "
                   f"{', '.join(f'{k} {v:.4g}' for k, v in m['reach'].items() if v is not None) or 'none'}"
                   if "reach" in m else "weights scaled so that each cap binds "
                   f"({', '.join(f'{k} ×{v:.4g}' for k, v in m['scales'].items())})")
        lines += [f"## {m['model']}", "", f"caps {m['caps']}; {m['tokens']} tokens; {weights}.", "",
                  "| engine | route | precision | cap | verdict | form | forward | grad error | grad tol "
                  "| first zero | last alive | stack's | versions |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in data["rows"]:
            if r["model"] != m["model"]:
                continue
            lines.append(f"| {r['engine']} | {r['route']} | {r['precision']} | {r['cap']} | {r['verdict']} | "
                         f"{r.get('form') or ''} | {r.get('forward_cell') or ''} | {_fmt(r.get('grad_error'))} | "
                         f"{_fmt(r.get('grad_tolerance'))} | {_exact(r.get('first_dead'))} | "
                         f"{_exact(r.get('last_alive'))} | {_exact(r.get('stack_first_zero'))} | "
                         f"{r.get('versions') or ''} |")
        lines += ["", "| engine | route | cap | note |", "| --- | --- | --- | --- |"]
        lines += [f"| {r['engine']} | {r['route']} | {r['cap']} | {(r.get('hint') or '').replace('|', '/')} |"
                  for r in data["rows"] if r["model"] == m["model"] and r.get("hint")]
        zeros = [r for r in data["rows"] if r["model"] == m["model"] and r.get("first_dead")]
        lines += ["", "| engine | route | cap | first zero read from | stacks whose first zero lies in (last alive, "
                  "first zero] |", "| --- | --- | --- | --- | --- |"]
        lines += [f"| {r['engine']} | {r['route']} | {r['cap']} | {_read_from(r)} | "
                  f"{', '.join(r.get('stacks_within') or []) or 'none'} |" for r in zeros]
        lines += ["", "| engine | route | what ran |", "| --- | --- | --- |"]
        lines += [f"| {e['engine']} | {e['route']} | {e['did'] or e['how']} |" for e in data["routes"]
                  if e["model"] == m["model"]]
        lines.append("")
    return "\n".join(lines) + "\n"
