"""The static site of the results: one index.html (a Jinja2 template) holding its style sheet, its script and its
data, so that nothing is fetched.

Each cell's details are written into index.html as one JSON block, which the script reads on a click, and the style
sheet and script (assets/) are written into it as well: one file, which works opened from ``file://`` as well as
served, and which a browser's own rule against reading neighbouring files from ``file://`` cannot break. Everything is a function of the
results' files: the same files give the same bytes.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from softcapgrad.core.checks import InputError
import softcapgrad.page.cells as cellmod
import softcapgrad.page.matrix as matrix

HERE = Path(__file__).resolve().parent
SOURCES = ("parity.json", "train-parity.json", "default-attention.json")
OPTIONAL = ("incidents.json",)
ASSETS = ("page.css", "page.js")


@dataclass(frozen=True)
class Site:
    files: dict[str, str]  # name in the output folder -> text
    answer: tuple[str, ...]
    counts: dict[str, int]  # cells per tone
    lines: tuple[matrix.EngineLine, ...]


def _read(path: Path, needed: bool) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        if needed:
            raise InputError(f"{path}: not found (the page is built from the results parity, train-parity and "
                             "parity-releases write)") from None
        return {}
    except OSError as err:
        raise InputError(f"{path}: cannot read ({err.strerror})") from None
    except (ValueError, RecursionError):
        raise InputError(f"{path}: not JSON") from None
    if not isinstance(data, (dict, list)):
        raise InputError(f"{path}: holds no results (a JSON object was expected)")
    return data


def read(results: Path) -> dict[str, dict]:
    """The results the page is built from; incidents.json only where it exists."""
    data = {name: _read(results / name, True) for name in SOURCES}
    data.update({name: found for name in OPTIONAL if (found := _read(results / name, False))})
    for name in SOURCES[:2]:
        if not isinstance(data[name], dict) or not isinstance(data[name].get("rows"), list):
            raise InputError(f"{results / name}: holds no rows")
    return data


@dataclass(frozen=True)
class Incident:
    """One row of the page's incidents table: what results/incidents.json says of one public incident."""
    id: str
    library: str
    thread: str
    before: str
    after: str
    outcome: str
    why: str


def _side(side) -> str:
    """A replayed side as 'release: what the tool said' (or the state it was left in); '—' where none exists."""
    if not isinstance(side, dict):
        return "—"
    said = side.get("verdict") or side.get("state") or ""
    return f"{side.get('release', '')}: {said}" if said else str(side.get("release", ""))


def incidents(data) -> tuple[list[str], list[Incident]]:
    """incidents.json's answer and its incidents, each a row; fields it lacks are left empty."""
    if not isinstance(data, dict):
        data = {"incidents": data if isinstance(data, list) else []}
    said = [str(a) for a in data.get("answer", []) if isinstance(a, str)]
    rows = [Incident(str(e.get("id", "")), str(e.get("library", "")), str(e.get("thread", "")), _side(e.get("before")),
                     _side(e.get("after")), str(e.get("outcome", "")), str(e.get("why", "")))
            for e in data.get("incidents", []) if isinstance(e, dict)]
    return said, rows


def answer(counts: Counter, inference: int, training: int) -> tuple[str, ...]:
    judged = counts["kept"] + counts["lost"] + counts["altered"]
    return (f"Of {judged} cells judged, {counts['kept']} keep their cap, {counts['lost']} lose it and "
            f"{counts['altered']} compute something else ({inference} inference and {training} training cells "
            "in all).",
            f"{counts['undecided']} cannot be told apart in their precision, {counts['failed']} could not run, "
            f"and {counts['inert']} have nothing to judge.")


def details(cells: list[cellmod.Cell]) -> dict:
    """What the page's script shows for each cell: its title and its lines, the lines of its route's run after its
    own. Every text is held once, in ``strings``, and named by its index: causes, versions and commands repeat
    across hundreds of cells."""
    strings: dict[str, int] = {}

    def at(text: str) -> int:
        return strings.setdefault(text, len(strings))

    runs: dict[tuple, int] = {}
    for c in cells:
        runs.setdefault(c.route_details, len(runs))
    return {"cells": {c.id: [at(f"{c.engine} · {c.route} · {c.model} · {c.cap} cap · {c.stage}"),
                             [[at(k), at(v)] for k, v in c.details], runs[c.route_details]] for c in cells},
            "runs": [[[at(k), at(v)] for k, v in lines] for lines in runs],
            "strings": list(strings)}


def build(results: Path) -> Site:
    import jinja2

    data = read(results)
    parity, train, releases = data["parity.json"], data["train-parity.json"], data["default-attention.json"]
    cells = cellmod.inference_cells(parity) + cellmod.training_cells(train)
    counts = Counter(c.tone for c in cells)
    lines = matrix.engine_lines(cells, matrix.hows(parity, train))
    said = answer(counts, sum(c.stage == "inference" for c in cells), sum(c.stage == "training" for c in cells))
    models = parity.get("models", []) + [m for m in train.get("models", []) if isinstance(m, dict)]
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True)
    page = env.get_template("index.html.j2").render(
        answer=said,
        tones=cellmod.TONES, glyphs=cellmod.GLYPHS, tone_words=cellmod.TONE_WORDS,
        stage_words=cellmod.STAGE_WORDS, columns=matrix.COLUMNS,
        matrices=matrix.matrices(cells, models), lines=lines,
        engines=sorted({c.engine for c in cells}), verdicts=sorted({c.verdict for c in cells}),
        details=details(cells),
        timeline=matrix.timeline(releases), releases=releases,
        not_measured=parity.get("not_measured", []), not_yet=parity.get("model_types_not_yet", []),
        incidents=incidents(data.get("incidents.json", {})),
        provenance={"parity": parity.get("provenance", {}), "train": train.get("provenance", {})},
        assets={name: _asset(name) for name in ASSETS},
    )
    return Site({"index.html": page}, said, dict(sorted(counts.items())), tuple(lines))


def _asset(name: str):
    """A style sheet or script of our own, written into the page as it is (no user text in it)."""
    from markupsafe import Markup

    text = (HERE / "assets" / name).read_text(encoding="utf-8")
    assert "</" not in text, f"{name} would close its own element"
    return Markup(text)
