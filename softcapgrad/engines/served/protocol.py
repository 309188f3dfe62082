"""The shapes the completions protocol documents for the answers ``parity --server`` reads, and the check of an
answer against one (engines/served/server.py checks every answer so before it reads anything from it).

A shape is NUMBER or TEXT, a dict (an object with these fields: a Maybe one may be absent or null), Many (a list),
Keyed (an object of any keys: token ids where ``ids``), Maybe (that shape or null), or a tuple (one of its shapes,
chosen by the value's kind). Only what this reads is checked; other fields may hold anything.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass


class Misshapen(Exception):
    """The answer leaves the shape; the message says where, in plain words."""


NUMBER, TEXT = "a number", "a string"


@dataclass(frozen=True)
class Many:
    item: object
    least: int = 0


@dataclass(frozen=True)
class Keyed:
    value: object
    ids: bool = False


@dataclass(frozen=True)
class Maybe:
    shape: object


LOGPROB = (NUMBER, {"logprob": NUMBER})  # vLLM: {"logprob": ..., "rank": ..., "decoded_token": ...}; others: a number
TOP = Maybe(Many(Maybe(Keyed(NUMBER))))  # the completions API's top_logprobs: per position, token text -> log-prob
MODELS = {"data": Many({"id": TEXT}, least=1)}
PROMPT = {"choices": Many({"prompt_logprobs": Maybe(Many(Maybe(Keyed(LOGPROB, ids=True)))),
                           "logprobs": Maybe({"top_logprobs": TOP})}, least=1)}
ECHO = {"choices": Many({"logprobs": Maybe({"tokens": Maybe(Many(TEXT)), "top_logprobs": TOP})}, least=1)}
_TOKEN_ID = re.compile(r"[0-9]{1,12}")


def _kind(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return NUMBER
    return {str: TEXT, list: "a list", dict: "an object", type(None): "null"}.get(type(value), type(value).__name__)


def _expected(shape) -> str:
    if isinstance(shape, tuple):
        return " or ".join(_expected(s) for s in shape)
    if isinstance(shape, Maybe):
        return _expected(shape.shape) + " or null"
    return shape if isinstance(shape, str) else "a list" if isinstance(shape, Many) else "an object"


def _unicode(text: str) -> bool:
    """JSON's \\u escapes can spell half a surrogate pair, which no output encodes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check(value, shape, where: str = "") -> None:
    """Raise Misshapen naming where ``value`` leaves ``shape``, in plain words."""
    named = f"the server's `{where}`" if where else "the server's answer"
    if isinstance(shape, Maybe):
        if value is not None:
            check(value, shape.shape, where)
        return
    if isinstance(shape, tuple):
        fits = [s for s in shape if _expected(s) == _kind(value)]
        if not fits:
            raise Misshapen(f"{named} is {_kind(value)}, not {_expected(shape)}")
        return check(value, fits[0], where)
    if _kind(value) != _expected(shape):
        raise Misshapen(f"{named} is {_kind(value)}, not {_expected(shape)}")
    if shape == TEXT and not _unicode(value):
        raise Misshapen(f"{named} is not Unicode text (it holds a lone surrogate)")
    if isinstance(shape, Many):
        if len(value) < shape.least:
            raise Misshapen(f"{named} is an empty list")
        for i, item in enumerate(value):
            check(item, shape.item, f"{where}[{i}]")
    elif isinstance(shape, Keyed):
        for key, item in value.items():
            if shape.ids and not _TOKEN_ID.fullmatch(key):
                raise Misshapen(f"{named} has the key {json.dumps(key)[:40]}, not a token id")
            check(item, shape.value, f"{where}[{json.dumps(key)[:40]}]")
    elif isinstance(shape, dict):
        for name, inner in shape.items():
            if name not in value and not isinstance(inner, Maybe):
                raise Misshapen(f"{named} has no `{name}`")
            check(value.get(name), inner, f"{where}.{name}" if where else name)
