"""``parity DIR --server URL``: a deployment's prompt log-probabilities against the reference of the same weights.

The reference is built as every parity run builds it (fp32 eager, the same random token ids), except
that its weights stay as the directory holds them: the server runs those, so nothing is scaled to make
a cap bind, and the answer states how far each cap was reached. The server is asked for the same token ids (``server.ask``), and each cap gets a verdict from which
reference variant the returned top-K entries fit: a variant that keeps the cap, or one without it.
A server gives log-probabilities, not logits: its largest |logit| is unknown and the row says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from softcapgrad.engines import reference as ref
from softcapgrad.engines import server, verdict
from softcapgrad.engines.vocabulary import vocabulary

KEEPS = {"final": ("capped", "attention off"), "attention": ("capped", "final off")}  # variants with the cap on
DROPS = {"final": ("final off", "uncapped"), "attention": ("attention off", "uncapped")}
RATIO = verdict.RATIO  # the nearest variant must fit this many times better than every variant on the other side


@dataclass(frozen=True)
class Served:
    url: str
    reference: object  # reference.Reference
    answer: server.Answer
    judged: dict
    rows: list


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
    return {"cap": cap, "c": c, "verdict": verdict_, "top_k": judged["k"], "error": keep, "error_off": drop,
            "max_logit": None, "note": judged["note"] or "log-probabilities only: the server's logits are unknown"}


def rows(reference, judged: dict) -> list[dict]:
    """One row per cap; a server that gave no log-probabilities is a row per cap with its reason."""
    if judged.get("reason"):
        return [{"cap": cap, "c": reference.caps[cap], "verdict": "could not run", "top_k": judged["k"],
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
    k = served.judged["k"]
    if served.judged.get("reason"):
        return (f"The server at {served.url} gave no log-probabilities to judge: {served.judged['reason']}.",)
    said = "; ".join(f"the {r['cap']} cap {r['verdict']}" for r in served.rows)
    reach = ", ".join(f"{k} {v:.3g}" for k, v in served.reference.reach.items() if v is not None)
    return (f"The server at {served.url} ({served.answer.model}, through {served.judged['form']}): {said}, "
            f"judged on the top {k} log-probabilities it returned at {served.judged['positions']} positions.",
            f"Largest |a/c| the reference reached: {reach or 'no cap set'}; the server's largest |logit| is unknown "
            "(a completions server returns log-probabilities only).")
