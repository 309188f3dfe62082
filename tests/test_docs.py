"""Every example the README and docs/*.md show in a ```console block prints what the page says.

A console block holds one or more commands, each a line `$ softcapgrad ARGS` (a line ending in `\\` goes on
the next), followed by the output it quotes. The command runs through the real command line (the typer app,
in this process, so torch is imported once for all) with COLUMNS=100, and its standard output must equal the
quoted lines, each compared without trailing spaces, with one rule for elision: a line that is exactly `...`
stands for zero or more lines of output. Nothing else is skipped. ```sh blocks are not run (commands too slow
for the suite). A `$ softcapgrad` line anywhere but in a console or sh block fails the test, so a quoted
command is never left unchecked by accident. Pages added to docs/ later are covered by the glob.

A count the pages state (of engines, environments, capped types, claims reproduced and differing, and the rows
of the `softcapgrad engines` example, which sits in a ```sh block because its states depend on the machine) is
checked against the tool's own figures: `engines --json` and the committed ledger, which tests/test_claims.py
keeps equal to a fresh `reproduce`. Each pattern must still find its count somewhere, so a page reworded away
from a pattern fails here rather than going unchecked.
"""

import json
import re
import shlex
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from softcapgrad.cli.app import app

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
ELIDED = "..."


def blocks(text: str) -> list[tuple[str, int, list[str]]]:
    """(info string, first line number, lines) of each fenced block."""
    out, lines = [], text.split("\n")
    i = 0
    while i < len(lines):
        fence = re.match(r"^(`{3,})(\S*)", lines[i])
        if fence:
            end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith(fence.group(1))), len(lines))
            out.append((fence.group(2), i + 2, lines[i + 1:end]))
            i = end
        i += 1
    return out


def examples(lines: list[str]) -> list[tuple[list[str], list[str]]]:
    """(arguments, quoted output) of each command of a console block."""
    found: list[tuple[list[str], list[str]]] = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith("$ "):
            raise ValueError(f"console block: output before any command: {lines[i]!r}")
        command = lines[i][2:]
        while command.endswith("\\"):
            i += 1
            command = command[:-1] + " " + lines[i].strip()
        words = shlex.split(command)
        if words[0] != "softcapgrad":
            raise ValueError(f"console block: a command other than softcapgrad: {command!r}")
        quoted = []
        i += 1
        while i < len(lines) and not lines[i].startswith("$ "):
            quoted.append(lines[i])
            i += 1
        while quoted and not quoted[-1].strip():
            quoted.pop()
        found.append((words[1:], quoted))
    return found


def matches(quoted: list[str], printed: list[str]) -> bool:
    """Whether the printed lines are the quoted ones, `...` standing for zero or more lines."""
    if not quoted:
        return not printed
    head, rest = quoted[0].rstrip(), quoted[1:]
    if head == ELIDED:
        return any(matches(rest, printed[k:]) for k in range(len(printed) + 1))
    return bool(printed) and printed[0].rstrip() == head and matches(rest, printed[1:])


CASES = [pytest.param(args, quoted, id=f"{page.relative_to(ROOT)}:{line}")
         for page in PAGES for info, line, lines in blocks(page.read_text(encoding="utf-8")) if info == "console"
         for args, quoted in examples(lines)]


def test_the_pages_quote_commands_to_check():
    assert len(CASES) >= 5  # the README's examples at least: a parser that finds nothing must fail


@pytest.mark.parametrize(("args", "quoted"), CASES)
def test_a_quoted_command_prints_what_the_page_says(args, quoted):
    result = CliRunner().invoke(app, args, env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.stderr
    printed = result.stdout.rstrip("\n").split("\n")
    assert matches(quoted, printed), "printed:\n" + result.stdout


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_command_is_quoted_outside_a_console_or_sh_block(page):
    text = page.read_text(encoding="utf-8")
    inside = {n for info, line, lines in blocks(text) if info in ("console", "sh")
              for n in range(line, line + len(lines))}
    stray = [n for n, body in enumerate(text.split("\n"), 1) if body.startswith("$ softcapgrad") and n not in inside]
    assert not stray, f"{page.name}: `$ softcapgrad` outside a console or sh block on lines {stray}"


def test_the_elision_rule_is_strict():
    assert matches(["a", ELIDED, "d"], ["a", "b", "c", "d"]) and matches(["a", ELIDED], ["a"])
    assert not matches(["a", "c"], ["a", "b", "c"])  # a missing line is not elided without `...`
    assert not matches(["a", ELIDED, "x"], ["a", "b"]) and not matches(["a"], ["a", "b"])
    assert matches(["a  "], ["a"]) and not matches(["a b"], ["a  b"])  # trailing spaces only


# --- the counts the pages state ------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine_rows() -> list[dict]:
    result = CliRunner().invoke(app, ["engines", "--json"])  # lists the environments, builds nothing
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)["rows"]


@pytest.fixture(scope="module")
def real(engine_rows) -> dict[str, int]:
    from softcapgrad.engines.forward.modeltypes import LABELS

    ledger = json.loads((ROOT / "results" / "claims.json").read_text(encoding="utf-8"))["rows"]
    verdicts = Counter(row["verdict"] for row in ledger)
    parity = [r for r in engine_rows if r["check"] != "train-parity"]  # the engines parity runs
    return {"engines": len(parity), "environments": len({r["environment"] for r in parity} - {"main"}),
            "other capped types": len(LABELS) - 1, "claims": len(ledger), "claims from the documents": len(ledger) - 3,
            "reproduced": verdicts["reproduced"], "differ": verdicts["differs"]}


COUNTS = {  # a phrase of the pages -> the figure each of its numbers states
    r"\b(\d+) engines and libraries": ("engines",),
    r"\ball (\d+) engines\b": ("engines",),
    r"\bthe (\d+) environments\b": ("environments",),
    r"\bother (\d+) capped types\b": ("other capped types",),
    r"\bholds (\d+) claims, (\d+) from the three documents and three beyond them": ("claims", "claims from the documents"),
    r"\b(\d+) are reproduced and (\d+) differ\b": ("reproduced", "differ"),
}


def stated(pattern: str) -> list[tuple[str, re.Match]]:
    """(page, match) of every place a pattern finds, lines joined so that a phrase may wrap."""
    return [(str(page.relative_to(ROOT)), m) for page in PAGES
            for m in re.finditer(pattern, " ".join(page.read_text(encoding="utf-8").split()))]


@pytest.mark.parametrize("pattern", COUNTS, ids=lambda p: " and ".join(COUNTS[p]))
def test_every_count_the_pages_state_is_the_tools(pattern, real):
    found = stated(pattern)
    assert found, f"no page states {pattern!r} any more: reword the pattern with the page"
    wrong = [f"{page}: {m.group(0)!r} where the tool gives {real[name]}"
             for page, m in found for name, shown in zip(COUNTS[pattern], m.groups()) if int(shown) != real[name]]
    assert not wrong, "; ".join(wrong)


def quoted_runs(*args: str) -> list[tuple[str, list[str]]]:
    """(page, quoted output) of every command ``softcapgrad ARGS`` a console or sh block shows."""
    return [(str(page.relative_to(ROOT)), quoted) for page in PAGES
            for info, line, lines in blocks(page.read_text(encoding="utf-8"))
            if info in ("console", "sh") and lines and lines[0].startswith("$ softcapgrad")
            for words, quoted in examples(lines) if tuple(words) == args]


def test_the_engines_example_counts_the_engines_the_tool_lists(engine_rows):
    shown = quoted_runs("engines")
    assert shown, "no page quotes `softcapgrad engines`"
    for page, quoted in shown:
        head = re.fullmatch(r"(\d+) of (\d+) engines can run now: (.*)\.", quoted[0])
        assert head, f"{page}: {quoted[0]!r}"
        cells = [[c.strip() for c in line.strip("│").split("│")] for line in quoted if line.startswith("│")]
        rows = [c for c in cells if c[0]]  # a row's continuation lines have an empty first cell
        runnable = head.group(3).split(", ")
        parity = [r for r in engine_rows if r["check"] != "train-parity"]
        assert int(head.group(2)) == len(parity), f"{page}: {quoted[0]!r}, the tool lists {len(parity)}"
        assert [r[0] for r in rows] == [r["engine"] for r in engine_rows], f"{page}: the table's rows"
        ready = [r[0] for r in rows if r[3] == "installed" and r[1] != "train-parity"]  # engine, check, env, state
        assert int(head.group(1)) == len(runnable) and runnable == ready, f"{page}: {quoted[0]!r}"
