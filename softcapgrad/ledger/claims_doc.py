"""docs/claims.md: what ``make reproduce`` checks, claim by claim, written from the ledger (claims.CLAIMS) and the
committed results/claims.json, so that the page says what the ledger computes and nothing else.

Each claim: the law it checks, the number its source document prints and how it is compared (the tolerance the
printed digits give, or the bound), which document and section it comes from, and what the tool computed.
"""

from __future__ import annotations

from pathlib import Path

from softcapgrad.ledger import claims

# The three source documents, in the project's words: what each is about. The documents themselves are not part of
# the repository; the ledger holds each number it checks and its section.
DOCUMENTS = {
    claims.SOFTCAP_DOC: "tanh soft-capping, z = c·tanh(a/c): its exact gradient, the attenuation that gradient "
                        "implies, and the bf16 dead zone past which the gradient through the cap is exactly 0",
    claims.GATES_DOC: "softmax (shares of a fixed total) against softplus (one positive strength per signal) as "
                      "gates: their values, their backward passes and a per-head attention gate",
    claims.TETHER_DOC: "TetherGate, a residual gate g = F + (1 − F)·σ(β(s − θ)) whose threshold θ is tethered to "
                       "an anchor so that weight decay and the loss do not close it",
}
COMPARED = {"approx": "≈ {stated} (± {tol:.2g})", "at_most": "≤ {stated}", "at_least": "> {stated}",
            "exact": "= {stated}"}


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def document(ledger: dict) -> str:
    """The page, from the ledger's registry and the rows of a claims.json."""
    computed = {r["id"]: r for r in ledger.get("rows", [])}
    lines = [
        "# What `make reproduce` checks",
        "",
        "<!-- Written from the ledger (softcapgrad/ledger/claims.py) and results/claims.json by make reproduce; "
        "tests/test_claims_doc.py holds it to them. -->",
        "",
        f"`make reproduce` recomputes {len(claims.CLAIMS)} numbers that three source documents print, each from "
        "the law it rests on, and gives each a verdict: *reproduced* when the computed value meets the printed one "
        "(within the tolerance its printed digits give: \"0.42\" means ± 0.005, or the bound it states), *differs* "
        "otherwise. Every claim also carries the verdict expected of it, and a claim whose verdict changes makes "
        "`make reproduce` exit 1. The results are in [results/claims.md](../results/claims.md) and "
        "[results/claims.json](../results/claims.json); a claim that differs says why in its note.",
        "",
        "The three source documents are not part of the repository. What each is about:",
        "",
    ]
    lines += [f"- **{name}**: {about}." for name, about in DOCUMENTS.items()]
    for name in DOCUMENTS:
        lines += ["", f"## {name}", "",
                  "| claim | section | the law checked | the document says | computed | verdict (expected) | note |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for c in (c for c in claims.CLAIMS if c.doc == name):
            row = computed.get(c.id, {})
            says = COMPARED[c.kind].format(stated=c.stated, tol=c.tol)
            lines.append(f"| `{c.id}` | {_cell(c.section)} | {_cell(c.statement)} | {_cell(says)} | "
                         f"{_cell(row.get('computed_text', '—'))} | {row.get('verdict', 'not run')} "
                         f"({c.expected}) | {_cell(row.get('why', ''))} |")
    return "\n".join(lines) + "\n"


def write(ledger_json: Path, page: Path) -> None:
    """Rewrite ``page`` from the ledger results in ``ledger_json`` (whole or not at all)."""
    import json

    from softcapgrad.core.files import write_atomic

    write_atomic(Path(page), document(json.loads(Path(ledger_json).read_text(encoding="utf-8"))))
