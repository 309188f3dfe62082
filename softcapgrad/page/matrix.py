"""The cells laid out as the page shows them: one matrix per model type (engines and routes down; each cap, at
inference and in a training step, across), one line per engine (what it does to each cap, the setting that keeps
it), and the release timeline of transformers' default attention.
"""

from __future__ import annotations

from dataclasses import dataclass

from softcapgrad.page.cells import STAGES, Cell

CAPS = ("attention", "final")
COLUMNS = tuple((cap, stage) for cap in CAPS for stage in STAGES)
FINDINGS = ("lost", "altered")  # the tones that make an engine's line name what it does to a cap


@dataclass(frozen=True)
class Row:
    engine: str
    route: str
    cells: tuple[Cell | None, ...]  # one per COLUMNS entry; None where that stage did not run this route

    @property
    def verdicts(self) -> tuple[str, ...]:
        return tuple(sorted({c.verdict for c in self.cells if c is not None}))


@dataclass(frozen=True)
class Matrix:
    model: str
    caps: str  # the model type's caps in words
    rows: tuple[Row, ...]


@dataclass(frozen=True)
class EngineLine:
    engine: str
    stage: str
    caps: tuple[tuple[str, str], ...]  # (cap, what the engine's routes do to it)
    fix: str  # the setting that keeps what a route loses, or why none is named


@dataclass(frozen=True)
class Release:
    version: str
    attention: str
    verdict: str
    measured: bool


def _caps(models: list[dict], model: str) -> str:
    for m in models:
        if m.get("model") == model:
            return ", ".join(f"{k} {v:g}" for k, v in sorted(m.get("caps", {}).items()) if v is not None) or "no cap set"
    return ""


def matrices(cells: list[Cell], models: list[dict]) -> list[Matrix]:
    """One matrix per model type, in the order the cells first name them; rows in the order they first appear."""
    found: dict[str, dict[tuple[str, str], dict]] = {}
    for cell in cells:
        row = found.setdefault(cell.model, {}).setdefault((cell.engine, cell.route), {})
        row[(cell.cap, cell.stage)] = cell
    return [Matrix(model, _caps(models, model),
                   tuple(Row(engine, route, tuple(by.get(col) for col in COLUMNS))
                         for (engine, route), by in rows.items()))
            for model, rows in found.items()]


def _list(names) -> str:
    return ", ".join(dict.fromkeys(names))


def _routes(routes: list[str]) -> str:
    return f"route{'s' if len(routes) > 1 else ''} {', '.join(routes)}"


def _unjudged(on: list[Cell]) -> str:
    """A cap no route loses: how many cells keep it, or why none was judged."""
    kept = sum(c.tone == "kept" for c in on)
    if kept:
        return f"kept wherever judged ({kept} cell{'s' if kept > 1 else ''})"
    tones = sorted({c.verdict for c in on if c.tone in ("undecided", "failed")})
    return f"nothing judged ({', '.join(tones)})" if tones else "nothing to judge"


def engine_lines(cells: list[Cell], hows: dict[tuple[str, str, str], str]) -> list[EngineLine]:
    """Per engine and stage: for each cap, which routes lose or alter it on which model types, and which route of
    the same engine keeps it on every one of those (``hows``: (stage, engine, route) -> the route in words)."""
    lines = []
    for stage in STAGES:
        engines = dict.fromkeys(c.engine for c in cells if c.stage == stage)
        for engine in engines:
            mine = [c for c in cells if c.stage == stage and c.engine == engine]
            said, fixes = [], []
            for cap in CAPS:
                on = [c for c in mine if c.cap == cap]
                bad = [c for c in on if c.tone in FINDINGS]
                if not bad:
                    said.append((cap, _unjudged(on)))
                    continue
                models: dict[tuple[str, str], list[str]] = {}
                for c in bad:
                    models.setdefault((c.verdict, c.route), []).append(c.model)
                routes: dict[tuple[str, tuple[str, ...]], list[str]] = {}
                for (verdict, route), names in models.items():
                    routes.setdefault((verdict, tuple(dict.fromkeys(names))), []).append(route)
                said.append((cap, "; ".join(f"{verdict} by {_routes(rs)} on {_list(names)}"
                                            for (verdict, names), rs in routes.items())))
                wanted = {c.model for c in bad}
                keepers = [r for r in dict.fromkeys(c.route for c in on)
                           if wanted <= {c.model for c in on if c.route == r and c.tone == "kept"}]
                fixes.append(f"{cap} cap: route {keepers[0]} ({hows.get((stage, engine, keepers[0]), '')})"
                             if keepers else f"{cap} cap: no route tried here keeps it")
            lines.append(EngineLine(engine, stage, tuple(said), "; ".join(fixes) if fixes else "none needed"))
    return lines


def hows(parity: dict, train: dict) -> dict[tuple[str, str, str], str]:
    """(stage, engine, route) -> how the route runs, from the results' own records."""
    found = {}
    for stage, records in (("inference", parity.get("engines", [])), ("training", train.get("routes", []))):
        for e in records:
            found.setdefault((stage, e["engine"], e["route"]), e.get("how", ""))
    return found


def timeline(default_attention: dict) -> list[Release]:
    """Every release the walk covers, with the attention its range picks and that range's verdict."""
    measured = {r["release"] for r in default_attention.get("rows", [])}
    order = default_attention.get("releases", [])
    index = {v: i for i, v in enumerate(order)}
    out = []
    for span in default_attention.get("ranges", []):
        first, last = index.get(span["first"]), index.get(span["last"])
        if first is None or last is None:
            continue
        out += [Release(v, span["attention"], span["verdict"], v in measured) for v in order[first:last + 1]]
    return sorted(out, key=lambda r: index[r.version])
