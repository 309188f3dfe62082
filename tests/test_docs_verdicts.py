"""Every verdict docs/engines.md states in its verdict tables is the verdict the committed results hold.

A verdict table is a Markdown table whose header is exactly `command | engine | model type | route | cap |
verdict`. Its model type, route and cap cells may list several values, comma-separated: every combination must be
a row of the command's results (`parity` -> results/parity.json, `train-parity` -> results/train-parity.json) with
that engine, model type, route and cap, and that row's verdict must be the table's, word for word. So a verdict
typed wrong in the page, or one the results change under it, fails here.
"""

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "engines.md"
HEADER = ["command", "engine", "model type", "route", "cap", "verdict"]
RESULTS = {"parity": "parity.json", "train-parity": "train-parity.json"}


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def stated(text: str) -> list[tuple[int, dict]]:
    """(line number, row) of every row of every verdict table in a page."""
    found, lines = [], text.split("\n")
    for i, line in enumerate(lines):
        if not line.startswith("|") or cells(line) != HEADER:
            continue
        for j in range(i + 2, len(lines)):  # past the header and its rule
            if not lines[j].startswith("|"):
                break
            found.append((j + 1, dict(zip(HEADER, cells(lines[j])))))
    return found


def mismatches(row: dict, results: dict[str, list[dict]]) -> list[str]:
    """What in one stated row the results do not hold (empty: every combination it lists is there, with its
    verdict)."""
    if row["command"] not in results:
        return [f"no such command {row['command']!r}"]
    index = {(r["engine"], r["model"], r["route"], r["cap"]): r["verdict"] for r in results[row["command"]]}
    wrong = []
    for model in row["model type"].split(", "):
        for route in row["route"].split(", "):
            for cap in row["cap"].split(", "):
                key = (row["engine"], model, route, cap)
                if key not in index:
                    wrong.append(f"{row['command']}: no row {key}")
                elif index[key] != row["verdict"]:
                    wrong.append(f"{row['command']}: {key} is {index[key]!r}, the page says {row['verdict']!r}")
    return wrong


@pytest.fixture(scope="module")
def results() -> dict[str, list[dict]]:
    return {command: json.loads((ROOT / "results" / name).read_text(encoding="utf-8"))["rows"]
            for command, name in RESULTS.items()}


ROWS = stated(PAGE.read_text(encoding="utf-8"))


def test_the_page_states_verdicts_of_both_commands():
    commands = {row["command"] for _, row in ROWS}
    assert commands == set(RESULTS), f"verdict tables for {sorted(commands)}: a parser that finds none must fail"
    assert len(ROWS) >= 60


@pytest.mark.parametrize(("line", "row"), ROWS, ids=[f"engines.md:{n}" for n, _ in ROWS])
def test_each_stated_verdict_is_the_results(line, row, results):
    wrong = mismatches(row, results)
    assert not wrong, f"docs/engines.md line {line}: " + "; ".join(wrong)


def test_a_verdict_typed_wrong_fails():
    results = {"parity": [{"engine": "ct2", "model": "gemma2", "route": r, "cap": "final", "verdict": "ignored"}
                          for r in ("default", "fp32")]}
    row = {"command": "parity", "engine": "ct2", "model type": "gemma2", "route": "default, fp32", "cap": "final"}
    assert mismatches({**row, "verdict": "ignored"}, results) == []
    assert mismatches({**row, "verdict": "applied"}, results) == [
        "parity: ('ct2', 'gemma2', 'default', 'final') is 'ignored', the page says 'applied'",
        "parity: ('ct2', 'gemma2', 'fp32', 'final') is 'ignored', the page says 'applied'"]
    assert mismatches({**row, "route": "default, kv32", "verdict": "ignored"}, results) == [
        "parity: no row ('ct2', 'gemma2', 'kv32', 'final')"]
    table = "| " + " | ".join(HEADER) + " |\n| --- |\n| parity | ct2 | gemma2 | default | final | ignored |\n\ntext"
    assert stated(table) == [(3, {**row, "route": "default", "verdict": "ignored"})]
