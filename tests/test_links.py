"""Every relative link and image of README.md and docs/*.md names a file or folder of the repository, resolved as a
reader's viewer resolves it: from the page's own folder. Links are read by a real Markdown parser (markdown-it, which
rich already brings), so a link inside a code span or block is not one, and a reference-style link counts."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def targets(text: str) -> list[tuple[str, str]]:
    """(kind, target) of every link and image of a Markdown text, in order."""
    found = []
    stack = list(MarkdownIt("commonmark").parse(text))
    while stack:
        token = stack.pop(0)
        if token.type == "link_open":
            found.append(("link", token.attrGet("href")))
        elif token.type == "image":
            found.append(("image", token.attrGet("src")))
        stack[:0] = token.children or []
    return found


def relative(target: str) -> str | None:
    """The path part of a target that points into the repository, or None (a web address, mail, a bare anchor)."""
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not parts.path:
        return None
    return unquote(parts.path)


def test_the_parser_finds_links_and_images_and_skips_code():
    text = "[a](docs/x.md#s) ![b](fig.png) `[c](no.md)` [d](https://example.org) [e](#top)\n\n[f]: ref.md\n[g][f]\n"
    assert targets(text) == [("link", "docs/x.md#s"), ("image", "fig.png"), ("link", "https://example.org"),
                             ("link", "#top"), ("link", "ref.md")]
    assert [relative(t) for _, t in targets(text)] == ["docs/x.md", "fig.png", None, None, "ref.md"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_image_resolves(page):
    broken = [f"{kind} {target}" for kind, target in targets(page.read_text())
              if (path := relative(target)) is not None and not (page.parent / path).exists()]
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"
