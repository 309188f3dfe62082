"""parity --server against hostile or broken servers: a listener on 127.0.0.1 in a thread answers each request as the
test says (a wrong shape, a trickle, a redirect, values that are no log-probabilities), and the exchange must end in
a reason, within its deadline, never in an exception."""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from softcapgrad.core.checks import InputError
from softcapgrad.engines.served import server

PIECES = ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"<t{i}>" for i in range(4, 16)]
IDS = list(range(4, 12))
MODELS = {"data": [{"id": "m"}]}
PAUSE = 0.05  # seconds between the pieces of a trickled answer
TRICKLE = 200  # pieces at most: a trickle stops by itself after 10 s


def _json(value) -> tuple[int, dict, bytes]:
    return 200, {"Content-Type": "application/json"}, json.dumps(value).encode()


@contextlib.contextmanager
def listening(answer):
    """An HTTP server on 127.0.0.1 in a thread; ``answer(path, body)`` gives (status, headers, payload): bytes, or
    an iterable of pieces written one per PAUSE (no Content-Length). Stopped, its trickles too, on the way out."""
    stop = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self._answer(None)

        def do_POST(self):
            self._answer(json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0)))))

        def _answer(self, body):
            status, headers, payload = answer(self.path, body)
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            if isinstance(payload, bytes) and "Content-Length" not in headers:
                self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            for piece in [payload] if isinstance(payload, bytes) else payload:
                if stop.is_set():
                    return
                self.wfile.write(piece)
                if not isinstance(payload, bytes):
                    stop.wait(PAUSE)

        def log_message(self, *args):
            pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True

        def handle_error(self, request, client_address):
            pass  # the client hung up mid-answer: its deadline, as meant

    with Server(("127.0.0.1", 0), Handler) as httpd:
        thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{httpd.server_address[1]}"
        finally:
            stop.set()
            httpd.shutdown()
            thread.join(5)


def completions(choices):
    """A server listing model m and answering every completion with ``{"choices": choices}``."""
    return lambda path, body: _json(MODELS if path == "/v1/models" else {"choices": choices})


def prompt_answer(values: np.ndarray) -> dict:
    """vLLM's form for a prompt of len(values) tokens: row t of ``values`` is the distribution of token t + 1."""
    rows = [{str(j): {"logprob": float(v), "rank": 1} for j, v in enumerate(row)} for row in values[:-1]]
    last = {PIECES[j]: float(v) for j, v in enumerate(values[-1])}
    return {"choices": [{"prompt_logprobs": [None] + rows, "logprobs": {"top_logprobs": [last]}}]}


def logprobs(seed: int = 0) -> np.ndarray:
    z = np.random.default_rng(seed).normal(size=(len(IDS), len(PIECES)))
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def ask(url: str, timeout: float = 2.0) -> server.Answer:
    return server.ask(url, IDS, PIECES, timeout=timeout)


@pytest.mark.parametrize("choices, said", [
    ("abc", "the server's `choices` is a string, not a list"),
    (3, "the server's `choices` is a number, not a list"),
    ([], "the server's `choices` is an empty list"),
    ([{"logprobs": []}], "the server's `choices[0].logprobs` is a list, not an object"),
    ([{"logprobs": {"top_logprobs": [["<t4>", -1.0]]}}],
     "the server's `choices[0].logprobs.top_logprobs[0]` is a list, not an object"),
    ([{"logprobs": {"top_logprobs": "abc"}}], "the server's `choices[0].logprobs.top_logprobs` is a string, not a list"),
    ([{"prompt_logprobs": [None, {"x1": -1.0}]}], 'the server\'s `choices[0].prompt_logprobs[1]` has the key "x1", '
                                                  "not a token id"),
    ([{"prompt_logprobs": [None, {"5": "-1.0"}]}],
     'the server\'s `choices[0].prompt_logprobs[1]["5"]` is a string, not a number or an object'),
    ([{"prompt_logprobs": [None, {"5": {"rank": 1}}]}], 'the server\'s `choices[0].prompt_logprobs[1]["5"]` has no '
                                                        "`logprob`"),
    ([{"logprobs": {"top_logprobs": [{"<t4>": "-1"}]}}],
     'the server\'s `choices[0].logprobs.top_logprobs[0]["<t4>"]` is a string, not a number'),
    ([{"prompt_logprobs": 7}], "the server's `choices[0].prompt_logprobs` is a number, not a list"),
])
def test_a_completion_of_another_shape_is_a_reason_naming_where(choices, said):
    with listening(completions(choices)) as url:
        answer = ask(url)
    assert answer.logprobs is None and said in answer.reason, answer.reason
    assert answer.requests == 2  # the models list, then one completion: a deviation ends the exchange


@pytest.mark.parametrize("listed, said", [
    ({"data": {"id": "m"}}, "/v1/models: the server's `data` is an object, not a list"),
    ({"data": [{"id": 5}]}, "/v1/models: the server's `data[0].id` is a number, not a string"),
    ({"data": ["m"]}, "/v1/models: the server's `data[0]` is a string, not an object"),
    ({"data": []}, "/v1/models: the server's `data` is an empty list"),
    ([{"id": "m"}], "/v1/models: the server's answer is a list, not an object"),
    ({"object": "list"}, "/v1/models: the server's answer has no `data`"),
    ({"data": [{"id": "\ud800"}]}, "/v1/models: the server's `data[0].id` is not Unicode text (it holds a lone "
                                   "surrogate)"),
])
def test_a_models_listing_of_another_shape_is_a_reason(listed, said):
    with listening(lambda path, body: _json(listed)) as url:
        answer = ask(url)
    assert answer.logprobs is None and answer.reason == said and answer.requests == 1


def test_json_nested_past_the_decoders_recursion_is_a_reason():
    deep = b"[" * 200_000 + b"]" * 200_000
    with listening(lambda path, body: (200, {}, deep)) as url:
        answer = ask(url)
    assert answer.reason == "/v1/models: the answer nests deeper than the JSON decoder goes"


@pytest.mark.parametrize("declared", [True, False])
def test_an_answer_over_the_size_bound_is_refused(declared):
    body = b"{" + b" " * server.MAX_BODY + b"}"  # valid JSON, one byte too many
    headers = {"Content-Length": str(len(body))} if declared else {"Connection": "close"}
    payload = body if declared else [body[i:i + 2 ** 20] for i in range(0, len(body), 2 ** 20)]
    with listening(lambda path, body_: (200, headers, payload)) as url:
        answer = ask(url, timeout=5)
    said = "would be 8,388,610 bytes" if declared else "is longer than 8,388,608 bytes"
    assert answer.reason.startswith("/v1/models: the answer ") and said in answer.reason, answer.reason


def test_a_trickled_answer_is_cut_off_at_the_requests_deadline():
    trickle = itertools.chain([b'{"data": [{"id": "m"}]'], itertools.repeat(b" ", TRICKLE))
    with listening(lambda path, body: (200, {}, trickle)) as url:
        started = time.monotonic()
        answer = ask(url, timeout=1)
        took = time.monotonic() - started
    assert answer.reason == "/v1/models: no answer in 1 s" and answer.requests == 1
    assert took < 1 + 2  # one deadline for the whole request (each byte arrives well within a timeout of its own)


def test_a_redirect_is_not_followed():
    seen = []

    def answer(path, body):
        seen.append(path)
        return 302, {"Location": "http://192.0.2.1/v1/models"}, b""

    with listening(answer) as url:
        answer_ = ask(url)
    assert answer_.reason.startswith("/v1/models: HTTP 302, a redirect to 'http://192.0.2.1/v1/models': not followed")
    assert seen == ["/v1/models"]


@pytest.mark.parametrize("values, said", [
    (np.full((len(IDS), len(PIECES)), np.nan), "128 of the 128 returned are not finite"),
    (np.full((len(IDS), len(PIECES)), 0.5), "0.5 is above 0"),
    (np.full((len(IDS), len(PIECES)), -0.5), "the 16 at position 0 add up to probability 9.7"),
    (np.full((len(IDS), len(PIECES)), -5.0), "the 16 at position 0 are all one value (-5)"),
])
def test_values_that_are_no_log_probabilities_are_named_and_not_judged(values, said):
    with listening(lambda path, body: _json(MODELS if path == "/v1/models" else prompt_answer(values))) as url:
        answer = ask(url)
    assert answer.logprobs is None and answer.form == "prompt_logprobs" and answer.requests == 2
    assert answer.reason.startswith("the server's values are not log-probabilities: ") and said in answer.reason
    judged = server.judge(answer, {"capped": values})
    assert judged["verdict"] == "not judged" and "errors" not in judged


def test_true_log_probabilities_pass_and_are_judged_where_given():
    values = logprobs()
    with listening(lambda path, body: _json(MODELS if path == "/v1/models" else prompt_answer(values))) as url:
        answer = ask(url)
    assert answer.reason is None and answer.form == "prompt_logprobs" and answer.requests == 2
    np.testing.assert_array_equal(answer.logprobs, values)  # floats survive JSON exactly (repr round-trips)
    judged = server.judge(answer, {"capped": values, "uncapped": values + 1.0})
    assert judged["errors"] == {"capped": 0.0, "uncapped": 1.0} and judged["positions"] == judged["asked"] == 8


def test_an_echo_with_fewer_tokens_than_the_prompt_is_a_reason():
    top = [None] + [{"<t4>": -1.0}] * len(IDS)
    with listening(completions([{"logprobs": {"tokens": ["<t4>"], "top_logprobs": top}}])) as url:
        answer = ask(url)
    assert "has 9 positions of log-probabilities and 1 tokens for a prompt of 8" in answer.reason, answer.reason


def test_entries_of_no_known_token_are_not_judged():
    values = logprobs()
    shape = prompt_answer(values)
    shape["choices"][0]["prompt_logprobs"] = [None] + [{"99": -1.0}] * (len(IDS) - 1)
    shape["choices"][0]["logprobs"]["top_logprobs"] = [{"other": -1.0}]
    with listening(lambda path, body: _json(MODELS if path == "/v1/models" else shape)) as url:
        answer = ask(url)
    judged = server.judge(answer, {"capped": values})
    assert judged["verdict"] == "not judged" and "none of the entries" in judged["reason"]


@pytest.mark.parametrize("url", ["http://[::1", "http://:8000", "http://host:99999", "http://host:x",
                                 "file:///etc/passwd", "http://ho st/", "http://user:pw@host/", "http://h\x07/"])
def test_a_malformed_address_is_input_error(url):
    with pytest.raises(InputError, match="^--server "):
        server.base_url(url)


def test_an_ipv6_address_keeps_its_brackets():
    assert server.base_url("http://[::1]:8000/v1") == "http://[::1]:8000"


def test_the_help_states_the_body_bound(cli):
    code, _, out, _ = cli("parity", "--help")
    assert code == 0 and f"answers read up to {server.MAX_BODY // 2 ** 20} MiB each" in " ".join(out.split())
