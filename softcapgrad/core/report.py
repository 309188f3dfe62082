"""The one shape every investigation returns, and the one renderer for it.

A :class:`Report` leads with its answer (one to three plain sentences), then holds named tables of
plain rows (dicts of numbers, strings, lists) and top-level figures. ``as_json`` gives
``{"command", "params", "answer", "rows", <other tables>, "notes", <figures>}``; ``render_table``
prints the answer, then the same rows as rich tables: headers in words from one vocabulary
(:data:`LABELS`), one number format per column, a single-row table as quantity/value pairs, and
the ``wide`` columns only when asked. Scripts read the JSON, which always has every column.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any, Callable

import numpy as np

from softcapgrad.core.checks import printable


@dataclass(frozen=True)
class Table:
    key: str  # JSON key ("rows" for the primary table)
    title: str
    rows: list[dict[str, Any]]
    columns: tuple[str, ...] = ()  # which keys the rich table shows (default: all of row 0)
    show: bool = True  # False: data for --json and figures only (dense curves), not printed
    wide: tuple[str, ...] = ()  # secondary columns, printed only with --wide
    digits: int | None = None  # significant digits of fixed-point columns (default SIGNIFICANT); 9 tells fp32 apart
    json: bool = True  # False: printed only, a view of rows that another table already gives the JSON


@dataclass(frozen=True)
class Report:
    command: str
    params: dict[str, Any]
    tables: tuple[Table, ...]
    notes: tuple[str, ...] = ()
    figures: dict[str, Any] = field(default_factory=dict)
    ok: bool = True  # False makes the command exit ``exit_code`` (e.g. a claim changed verdict)
    exit_code: int = 1  # when not ok: 1 a verdict changed, NO_VERDICT (cli/common.py) nothing was judged
    answer: tuple[str, ...] = ()  # the finding, in one to three plain sentences, printed first


# One name per quantity across every command: JSON key -> table header in words.
LABELS: dict[str, str] = {
    "dtype": "format",
    "cap": "cap c",
    "fn": "function",
    "a": "input a",
    "a_over_c": "a / c",
    "horizon": "horizon c·x_knee",
    "first_zero_grad_input": "first zero-grad input",
    "last_nonzero_grad_input": "last non-zero-grad input",
    "first_saturating_input": "first input stored as 1.0",
    "last_unsaturated_input": "last input below 1.0",
    "saturated_run_start": "saturated from",
    "knee_exact": "exact knee",
    "knee_spacing": "spacing knee",
    "knee_doc_formula": "document formula",
    "mantissa_bits": "mantissa bits p",
    "below_one": "largest value < 1",
    "grad_autograd": "autograd gradient",
    "grad_exact": "exact sech²(a/c)",
    "rel_error": "relative error",
    "fp32_first_zero_grad_input": "in fp32",
    "fp32_horizon": "fp32 horizon",
    "a_stored": "a as stored",
    "monotone": "monotone",
    "backend": "backend",
    "path": "path",
    "attenuation": "attenuation",
    "count": "values",
    "fraction": "fraction",
    "max_abs": "largest |a|",
    "nan_count": "NaN values",
    "inf_count": "±inf values",
    "supported": "supported",
    "reason": "why not",
    "method": "search",
    "source": "source",
    "verdict": "verdict",
    "expected": "expected",
    "stated": "document says",
    "computed": "computed",
    "computed_text": "computed",
    "id": "claim",
    "lr_wd": "lr·wd",
    "one_over_wd": "1/wd",
    "exact_offset": "exact offset",
    "beta_over_wd": "β/wd",
    "theta": "θ",
    "tether_theta_minus_anchor": "tether θ − θ*",
    "T": "tokens T",
    "H_q": "query heads",
    "gate_over_attention": "gate / attention",
    "ln_overflow_threshold": "overflow threshold",
    "last_finite_input": "last finite input",
    "first_overflow_input": "first overflow input",
    "naive": "naive result",
    "stable": "stable result",
    "module": "module",
    "site": "call site",
    "calls": "calls",
    "saturated": "stored ±1",
    "zero_grad": "zero grads",
    "backward_count": "backward values",
    "max_abs_input": "largest |input|",
    "saturated_fraction": "fraction stored ±1",
    "implementation": "attention",
    "caps": "caps",
    "field": "config field",
    "status": "status",
    "applied_by": "applied by",
    "ignored_by": "ignored by",
    "basis": "fraction from",
    "hidden": "not seen by the monitor",
    "warnings": "library warnings",
    "eager": "eager",
    "sdpa": "sdpa",
    "flex_attention": "flex_attention",
    "flash_attention_2": "flash_attention_2",
}


def label(key: str) -> str:
    return LABELS.get(key, key.replace("_", " "))


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
    import json  # only --json needs it: kept off the start of every other command

    out: dict[str, Any] = {"command": report.command, "params": report.params, "answer": list(report.answer)}
    for table in report.tables:
        if table.json:
            out[table.key] = table.rows
    out.setdefault("rows", [])
    out["notes"] = list(report.notes)
    out.update(report.figures)
    return json.dumps(plain(out), indent=2)


# --- numbers as text -------------------------------------------------------------------------

SIGNIFICANT = 7  # digits shown in fixed-point columns; the JSON keeps every digit


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


def _special(v: float) -> str | None:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "∞" if v > 0 else "−∞"
    if v == 0.0:
        return "−0" if math.copysign(1.0, v) < 0 else "0"
    return None


def _exact_decimals(v: float) -> int:
    """Decimals of the shortest repr that round-trips (0.999 → 3); large when it needs an exponent."""
    text = repr(v)
    if "e" in text or "E" in text:
        return 99
    return len(text.split(".")[1].rstrip("0")) if "." in text else 0


def number_format(values: list[Any], significant: int = SIGNIFICANT) -> Callable[[float], str]:
    """One format for a column of numbers: integers, fixed point with one decimal count, or scientific.

    Integers (and integral floats below 2^53) print without decimals; finite magnitudes between
    1e-4 and 1e9 share the decimals that show the smallest of them to SIGNIFICANT digits (at most
    12); anything wider prints in scientific notation with five significant digits.
    """
    nums = [float(v) for v in values if _is_number(v) and math.isfinite(float(v)) and float(v) != 0.0]
    if all(float(v).is_integer() and abs(float(v)) < 2.0**53 for v in nums):
        return lambda v: _special(float(v)) or f"{int(v):,}"
    lo, hi = min(abs(v) for v in nums), max(abs(v) for v in nums)
    if 1e-4 <= lo and hi < 1e9:
        decimals = min(12, max(0, significant - 1 - math.floor(math.log10(lo))), max(map(_exact_decimals, nums)))
        return lambda v: _special(float(v)) or f"{float(v):,.{decimals}f}"
    return lambda v: _special(float(v)) or f"{float(v):.4e}"


def format_cell(value: Any, number: Callable[[float], str] | None = None) -> str:
    """A cell as text: numbers in the column's format, lists joined, every string through :func:`printable`."""
    if value is None:
        return "—"
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if _is_number(value):
        return (number or number_format([value]))(value)
    if isinstance(value, dict):
        return " ".join(f"{printable(str(k))}={format_cell(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        nested = any(isinstance(v, (dict, list, tuple)) for v in value)
        return ("\n" if nested else ", ").join(format_cell(v) for v in value)
    return printable(str(value))


# --- rich rendering --------------------------------------------------------------------------


def _shown(table: Table, wide: bool) -> tuple[list[str], dict[str, list[str]]]:
    """The columns printed and each one's cells as text, one number format per column."""
    columns = [c for c in (table.columns or tuple(table.rows[0])) if c not in table.wide]
    if wide:
        columns += [c for c in table.wide if c not in columns]
    formats = {c: number_format([r.get(c) for r in table.rows], table.digits or SIGNIFICANT) for c in columns}
    return columns, {c: [format_cell(r.get(c), formats[c]) for r in table.rows] for c in columns}


def _folded(table: Table, wide: bool):
    """A table too wide for the terminal, folded: one quantity/value block per row, so no number is cut."""
    from rich.table import Table as RichTable

    columns, text = _shown(table, wide)
    blocks = []
    for i in range(len(table.rows)):
        out = RichTable(show_header=False, title=f"row {i + 1} of {len(table.rows)}", title_justify="left")
        out.add_column("quantity")
        out.add_column("value", overflow="fold")
        for c in columns:
            if text[c][i] not in ("", "—"):
                out.add_row(_text(label(c)), _text(text[c][i]))
        blocks.append(out)
    return blocks


def _rich_table(table: Table, wide: bool):
    """Numbers and names are never wrapped or cut: each column is at least as wide as its widest cell
    and the longest word of its header, so only headers (between words) and notes wrap."""
    from rich.table import Table as RichTable

    columns, text = _shown(table, wide)
    if len(table.rows) == 1 and len(columns) > 3:  # one result: quantity / value pairs read better
        out = RichTable(header_style="bold", show_header=False)
        out.add_column("quantity")
        out.add_column("value", justify="right", min_width=max(len(t[0]) for t in text.values()))
        for c in columns:
            if text[c][0] not in ("", "—"):
                out.add_row(_text(label(c)), _text(text[c][0]))
        return out
    out = RichTable(header_style="bold")
    for c in columns:
        cells = [r.get(c) for r in table.rows]
        numeric = any(_is_number(v) for v in cells) and all(v is None or _is_number(v) for v in cells)
        widest = max(len(line) for t in text[c] for line in (t.splitlines() or [""]))
        word = max(len(w) for w in label(c).split())
        least = _least(c, text[c], numeric)
        # only a header longer than every cell, or text that may wrap between words, can give width back;
        # marking the others no_wrap keeps rich's narrowing off them (it would otherwise narrow a column
        # that min_width then widens again)
        out.add_column(_text(label(c)), justify="right" if numeric else "left", min_width=least,
                       no_wrap=len(label(c)) <= widest and least == widest)
    for i in range(len(table.rows)):
        out.add_row(*(_text(text[c][i]) for c in columns))
    return out


def _text(cell: str):
    """A cell as rich text taken literally: a ``[red]`` or ``:smile:`` in a tensor's name stays those characters
    (rich would read a plain string as markup and emoji codes)."""
    from rich.text import Text

    return Text(cell)


def _narrowest(table: Table, wide: bool) -> int:
    """Columns the drawn table needs at least: every cell whole and each header's longest word,
    plus the box (one rule and two spaces of padding per column, one closing rule)."""
    columns, text = _shown(table, wide)
    if len(table.rows) == 1 and len(columns) > 3:  # quantity / value pairs
        cells = [max(len(w) for w in label(c).split()) for c in columns], [len(t[0]) for t in text.values()]
        return max(cells[0]) + max(cells[1]) + 7
    need = [_least(c, text[c], all(v is None or _is_number(v) for v in (r.get(c) for r in table.rows))) for c in columns]
    return sum(need) + 3 * len(need) + 1


def _least(column: str, cells: list[str], numeric: bool) -> int:
    """A column's narrowest width: a number's whole cell; text may wrap between words, never inside one."""
    words = [len(w) for w in label(column).split()]
    if numeric:
        return max(words + [len(line) for t in cells for line in (t.splitlines() or [""])])
    return max(words + [len(w) for t in cells for w in t.split()] + [1])


def _fitting(rendered, table: Table, wide: bool, console) -> list:
    """The table as drawn when its narrowest layout fits the console, else folded one row per block."""
    if _narrowest(table, wide) <= console.width:
        return [rendered]
    return _folded(table, wide)


def title_lines(title: str, width: int) -> list[str]:
    """A table's title wrapped at word boundaries to the console's width, in lines of even length: as
    many lines as the width needs, each as short as that number allows, so a title one word too long
    ends on half its words, not on a lone last fragment (``0``)."""
    import textwrap

    def wrap(w: int) -> list[str]:
        return textwrap.wrap(title, w, break_on_hyphens=False) or [title]

    lines = wrap(width)
    if len(lines) > 1:
        even = (wrap(w) for w in range(-(-len(title) // len(lines)), width + 1))
        return next(c for c in even if len(c) == len(lines))
    return lines


def render_table(report: Report, console, wide: bool = False) -> None:
    """Print a report: its answer, then rich tables, then notes (rich is imported by the caller's console).

    The top-level figures are in the JSON only: the answer states the ones a reader needs. Every sentence,
    title, note and cell is printed literally (no markup, no emoji codes) and through :func:`printable`, so
    that a name read from a file or a server, interpolated anywhere, prints its control characters escaped.
    """
    for sentence in report.answer:
        console.print(_text(printable(sentence)))
    if report.answer:
        console.print()
    for table in report.tables:
        if not table.rows or not table.show:
            continue
        for line in title_lines(printable(table.title), console.width):
            console.print(_text(line), style="bold")
        for block in _fitting(_rich_table(table, wide), table, wide, console):
            console.print(block)
    for note in report.notes:
        console.print(_text(f"• {printable(note)}"))
