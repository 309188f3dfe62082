"""The README stays a front door: short, the two commands first, the results page and docs/ linked."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_is_short_and_leads_with_the_two_commands():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 120
    assert "make reproduce" in text.split("## What it answers")[0] and "make test " in text
    assert "results/page/index.html" in text and "docs/findings.md" in text
