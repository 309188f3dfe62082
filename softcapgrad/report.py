"""The one shape every investigation returns, and the one renderer for it.

A :class:`Report` holds named tables of plain rows (dicts of numbers, strings, lists) plus
top-level figures. ``as_json`` gives ``{"command", "params", "rows", <other tables>, "notes",
<figures>}``; ``render_table`` prints the same rows as rich tables. Scripts read the JSON.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Table:
    key: str  # JSON key ("rows" for the primary table)
    title: str
    rows: list[dict[str, Any]]
    columns: tuple[str, ...] = ()  # which keys the rich table shows (default: all of row 0)
    show: bool = True  # False: data for --json and figures only (dense curves), not printed


@dataclass(frozen=True)
class Report:
    command: str
    params: dict[str, Any]
    tables: tuple[Table, ...]
    notes: tuple[str, ...] = ()
    figures: dict[str, Any] = field(default_factory=dict)
    ok: bool = True  # False makes the command exit 1 (e.g. a claim changed verdict)


def plain(value: Any) -> Any:
    """JSON-safe: dataclasses to dicts, numpy scalars to Python, non-finite floats to strings."""
    if is_dataclass(value) and not isinstance(value, type):
        return plain(asdict(value))
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [plain(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        v = float(value)
        return v if math.isfinite(v) else ("nan" if math.isnan(v) else ("inf" if v > 0 else "-inf"))
    return value


def as_json(report: Report) -> str:
    out: dict[str, Any] = {"command": report.command, "params": report.params}
    for table in report.tables:
        out[table.key] = table.rows
    out.setdefault("rows", [])
    out["notes"] = list(report.notes)
    out.update(report.figures)
    return json.dumps(plain(out), indent=2)


def format_cell(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (float, np.floating)):
        v = float(value)
        if v == 0.0:
            return "-0.0" if math.copysign(1.0, v) < 0 else "0.0"
        if v.is_integer() and abs(v) < 1e7:
            return f"{v:.1f}"
        return f"{v:.8g}"
    if isinstance(value, dict):
        return " ".join(f"{k}={format_cell(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        nested = any(isinstance(v, (dict, list, tuple)) for v in value)
        return ("\n" if nested else ", ").join(format_cell(v) for v in value)
    return str(value)


def render_table(report: Report, console) -> None:
    """Print a report as rich tables (rich is imported by the caller's console)."""
    from rich.table import Table as RichTable

    for table in report.tables:
        if not table.rows or not table.show:
            continue
        columns = table.columns or tuple(table.rows[0])
        rich_table = RichTable(title=table.title, title_justify="left", header_style="bold")
        for name in columns:
            numeric = isinstance(table.rows[0].get(name), (int, float, np.number)) and not isinstance(
                table.rows[0].get(name), bool
            )
            rich_table.add_column(name, justify="right" if numeric else "left")
        for row in table.rows:
            rich_table.add_row(*(format_cell(row.get(name)) for name in columns))
        console.print(rich_table)
    for key, value in report.figures.items():
        console.print(f"{key}: {format_cell(plain(value))}", highlight=False)
    for note in report.notes:
        console.print(f"• {note}", highlight=False, markup=False)
