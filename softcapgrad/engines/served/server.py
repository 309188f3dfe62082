"""A served model's own prompt log-probabilities, from any OpenAI-compatible ``/v1/completions`` endpoint.

``parity DIR --server URL`` checks a deployment (vLLM, llama.cpp's server, anything speaking the
completions API) against the transformers reference of the same weights. The server is asked for
the log-probabilities of every prompt position, in the first form it accepts:

1. ``prompt_logprobs`` (vLLM's extension) with the prompt as token ids: each position's top K by id;
2. ``echo`` with ``logprobs`` (the completions API's own form, which llama.cpp's server answers) with
   the prompt as text, the pieces of the model folder's tokenizer joined; the echoed tokens must be
   the prompt's ids, or the row says the server read another prompt.

Row t is the distribution the server gives for token t + 1; the last row comes from the one
generated step's log-probabilities where the answer has them (llama-cpp-python's echo lists the
prompt's positions only: its last row stays unknown). Only the top K the server returns are known (the rest stay
NaN), so the judgement is on those entries, and says K.

Nothing the server sends is trusted: each request has one deadline for connecting, the headers and the
body together, the body is read up to ``MAX_BODY`` bytes, no redirect is followed, and every answer is
checked against the shape the protocol documents (``MODELS``, ``PROMPT``, ``ECHO``: engines/served/protocol.py)
before anything is read from it, then its values against what log-probabilities are (finite, at most 0,
at most probability 1 per position, not all one value). A refused request, a timeout, an answer of another
shape or values that are not log-probabilities is the answer's ``reason``, in one line, never an
exception.
"""

from __future__ import annotations

import http.client
import io
import json
import time
import urllib.parse
from dataclasses import dataclass

import numpy as np

from softcapgrad.core.checks import InputError
from softcapgrad.engines.served.protocol import ECHO, MODELS, Misshapen, PROMPT, check

K = 20  # log-probabilities asked per position: vLLM's default max_logprobs
TIMEOUT = 60.0  # seconds per request: connecting, the headers and the whole body
MAX_REQUESTS = 4  # the models list, then at most one try per form (and one with a smaller K)
SMALL_K = 5  # the completions API's historical limit, tried once where K is refused
MAX_BODY = 8 * 2 ** 20  # bytes of one answer: K + 1 entries at 512 positions take under 2 MiB in vLLM's form
MAX_ERROR_BODY = 2 ** 16  # bytes read of a refusal's body, for its message
SLACK = 0.01  # probability a position's returned entries may exceed 1 by: servers print log-probs rounded


@dataclass(frozen=True)
class Answer:
    url: str
    model: str | None
    form: str | None  # "prompt_logprobs" or "echo": how the log-probabilities came (or the form that was answered)
    k: int  # log-probabilities asked per position
    logprobs: np.ndarray | None  # [tokens, vocabulary], NaN where the server returned none
    reason: str | None  # why there are none (None when they came)
    requests: int
    shifted: np.ndarray | None = None  # echo only: row t from the answer's position t (see judge)


def base_url(url: str) -> str:
    """The server's root (``http://host:port``, a path prefix kept, a trailing ``/v1`` dropped); bad input is
    refused in one line."""
    said = f"--server {url!r}"
    text = url.strip()
    if not text.isascii() or not text.isprintable() or " " in text:
        raise InputError(f"{said}: an address is printable ASCII without spaces (percent-encode the rest)")
    try:
        parts = urllib.parse.urlsplit(text)
        parts.port  # raises for a port that is not a number in 0..65535
    except ValueError as err:
        raise InputError(f"{said}: not an address ({err})") from None
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InputError(f"{said}: give an http:// or https:// address of an OpenAI-compatible server")
    if not parts.hostname:
        raise InputError(f"{said}: the address names no host")
    if parts.username is not None:
        raise InputError(f"{said}: credentials in the address are not sent; give the address without them")
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-3]
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))


class _Refused(Exception):
    """A form's request failed; ``final``: the exchange ends (the server answered so that no other form helps)."""

    def __init__(self, reason: str, final: bool = False):
        super().__init__(reason)
        self.final = final


class _NotLogprobs(_Refused):
    """The server answered in a form, but its values cannot be log-probabilities: nothing to judge."""

    def __init__(self, reason: str):
        super().__init__(f"the server's values are not log-probabilities: {reason}", final=True)


class _Reader(io.RawIOBase):
    """A socket read against one deadline: each read waits at most the time left, so a server that trickles
    its answer byte by byte is cut off when the request's time is up, not after every byte's own timeout."""

    def __init__(self, sock, deadline: float):
        super().__init__()
        self.sock, self.raw, self.deadline = sock, sock.makefile("rb", buffering=0), deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request's deadline passed")
        self.sock.settimeout(left)
        return self.raw.readinto(buffer)

    def close(self) -> None:
        self.raw.close()
        super().close()


class _Timed:
    """The socket as http.client's response reads it: through a _Reader."""

    def __init__(self, sock, deadline: float):
        self.sock, self.deadline = sock, deadline

    def makefile(self, mode: str):
        return io.BufferedReader(_Reader(self.sock, self.deadline))


class _Client:
    def __init__(self, url: str, timeout: float, max_requests: int):
        self.root, self.timeout, self.left, self.count = base_url(url), timeout, max_requests, 0
        self.parts = urllib.parse.urlsplit(self.root)

    def call(self, path: str, body: dict | None = None) -> object:
        """One request, its JSON answer; every failure is a _Refused naming ``path``."""
        if self.left <= 0:
            raise _Refused(f"stopped after {self.count} requests (the bound)")
        self.left -= 1
        self.count += 1
        try:
            status, location, data = self._exchange(path, body)
        except TimeoutError:
            raise _Refused(f"{path}: no answer in {self.timeout:g} s", final=True) from None
        except _Refused as err:
            raise _Refused(f"{path}: {err}", err.final) from None
        except http.client.RemoteDisconnected:
            raise _Refused(f"{path}: the server closed the connection without answering") from None
        except http.client.HTTPException as err:
            raise _Refused(f"{path}: the answer is not HTTP as http.client reads it ({type(err).__name__})",
                           final=True) from None
        except OSError as err:
            raise _Refused(f"{path}: {' '.join((err.strerror or str(err)).split())}") from None
        if 300 <= status < 400:
            raise _Refused(f"{path}: HTTP {status}, a redirect to {(location or '')[:200]!r}: not followed (give "
                           "the address it names as --server)", final=True)
        if status >= 400:
            raise _Refused(f"{path}: HTTP {status}: {_said(data)}")
        if status != 200:
            raise _Refused(f"{path}: HTTP {status}, not 200", final=True)
        try:
            return json.loads(data)
        except RecursionError:
            raise _Refused(f"{path}: the answer nests deeper than the JSON decoder goes", final=True) from None
        except ValueError:
            raise _Refused(f"{path}: the answer is not JSON", final=True) from None

    def _exchange(self, path: str, body: dict | None) -> tuple[int, str | None, bytes]:
        """Connect, send, read the status, headers and body, all before one deadline; a body over MAX_BODY is
        refused (a refusal's body is read up to MAX_ERROR_BODY)."""
        deadline = time.monotonic() + self.timeout
        kind = http.client.HTTPSConnection if self.parts.scheme == "https" else http.client.HTTPConnection
        connection = kind(self.parts.hostname, self.parts.port, timeout=self.timeout)
        connection.response_class = lambda sock, **kw: http.client.HTTPResponse(_Timed(sock, deadline), **kw)
        data = None if body is None else json.dumps(body).encode("utf-8")
        try:
            connection.connect()  # each address it resolves to may take the whole timeout
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("connecting took the request's time")
            connection.sock.settimeout(left)
            connection.request("GET" if body is None else "POST", self.parts.path + path, body=data,
                               headers={"Content-Type": "application/json", "Accept": "application/json"})
            response = connection.getresponse()
            limit = MAX_BODY if response.status < 300 else MAX_ERROR_BODY
            length = response.getheader("Content-Length", "")
            if response.status < 300 and length.strip().isdigit() and int(length) > limit:
                raise _Refused(f"the answer would be {int(length):,} bytes, more than {limit:,} (the bound)", True)
            data = response.read(limit + 1)
            if len(data) > limit and response.status < 300:
                raise _Refused(f"the answer is longer than {limit:,} bytes (the bound)", True)
            return response.status, response.getheader("Location"), data[:limit]
        finally:
            connection.close()


def _said(data: bytes) -> str:
    """A refusal's message: the error's text where its body is the usual JSON, else the body itself, shortened."""
    text = data.decode("utf-8", "replace")
    try:
        body = json.loads(text)
    except (ValueError, RecursionError):
        body = None
    message = body.get("error", body) if isinstance(body, dict) else body
    message = message.get("message") if isinstance(message, dict) else message
    if isinstance(message, str):
        text = message
    return " ".join(text.split())[:200]



def _call(client: _Client, path: str, shape, body: dict | None = None) -> dict:
    answer = client.call(path, body)
    try:
        check(answer, shape)
    except Misshapen as err:
        raise _Refused(f"{path}: {err}", True) from None
    return answer


def _model(client: _Client) -> str:
    return _call(client, "/v1/models", MODELS)["data"][0]["id"]


def _numbers(entry) -> list[float]:
    """One position's log-probabilities as the server gave them, whatever their keys."""
    return [float(v["logprob"] if isinstance(v, dict) else v) for v in (entry or {}).values()]


def _evidence(positions: list) -> None:
    """Refuse values that cannot be log-probabilities: not finite, above 0, more than probability 1 at a position,
    or a position's entries all one value."""
    rows = [(t, np.asarray(_numbers(e), dtype=np.float64)) for t, e in enumerate(positions)]
    rows = [(t, v) for t, v in rows if v.size]
    if not rows:
        return
    every = np.concatenate([v for _, v in rows])
    bad = int((~np.isfinite(every)).sum())
    if bad:
        raise _NotLogprobs(f"{bad:,} of the {every.size:,} returned are not finite (NaN or ±inf)")
    if every.max() > np.log1p(SLACK):
        raise _NotLogprobs(f"{every.max():.4g} is above 0 (a probability above 1)")
    most = max(((float(np.exp(v).sum()), t, v.size) for t, v in rows), key=lambda m: m[0])
    if most[0] > 1 + SLACK:
        raise _NotLogprobs(f"the {most[2]} at position {most[1]} add up to probability {most[0]:.3g}")
    flat = next(((t, v) for t, v in rows if v.size > 1 and np.ptp(v) == 0), None)
    if flat is not None:  # a model's top K are never exactly one value: a server that fills in a constant
        raise _NotLogprobs(f"the {flat[1].size} at position {flat[0]} are all one value ({flat[1][0]:.4g})")


def _top(entry, index: dict | None) -> dict[int, float]:
    """One position's entries as id -> log-probability: keyed by id (``index`` None: prompt_logprobs) or by the
    token's text (echo, and the generated step)."""
    out = {}
    for key, value in (entry or {}).items():
        number = value["logprob"] if isinstance(value, dict) else value
        token = index.get(key) if index is not None else int(key)
        if token is not None:
            out[token] = float(number)
    return out


def _fill(rows: list[dict[int, float]], vocab: int) -> np.ndarray:
    out = np.full((len(rows), vocab), np.nan)
    for t, row in enumerate(rows):
        for token, value in row.items():
            if 0 <= token < vocab:
                out[t, token] = value
    return out


def _prompt_logprobs(client: _Client, model: str, ids: list[int], k: int, index: dict, vocab: int) -> np.ndarray:
    body = {"model": model, "prompt": ids, "max_tokens": 1, "temperature": 0, "logprobs": k, "prompt_logprobs": k}
    choice = _call(client, "/v1/completions", PROMPT, body)["choices"][0]
    prompt = choice.get("prompt_logprobs")
    last = ((choice.get("logprobs") or {}).get("top_logprobs") or [None])[0]
    if not prompt or len(prompt) != len(ids) or last is None:
        raise _Refused("the answer has no prompt_logprobs for every position")
    _evidence(prompt[1:] + [last])
    return _fill([_top(e, None) for e in prompt[1:]] + [_top(last, index)], vocab)


def _echo(client: _Client, model: str, ids: list[int], k: int, pieces: list[str], index: dict,
          vocab: int) -> np.ndarray:
    body = {"model": model, "prompt": "".join(pieces[i] for i in ids), "max_tokens": 1, "temperature": 0,
            "echo": True, "logprobs": k}
    choice = _call(client, "/v1/completions", ECHO, body)["choices"][0]
    logprobs = choice.get("logprobs") or {}
    tokens, top = logprobs.get("tokens") or [], logprobs.get("top_logprobs") or []
    if len(top) < len(ids) or len(tokens) < len(ids):
        raise _Refused(f"the echo answer has {len(top)} positions of log-probabilities and {len(tokens)} tokens "
                       f"for a prompt of {len(ids)}")
    read = [index.get(t) for t in tokens[:len(ids)]]
    if read != ids:
        wrong = next(i for i, (a, b) in enumerate(zip(read, ids)) if a != b)
        raise _Refused(f"the server read the prompt as other tokens (position {wrong}: {tokens[wrong]!r})")
    _evidence(top[:len(ids) + 1])
    rows = [_top(e, index) for e in top[1:len(ids) + 1]]
    stated = _fill(rows + [{}] * (len(ids) - len(rows)), vocab)  # no generated step echoed: the last row unknown
    return stated, _fill([_top(e, index) for e in top[:len(ids)]], vocab)


def ask(url: str, ids, pieces: list[str], model: str | None = None, k: int = K, timeout: float = TIMEOUT,
        max_requests: int = MAX_REQUESTS) -> Answer:
    """The server's log-probabilities for the prompt ``ids`` (``pieces[i]`` is token i's text)."""
    client = _Client(url, timeout, max_requests)
    ids = [int(i) for i in np.asarray(ids).reshape(-1)]
    index = {p: i for i, p in enumerate(pieces)}
    vocab, reasons = len(pieces), []
    try:
        model = model or _model(client)
    except _Refused as err:
        return Answer(url, model, None, k, None, str(err), client.count)
    tries = [("prompt_logprobs", k), ("echo", k), ("echo", min(k, SMALL_K))]
    for form, n in dict.fromkeys(tries):
        try:
            if form == "prompt_logprobs":
                values, shifted = _prompt_logprobs(client, model, ids, n, index, vocab), None
            else:
                values, shifted = _echo(client, model, ids, n, pieces, index, vocab)
            return Answer(url, model, form, n, values, None, client.count, shifted)
        except _NotLogprobs as err:
            return Answer(url, model, form, n, None, str(err), client.count)
        except _Refused as err:
            reasons.append(f"{form} (K={n}): {err}")
            if err.final or client.left <= 0:
                break
    return Answer(url, model, None, k, None, "; ".join(reasons), client.count)


def _errors(values: np.ndarray, references: dict) -> dict | None:
    """The largest |difference| against each reference over the known entries (None where none is known)."""
    known = ~np.isnan(values)
    if not known.any():
        return None
    return {name: float(np.abs(values[known] - np.asarray(ref, dtype=np.float64)[known]).max())
            for name, ref in references.items()}


def judge(answer: Answer, references: dict) -> dict:
    """The largest |log-prob difference| over the entries the server returned, against each reference variant's
    log-probabilities ([tokens, vocabulary], log_softmax of its logits), and the nearest variant.

    An echo answer's position i should hold the distribution over token i given the tokens before it.
    Where its entries fit the distribution *after* token i at least ten times better (llama-cpp-python's
    server does this), that alignment is judged and the row says so: a shifted answer is a defect of the
    server's reporting, not of the model it runs."""
    if answer.logprobs is None:  # "not judged" where a form was answered with values that are no log-probabilities
        return {"reason": answer.reason, "k": answer.k,
                "verdict": "not judged" if answer.form else "could not run"}
    values, note = answer.logprobs, ""
    errors = _errors(values, references)
    if errors is None:
        return {"reason": "none of the entries the server returned names a token of the folder's vocabulary",
                "k": answer.k, "verdict": "not judged"}
    if answer.shifted is not None:
        shifted = _errors(answer.shifted, references)
        if shifted is not None and min(shifted.values()) * 10 < min(errors.values()):
            note = ("the echo's position i holds the distribution after token i, not before it (off by one); "
                    f"as the API states them the nearest reference is off by {min(errors.values()):.3g}")
            values, errors = answer.shifted, shifted
    known = ~np.isnan(values)
    rows = known.any(axis=1)
    return {"errors": errors, "nearest": min(errors, key=errors.get), "k": answer.k, "form": answer.form,
            "positions": int(rows.sum()), "asked": len(values), "entries": int(known.sum(axis=1)[rows].min()),
            "note": note, "reason": None}
