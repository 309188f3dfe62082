"""``parity DIR --server URL``: a deployment's prompt log-probabilities against the reference of the same weights.

The reference is built as every parity run builds it (fp32 eager, the same random token ids), except
that its weights stay as the directory holds them: the server runs those, so nothing is scaled to make
a cap bind, and the answer states how far each cap was reached. The server is asked for the same token ids (``server.ask``), and each cap gets a verdict from which
reference variant the returned top-K entries fit: a variant that keeps the cap, or one without it.
A server gives log-probabilities, not logits: its largest |logit| is unknown and the row says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from softcapgrad.engines.forward import reference as ref
from softcapgrad.engines.served import server
from softcapgrad.engines.forward import verdict
from softcapgrad.engines.forward.vocabulary import vocabulary

KEEPS = {"final": ("capped", "attention off"), "attention": ("capped", "final off")}  # variants with the cap on
DROPS = {"final": ("final off", "uncapped"), "attention": ("attention off", "uncapped")}
RATIO = verdict.RATIO  # the nearest variant must fit this many times better than every variant on the other side
JUDGED = ("applied", "ignored", "different")  # the verdicts that judge a cap; the command exits 4 without one


@dataclass(frozen=True)
class Served:
    url: str
    reference: object  # reference.Reference
    answer: server.Answer
    judged: dict
    rows: list

    @property
    def judged_any(self) -> bool:
        return any(r["verdict"] in JUDGED for r in self.rows)


def _positions(judged: dict) -> str:
    """Where the judgement rests on fewer positions than were asked, how many."""
    if judged["positions"] < judged["asked"]:
        return f"judged at {judged['positions']} of the {judged['asked']} positions asked"
    return ""


def _row(cap: str, c, judged: dict, applied: bool) -> dict:
    errors = judged["errors"]
    keep = min(errors[v] for v in KEEPS[cap])
    drop = min(errors[v] for v in DROPS[cap])
    if c is None:
        verdict_ = "no cap set"
    elif not applied:
        verdict_ = "unused by transformers"
    elif keep * RATIO < drop:
        verdict_ = "applied"
    elif drop * RATIO < keep:
        verdict_ = "ignored"
    else:
        verdict_ = "different"
    note = judged["note"] or "log-probabilities only: the server's logits are unknown"
    return {"cap": cap, "c": c, "verdict": verdict_, "top_k": judged["k"], "error": keep, "error_off": drop,
            "max_logit": None, "note": "; ".join(filter(None, (note, _positions(judged))))}


def rows(reference, judged: dict) -> list[dict]:
    """One row per cap; a server that gave no log-probabilities (or values that are none) is a row per cap with
    its reason."""
    if judged.get("reason"):
        return [{"cap": cap, "c": reference.caps[cap], "verdict": judged["verdict"], "top_k": judged["k"],
                 "error": None, "error_off": None, "max_logit": None, "note": judged["reason"]}
                for cap in ("attention", "final")]
    return [_row(cap, reference.caps[cap], judged, reference.applied[cap]) for cap in ("attention", "final")]


def check(src, url: str, model: str | None, seq_len: int, seed: int, timeout: float) -> Served:
    """Build the reference of ``src``, ask the server at ``url`` for the same prompt, judge each cap."""
    from softcapgrad.models import audit

    ref.check(src.config)
    built = ref.build(src, seed)
    ids = audit.random_ids(src.config, 1, seq_len, seed).numpy().reshape(-1)
    reference = ref.reference(built, ids, {})
    pieces = list(vocabulary(src.config.to_dict()).pieces)
    answer = server.ask(url, reference.ids, pieces, model=model, timeout=timeout)
    judged = server.judge(answer, {k: verdict.log_probs(v) for k, v in reference.logits.items()})
    return Served(server.base_url(url), reference, answer, judged, rows(reference, judged))


def answer(served: Served) -> tuple[str, ...]:
    """The finding in one to three sentences."""
    judged = served.judged
    if judged.get("reason"):
        return (f"The server at {served.url} gave nothing to judge a cap on: {judged['reason']}.",)
    said = "; ".join(f"the {r['cap']} cap {r['verdict']}" for r in served.rows)
    reach = ", ".join(f"{k} {v:.3g}" for k, v in served.reference.reach.items() if v is not None)
    where = (f"only {judged['positions']} of the {judged['asked']} positions asked"
             if judged["positions"] < judged["asked"] else f"{judged['positions']} positions")
    first = (f"The server at {served.url} ({served.answer.model}, through {judged['form']}): {said}, "
             + (f"judged on the top {judged['k']} log-probabilities it returned at {where}." if served.judged_any else
                "so no cap was judged."))
    return (first,
            f"Largest |a/c| the reference reached: {reach or 'no cap set'}; the server's largest |logit| is unknown "
            "(a completions server returns log-probabilities only).")
