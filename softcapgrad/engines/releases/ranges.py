"""Releases in order, some of them measured, into ranges: which stretch of releases does what at its default.

Pure logic, no transformers and no torch: ``bisect`` picks the releases to measure, ``ranges`` merges the measured
ones into runs of one outcome, ``admitted`` reads which releases a dependent project's specifier lets in and
``placed`` says where those fall among the ranges.

The bisection's one assumption, stated wherever its result is shown: between two measured releases with the same
outcome every release has that outcome too (the default is changed once and kept, not changed and changed back in
between). Every boundary it reports is measured on both sides: the last release of one outcome and the first of the
next are adjacent releases, both run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable

UNMEASURED = "not measured"
ASSUMPTION = ("between two measured releases with the same outcome, every release in between is taken to share it "
              "(the default changed once, not back and forth); each boundary is measured on both of its sides")


@dataclass(frozen=True)
class Range:
    first: str
    last: str
    outcome: Hashable  # what every release of the range does (UNMEASURED: a gap the walk left open)
    releases: tuple[str, ...]  # every release of the range, in order
    measured: tuple[str, ...]  # those run; the others are inferred under ASSUMPTION

    @property
    def count(self) -> int:
        return len(self.releases)


def bisect(releases: list[str], probe: Callable[[str], Hashable], always: tuple[str, ...] = ()) -> dict:
    """release -> outcome for the releases a bisection runs: both ends, then the middle of every stretch whose
    ends differ, until every boundary lies between adjacent releases; ``always`` are run too (first, in order),
    and their outcomes split stretches as any measured release does. ``probe`` runs one release."""
    seen: dict = {}

    def at(i: int) -> Hashable:
        if releases[i] not in seen:
            seen[releases[i]] = probe(releases[i])
        return seen[releases[i]]

    def split(lo: int, hi: int) -> None:
        inner = [i for i in range(lo + 1, hi) if releases[i] in seen]  # measured already: split there first
        if inner:
            for a, b in zip([lo, *inner], [*inner, hi]):
                split(a, b)
            return
        if hi - lo <= 1 or at(lo) == at(hi):
            return
        mid = (lo + hi) // 2
        at(mid)
        split(lo, mid)
        split(mid, hi)

    for r in always:
        if r in releases:
            at(releases.index(r))
    if releases:
        at(0)
        at(len(releases) - 1)
        split(0, len(releases) - 1)
    return seen


def ranges(releases: list[str], measured: dict) -> list[Range]:
    """``releases`` (in order) cut into maximal runs: measured releases of one outcome with only unmeasured ones
    between them form one range; unmeasured releases between two different outcomes, or outside the first and
    last measured, form an UNMEASURED range of their own."""
    labels: list = [measured[r] if r in measured else None for r in releases]
    known = [i for i, v in enumerate(labels) if v is not None]
    for a, b in zip(known, known[1:]):
        if labels[a] == labels[b]:
            for i in range(a + 1, b):
                labels[i] = labels[a]
    labels = [UNMEASURED if v is None else v for v in labels]
    out: list[Range] = []
    start = 0
    for i in range(1, len(releases) + 1):
        if i == len(releases) or labels[i] != labels[start]:
            run = tuple(releases[start:i])
            out.append(Range(run[0], run[-1], labels[start], run, tuple(r for r in run if r in measured)))
            start = i
    return out


def boundaries(found: list[Range]) -> list[tuple[str, str]]:
    """(last release of a range, first release of the next) for each pair of measured ranges that meet."""
    return [(a.last, b.first) for a, b in zip(found, found[1:])
            if a.outcome != UNMEASURED and b.outcome != UNMEASURED]


def admitted(releases: list[str], specifier: str) -> list[str]:
    """The releases a requirement's specifier (``>=4.51,<5.6``, ``!=5.0.0,<=5.17.0``) lets in, in order."""
    from packaging.specifiers import SpecifierSet

    spec = SpecifierSet(specifier)
    return [r for r in releases if spec.contains(r, prereleases=False)]


def placed(found: list[Range], releases: list[str], specifier: str) -> list[dict]:
    """Where a specifier's admitted releases fall: one entry per range it reaches (the range's outcome, and the
    admitted releases in it as first, last and count)."""
    let_in = set(admitted(releases, specifier))
    out = []
    for r in found:
        inside = [x for x in r.releases if x in let_in]
        if inside:
            out.append({"outcome": r.outcome, "first": inside[0], "last": inside[-1], "count": len(inside)})
    return out
