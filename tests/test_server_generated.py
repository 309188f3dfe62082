"""parity --server against generated answers: whatever JSON a server sends back, and whatever numbers it puts where
log-probabilities belong, the exchange ends in an Answer (values or a reason), never an exception, and values that
reach a verdict are log-probabilities. One listener on 127.0.0.1 serves every example; each answer is drawn anew."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from softcapgrad.engines.served import server
from test_server_hostile import IDS, MODELS, PIECES, listening

EXAMPLES = 60  # per test: each example is two HTTP requests on the loopback, a few ms each

# Any JSON value a server may send: numbers of every kind (Python's json writes NaN and Infinity, as many servers
# do), text with control characters and lone surrogates, and nesting of lists and objects.
SCALARS = (st.none() | st.booleans() | st.integers(-2**70, 2**70)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=20)
# A log-probability where the protocol puts one: any float, NaN and ±inf included.
NUMBERS = st.floats(allow_nan=True, allow_infinity=True, width=64)
# Keys a server may use for top entries: token ids, the folder's token texts, and others.
KEYS = st.sampled_from([str(i) for i in range(len(PIECES))] + PIECES + ["99", "-1", "x", ""])


@pytest.fixture(scope="module")
def served():
    """(the listener's address, the holder whose 'completion' the listener sends to every completion request)."""
    holder = {"completion": b"{}"}

    def answer(path, body):
        payload = json.dumps(MODELS).encode() if path == "/v1/models" else holder["completion"]
        return 200, {"Content-Type": "application/json"}, payload

    with listening(answer) as url:
        yield url, holder


def _exchange(served, completion) -> server.Answer:
    url, holder = served
    holder["completion"] = json.dumps(completion).encode()  # NaN and Infinity as Python writes them
    answer = server.ask(url, IDS, PIECES, timeout=2.0)
    assert isinstance(answer, server.Answer)
    if answer.logprobs is None:
        assert isinstance(answer.reason, str) and answer.reason  # every refusal says why
    else:
        _are_log_probabilities(answer.logprobs)
    judged = server.judge(answer, {"capped": np.full((len(IDS), len(PIECES)), -math.log(len(PIECES)))})
    assert ("errors" in judged) == (answer.logprobs is not None and judged.get("reason") is None)
    return answer


def _are_log_probabilities(values: np.ndarray) -> None:
    """What the evidence rule promises of any values a verdict is judged on (NaN only marks an entry not returned)."""
    known = values[~np.isnan(values)]
    assert np.isfinite(known).all() and (known <= np.log1p(server.SLACK)).all()
    assert (np.exp(np.where(np.isnan(values), -np.inf, values)).sum(axis=1) <= 1 + server.SLACK + 1e-12).all()


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True)
@given(completion=VALUES)
def test_any_json_a_server_sends_is_an_answer_or_a_reason(served, completion):
    _exchange(served, completion)


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True)
@given(choices=st.lists(st.dictionaries(st.sampled_from(["prompt_logprobs", "logprobs", "text"]), VALUES,
                                        max_size=3), max_size=2))
def test_any_choices_of_the_right_outer_shape_are_an_answer_or_a_reason(served, choices):
    _exchange(served, {"choices": choices})


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True)
@given(rows=st.lists(st.none() | st.dictionaries(KEYS, NUMBERS | st.fixed_dictionaries({"logprob": NUMBERS}),
                                                 max_size=6), min_size=len(IDS), max_size=len(IDS)))
def test_any_numbers_in_the_prompt_form_reach_a_verdict_only_as_log_probabilities(served, rows):
    answer = _exchange(served, {"choices": [{"prompt_logprobs": rows}]})
    given_numbers = [float(v["logprob"] if isinstance(v, dict) else v) for row in rows[1:] if row for v in row.values()]
    if any(not math.isfinite(v) or v > math.log1p(server.SLACK) for v in given_numbers):
        assert answer.logprobs is None  # a NaN, an infinity or a positive value anywhere is never judged


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True)
@given(top=st.lists(st.none() | st.dictionaries(KEYS, NUMBERS, max_size=6), min_size=len(IDS) + 1,
                    max_size=len(IDS) + 1))
def test_any_numbers_in_the_echo_form_reach_a_verdict_only_as_log_probabilities(served, top):
    tokens = [PIECES[i] for i in [2] + IDS]  # the prompt echoed back with its first token
    answer = _exchange(served, {"choices": [{"logprobs": {"tokens": tokens, "top_logprobs": top}}]})
    if any(not math.isfinite(v) or v > math.log1p(server.SLACK) for row in top if row for v in row.values()):
        assert answer.logprobs is None
