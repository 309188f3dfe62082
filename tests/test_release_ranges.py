"""Releases and outcomes into ranges (engines/releases/ranges.py), on generated release lists and outcome sequences."""

from hypothesis import given, settings
from hypothesis import strategies as st

from softcapgrad.engines.releases import ranges

OUTCOMES = st.sampled_from([("sdpa", "ignored"), ("eager", "applied"), ("sdpa", "could not run")])


@st.composite
def walks(draw):
    """Releases 1.0.0, 1.1.0, ... and a piecewise-constant outcome for each (a few changes)."""
    n = draw(st.integers(1, 60))
    releases = [f"1.{i}.0" for i in range(n)]
    cuts = sorted(draw(st.sets(st.integers(1, max(1, n - 1)), max_size=min(4, n - 1))) if n > 1 else [])
    values = draw(st.lists(OUTCOMES, min_size=len(cuts) + 1, max_size=len(cuts) + 1))
    truth = {}
    for i, r in enumerate(releases):
        truth[r] = values[sum(1 for c in cuts if c <= i)]
    return releases, truth


def _true_ranges(releases, truth):
    out, start = [], 0
    for i in range(1, len(releases) + 1):
        if i == len(releases) or truth[releases[i]] != truth[releases[start]]:
            out.append((releases[start], releases[i - 1], truth[releases[start]]))
            start = i
    return out


@settings(max_examples=200, deadline=None)
@given(walks())
def test_every_release_measured_gives_the_true_ranges(walk):
    releases, truth = walk
    found = ranges.ranges(releases, truth)
    assert [(r.first, r.last, r.outcome) for r in found] == _true_ranges(releases, truth)
    assert [x for r in found for x in r.releases] == releases  # a partition, in order
    assert all(a.outcome != b.outcome for a, b in zip(found, found[1:]))  # maximal runs


@settings(max_examples=200, deadline=None)
@given(walks(), st.data())
def test_bisection_finds_each_boundary_measured_on_both_sides(walk, data):
    """With changes whose stretches are seen by the bisection (every outcome distinct from its neighbours' and
    each value used once), the bisected ranges are the true ones, and each boundary's two releases were run."""
    releases, truth = walk
    always = tuple(data.draw(st.lists(st.sampled_from(releases), max_size=3)))
    runs = []
    measured = ranges.bisect(releases, lambda r: runs.append(r) or truth[r], always)
    assert len(runs) == len(set(runs))  # no release run twice
    assert set(measured) == set(runs) and all(measured[r] == truth[r] for r in measured)
    assert releases[0] in measured and releases[-1] in measured and set(always) <= set(measured)
    found = ranges.ranges(releases, measured)
    assert ranges.UNMEASURED not in [r.outcome for r in found]
    for a, b in ranges.boundaries(found):
        assert a in measured and b in measured and releases.index(b) == releases.index(a) + 1
    true = _true_ranges(releases, truth)
    if len({v for *_, v in true}) == len(true):  # no outcome comes back: the assumption holds
        assert [(r.first, r.last, r.outcome) for r in found] == true
    for r in found:  # whatever the truth, a range never contradicts what was measured inside it
        assert all(measured[x] == r.outcome for x in r.measured)


@settings(max_examples=100, deadline=None)
@given(walks(), st.data())
def test_gaps_between_different_outcomes_stay_unmeasured(walk, data):
    releases, truth = walk
    picked = data.draw(st.sets(st.sampled_from(releases), min_size=1))
    measured = {r: truth[r] for r in picked}
    found = ranges.ranges(releases, measured)
    assert [x for r in found for x in r.releases] == releases
    for r in found:
        if r.outcome == ranges.UNMEASURED:
            assert not r.measured
        else:
            assert r.measured and all(measured[x] == r.outcome for x in r.measured)
    idx = {r: i for i, r in enumerate(releases)}
    known = sorted(picked, key=idx.get)
    for a, b in zip(known, known[1:]):  # between two different outcomes nothing is inferred
        if measured[a] != measured[b]:
            between = releases[idx[a] + 1:idx[b]]
            assert all(next(r for r in found if x in r.releases).outcome == ranges.UNMEASURED for x in between)


def test_admitted_reads_exclusions_and_bounds():
    releases = ["4.52.4", "4.53.0", "4.57.6", "5.0.0", "5.1.0", "5.5.4", "5.6.0", "5.17.0", "5.18.0"]
    assert ranges.admitted(releases, "<5.6,>=4.51") == ["4.52.4", "4.53.0", "4.57.6", "5.0.0", "5.1.0", "5.5.4"]
    assert ranges.admitted(releases, "!=4.53.0,!=5.0.0,!=5.1.0,<=5.17.0,>=4.52.4") == [
        "4.52.4", "4.57.6", "5.5.4", "5.6.0", "5.17.0"]


@settings(max_examples=100, deadline=None)
@given(walks(), st.sampled_from(["<1.5", ">=1.3", ">=1.2,<=1.40.0", "!=1.0.0,!=1.7.0", ">=9"]))
def test_placed_counts_every_admitted_release_once(walk, spec):
    releases, truth = walk
    found = ranges.ranges(releases, truth)
    falls = ranges.placed(found, releases, spec)
    assert sum(f["count"] for f in falls) == len(ranges.admitted(releases, spec))
    for f in falls:
        assert truth[f["first"]] == f["outcome"] == truth[f["last"]]
