"""The claims ledger: tolerances from printed digits, verdicts, and the reproduce command."""

import json

import pytest

from softcapgrad import claims


@pytest.mark.parametrize(
    "stated, tol",
    [("0.42", 0.005), ("1.3e-3", 0.00005), ("104", 0.5), ("3.3e-16", 0.05e-16), ("6,144", 0.5), ("8.665", 0.0005)],
)
def test_printed_tolerance(stated, tol):
    assert claims.printed_tolerance(stated) == pytest.approx(tol)


def _claim(stated, kind, value):
    return claims.Claim("t", "d", "s", "x", stated, kind, lambda: value, "reproduced")


def test_verdict_kinds():
    assert _claim("0.42", "approx", 0.4249).verdict(0.4249) == "reproduced"
    assert _claim("0.42", "approx", 0.4251).verdict(0.4251) == "differs"
    assert _claim("4", "at_least", 4.2).verdict(4.2) == "reproduced"
    assert _claim("4", "at_least", 3.9).verdict(3.9) == "differs"
    assert _claim("0", "exact", 0.0).verdict(0.0) == "reproduced"
    assert _claim("0", "exact", 1e-300).verdict(1e-300) == "differs"
    assert _claim("3.3e-16", "at_most", 3.3e-16).verdict(3.34e-16) == "reproduced"
    assert _claim("3.3e-16", "at_most", 4e-16).verdict(4e-16) == "differs"
    assert _claim("1", "approx", float("nan")).verdict(float("nan")) == "differs"


def test_ids_unique_and_documents_known():
    ids = [c.id for c in claims.CLAIMS]
    assert len(ids) == len(set(ids))
    assert {c.doc for c in claims.CLAIMS} <= {claims.SOFTCAP_DOC, claims.GATES_DOC, claims.TETHER_DOC}
    assert all(c.expected in ("reproduced", "differs") for c in claims.CLAIMS)


def test_every_claim_has_its_expected_verdict():
    outcomes = claims.evaluate()
    wrong = [(o.id, o.computed, o.verdict) for o in outcomes if not o.as_expected]
    assert not wrong
    assert all(o.why for o in outcomes if o.verdict == "differs"), "a differing claim says why"


def test_reproduce_writes_ledger_and_fails_on_a_changed_verdict(cli, tmp_path, monkeypatch):
    code, data, _, _ = cli("reproduce", "--out", str(tmp_path), "--only", "^attenuation", "--json")
    assert code == 0 and data["changed"] == [] and data["claims"] == 3
    assert json.loads((tmp_path / "claims.json").read_text())["claims"] == 3
    assert "| attenuation-c |" in (tmp_path / "claims.md").read_text()
    flipped = tuple(
        claims.Claim(c.id, c.doc, c.section, c.statement, c.stated, c.kind, c.compute, "differs")
        if c.id == "attenuation-c" else c
        for c in claims.CLAIMS
    )
    monkeypatch.setattr(claims, "CLAIMS", flipped)
    code, data, _, _ = cli("reproduce", "--out", str(tmp_path), "--only", "^attenuation", "--json")
    assert code == 1 and data["changed"] == ["attenuation-c"]
