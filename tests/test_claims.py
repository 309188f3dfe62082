"""The claims ledger: tolerances from printed digits, verdicts, and the reproduce command."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from softcapgrad.ledger import claims, verdicts


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


COMMITTED = Path(__file__).resolve().parent.parent / "results" / "claims.json"
LEDGER_KEYS = ("id", "computed", "verdict", "why")


def _committed_rows() -> list[list]:
    return [[row[k] for k in LEDGER_KEYS] for row in json.loads(COMMITTED.read_text())["rows"]]


def test_every_claim_has_its_expected_verdict_and_matches_the_committed_ledger():
    outcomes = verdicts.evaluate()
    wrong = [(o.id, o.computed, o.verdict) for o in outcomes if not o.as_expected]
    assert not wrong
    assert all(o.why for o in outcomes if o.verdict == "differs"), "a differing claim says why"
    assert [[getattr(o, k) for k in LEDGER_KEYS] for o in outcomes] == _committed_rows()


@pytest.mark.slow
def test_the_committed_ledger_does_not_depend_on_the_cpu_vector_width():
    """ATen picks its vectorised kernels by CPU capability; the scalar ones must give the same ledger."""
    code = ("import json; from softcapgrad.ledger.verdicts import evaluate; "
            f"print(json.dumps([[getattr(o, k) for k in {LEDGER_KEYS!r}] for o in evaluate()]))")
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default",  # and the compile cache of that capability (conftest.py)
           "TORCHINDUCTOR_CACHE_DIR": os.path.join(os.environ["TORCHINDUCTOR_CACHE_DIR"], "default")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert json.loads(proc.stdout) == _committed_rows()


def test_judged_precision_rounds_at_the_tolerance_digit():
    assert verdicts.judged_precision(3.465247, 0.005) == 3.465
    assert verdicts.judged_precision(2.8e-17, 16 * 2.0**-52) == 0.0
    assert verdicts.judged_precision(5.6e-17, 16 * 2.0**-52) == 0.0
    assert verdicts.judged_precision(-1e-9, 0.5) == 0.0 and str(verdicts.judged_precision(-1e-9, 0.5)) == "0.0"


def test_partial_reproduce_leaves_the_full_ledger_alone(cli, tmp_path):
    code, data, _, _ = cli("reproduce", "--out", str(tmp_path), "--only", "^attenuation", "--json")
    assert code == 0 and data["changed"] == [] and data["claims"] == 3
    assert not (tmp_path / "claims.json").exists()
    assert data["answer"][0].endswith("(3 of %d claims)." % len(claims.CLAIMS))


@pytest.mark.parametrize("only, needle", [("(", "not a regular expression"), ("^nothing-matches$", "matches no claim")])
def test_reproduce_only_must_select_something(cli, tmp_path, only, needle):
    code, _, out, err = cli("reproduce", "--out", str(tmp_path), "--only", only)
    assert code == 2 and out == "" and needle in err and len(err.strip().splitlines()) == 1


def test_reproduce_writes_ledger_and_fails_on_a_changed_verdict(cli, tmp_path, monkeypatch):
    code, data, _, _ = cli("reproduce", "--out", str(tmp_path), "--only", "^attenuation", "--force", "--json")
    assert code == 0 and data["changed"] == [] and data["claims"] == 3
    assert json.loads((tmp_path / "claims.json").read_text())["claims"] == 3
    assert "| attenuation-c |" in (tmp_path / "claims.md").read_text()
    assert not list(tmp_path.glob(".*.tmp")), "no temporary file is left behind"
    flipped = tuple(
        claims.Claim(c.id, c.doc, c.section, c.statement, c.stated, c.kind, c.compute, "differs")
        if c.id == "attenuation-c" else c
        for c in claims.CLAIMS
    )
    monkeypatch.setattr(claims, "CLAIMS", flipped)
    code, data, _, _ = cli("reproduce", "--out", str(tmp_path), "--only", "^attenuation", "--json")
    assert code == 1 and data["changed"] == ["attenuation-c"]
