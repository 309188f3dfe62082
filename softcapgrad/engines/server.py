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
NaN), so the judgement is on those entries, and says K. Every request is bounded in time, and the
whole exchange in count; a refused request, a timeout, an answer without log-probabilities is the
answer's ``reason``, in one line, never an exception.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

import numpy as np

from softcapgrad.core.checks import InputError

K = 20  # log-probabilities asked per position: vLLM's default max_logprobs
TIMEOUT = 60.0  # seconds per request
MAX_REQUESTS = 4  # the models list, then at most one try per form (and one with a smaller K)
SMALL_K = 5  # the completions API's historical limit, tried once where K is refused


@dataclass(frozen=True)
class Answer:
    url: str
    model: str | None
    form: str | None  # "prompt_logprobs" or "echo": how the log-probabilities came
    k: int  # log-probabilities asked per position
    logprobs: np.ndarray | None  # [tokens, vocabulary], NaN where the server returned none
    reason: str | None  # why there are none (None when they came)
    requests: int
    shifted: np.ndarray | None = None  # echo only: row t from the answer's position t (see judge)


def base_url(url: str) -> str:
    """The server's root (``http://host:port``, a path prefix kept, a trailing ``/v1`` dropped); bad input is
    refused in one line."""
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InputError(f"--server {url!r}: give an http:// or https:// address of an OpenAI-compatible server")
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-3]
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))


class _Refused(Exception):
    pass


class _Client:
    def __init__(self, url: str, timeout: float, max_requests: int):
        self.root, self.timeout, self.left, self.count = base_url(url), timeout, max_requests, 0

    def call(self, path: str, body: dict | None = None) -> dict:
        if self.left <= 0:
            raise _Refused(f"stopped after {self.count} requests (the bound)")
        self.left -= 1
        self.count += 1
        data = None if body is None else json.dumps(body).encode("utf-8")
        request = urllib.request.Request(self.root + path, data=data, method="GET" if body is None else "POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310 -- http(s) only
                return json.loads(response.read().decode("utf-8"))
        except urllib.error.HTTPError as err:
            raise _Refused(f"{path}: HTTP {err.code}: {_said(err)}") from None
        except (TimeoutError, urllib.error.URLError, OSError) as err:
            why = getattr(err, "reason", err)
            if isinstance(why, TimeoutError) or isinstance(err, TimeoutError) or "timed out" in str(why):
                raise _Refused(f"{path}: no answer in {self.timeout:g} s") from None
            raise _Refused(f"{path}: {' '.join(str(why).split())}") from None
        except ValueError:
            raise _Refused(f"{path}: the answer is not JSON") from None


def _said(err: urllib.error.HTTPError) -> str:
    try:
        text = err.read().decode("utf-8", "replace")
    except OSError:
        return err.reason or ""
    try:
        body = json.loads(text)
        message = body.get("error", body) if isinstance(body, dict) else body
        text = message.get("message", json.dumps(message)) if isinstance(message, dict) else str(message)
    except ValueError:
        pass
    return " ".join(text.split())[:200]


def _model(client: _Client) -> str:
    listed = client.call("/v1/models")
    data = listed.get("data") if isinstance(listed, dict) else None
    if not data or not isinstance(data[0], dict) or "id" not in data[0]:
        raise _Refused("/v1/models lists no model")
    return str(data[0]["id"])


def _top(entry, index: dict | None) -> dict[int, float]:
    """One position's entries as id -> log-probability: keyed by id (``index`` None: prompt_logprobs) or by the
    token's text (echo, and the generated step)."""
    out = {}
    for key, value in (entry or {}).items():
        number = value.get("logprob") if isinstance(value, dict) else value
        token = index.get(key) if index is not None else int(key)
        if token is not None and number is not None:
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
    choice = (client.call("/v1/completions", body).get("choices") or [{}])[0]
    prompt = choice.get("prompt_logprobs")
    last = ((choice.get("logprobs") or {}).get("top_logprobs") or [None])[0]
    if not prompt or len(prompt) != len(ids) or last is None:
        raise _Refused("the answer has no prompt_logprobs for every position")
    return _fill([_top(e, None) for e in prompt[1:]] + [_top(last, index)], vocab)


def _echo(client: _Client, model: str, ids: list[int], k: int, pieces: list[str], index: dict,
          vocab: int) -> np.ndarray:
    body = {"model": model, "prompt": "".join(pieces[i] for i in ids), "max_tokens": 1, "temperature": 0,
            "echo": True, "logprobs": k}
    choice = (client.call("/v1/completions", body).get("choices") or [{}])[0]
    logprobs = choice.get("logprobs") or {}
    tokens, top = logprobs.get("tokens") or [], logprobs.get("top_logprobs") or []
    if len(top) < len(ids):
        raise _Refused(f"the echo answer has {len(top)} positions of log-probabilities for a prompt of {len(ids)}")
    read = [index.get(t) for t in tokens[:len(ids)]]
    if read != ids:
        wrong = next(i for i, (a, b) in enumerate(zip(read, ids)) if a != b)
        raise _Refused(f"the server read the prompt as other tokens (position {wrong}: {tokens[wrong]!r})")
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
        except _Refused as err:
            reasons.append(f"{form} (K={n}): {err}")
            if "no answer in" in str(err) or client.left <= 0:
                break
    return Answer(url, model, None, k, None, "; ".join(reasons), client.count)


def _errors(values: np.ndarray, references: dict) -> dict:
    known = ~np.isnan(values)
    return {name: float(np.abs(values[known] - np.asarray(ref, dtype=np.float64)[known]).max())
            for name, ref in references.items()}


def judge(answer: Answer, references: dict) -> dict:
    """The largest |log-prob difference| over the entries the server returned, against each reference variant's
    log-probabilities ([tokens, vocabulary], log_softmax of its logits), and the nearest variant.

    An echo answer's position i should hold the distribution over token i given the tokens before it.
    Where its entries fit the distribution *after* token i at least ten times better (llama-cpp-python's
    server does this), that alignment is judged and the row says so: a shifted answer is a defect of the
    server's reporting, not of the model it runs."""
    if answer.logprobs is None:
        return {"reason": answer.reason, "k": answer.k}
    values, note = answer.logprobs, ""
    known = ~np.isnan(values)
    if not np.isfinite(values[known]).all():
        return {"reason": "the server returned a log-probability that is not finite", "k": answer.k}
    errors = _errors(values, references)
    if answer.shifted is not None:
        shifted = _errors(answer.shifted, references)
        if min(shifted.values()) * 10 < min(errors.values()):
            note = ("the echo's position i holds the distribution after token i, not before it (off by one); "
                    f"as the API states them the nearest reference is off by {min(errors.values()):.3g}")
            values, errors = answer.shifted, shifted
            known = ~np.isnan(values)
    rows = known.any(axis=1)
    return {"errors": errors, "nearest": min(errors, key=errors.get), "k": answer.k, "form": answer.form,
            "positions": int(rows.sum()), "entries": int(known.sum(axis=1)[rows].min()), "note": note,
            "reason": None}
