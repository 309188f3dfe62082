"""docs/claims.md is what the ledger and the committed results/claims.json write: every claim, its law, the number
its document prints, and what was computed."""

import json
from pathlib import Path

from softcapgrad.ledger import claims, claims_doc

ROOT = Path(__file__).resolve().parents[1]


def test_docs_claims_is_written_from_the_committed_ledger():
    ledger = json.loads((ROOT / "results" / "claims.json").read_text(encoding="utf-8"))
    assert (ROOT / "docs" / "claims.md").read_text(encoding="utf-8") == claims_doc.document(ledger), \
        "run make reproduce: docs/claims.md is out of date"


def test_every_claim_and_document_is_on_the_page():
    page = (ROOT / "docs" / "claims.md").read_text(encoding="utf-8")
    assert all(f"| `{c.id}` |" in page for c in claims.CLAIMS)
    assert {c.doc for c in claims.CLAIMS} == set(claims_doc.DOCUMENTS)
    assert "not run" not in page  # every claim has its computed value in the committed ledger
