"""Where an audited model comes from: a local directory's ``config.json`` or a model type's tiny configuration.

Nothing in a model directory ever runs. ``config.json`` is read here as data (plain ``json``, its
depth bounded); a ``model_type`` transformers does not know is refused before transformers sees the
file (only code in the directory could build it, and none is run), and an ``auto_map`` beside a known
type is dropped and said so. Every transformers call passes ``trust_remote_code=False`` and nothing
reads stdin, so the library has neither a reason nor a way to ask. ``--set`` values, the caps and the
size the configuration would take are checked on the raw dictionary, before any class builds it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from softcapgrad.core.checks import FP32_NORMAL_RANGE, InputError

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
CONFIG_BYTES = 16 << 20  # a config.json is kilobytes; past this it is not one
MAX_DEPTH = 32  # nesting of config.json: a model's configuration is a few levels deep
CAP_NAME = re.compile(r"softcap|(^|_)cap(ping)?($|_)")  # final_logit_softcapping, attention_logit_cap; not capacity


@dataclass(frozen=True)
class Source:
    """Where the model comes from, and its configuration."""

    config: Any  # a transformers PreTrainedConfig
    directory: Path | None  # a local model directory, or None for --model-type
    weights: bool  # the directory holds weights
    notes: tuple = ()  # what the reading dropped or changed, said in the answer (an auto_map ignored)
    changes: tuple = ()  # fields of a tiny configuration set other than by shrinking (overrides, repairs)


@contextlib.contextmanager
def no_stdin():
    """stdin replaced by an empty stream meanwhile: nothing the library might ask can be answered."""
    import io

    previous = sys.stdin
    sys.stdin = io.StringIO("")
    try:
        yield
    finally:
        sys.stdin = previous


def parse_sets(items: list[str]) -> dict[str, Any]:
    """``key=value`` pairs; values read as JSON (numbers, true/false, null, lists), else as text."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise InputError(f"--set {item!r}: expected KEY=VALUE, e.g. --set final_logit_softcapping=30")
        try:
            value = json.loads(raw)
        except (json.JSONDecodeError, RecursionError):
            value = None if raw.strip().lower() == "none" else raw
        if _depth(value) > MAX_DEPTH:
            raise InputError(f"--set {key.strip()}: nested deeper than {MAX_DEPTH} levels")
        out[key.strip()] = value
    return out


def _depth(value) -> int:
    """Nesting depth of a JSON value, counted without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, d)
            if d <= MAX_DEPTH:
                stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def check_caps(d: dict, where: str) -> None:
    """Every cap-named number in ``d`` (at any depth) is 0 (off) or a cap the model can divide by in fp32."""
    lo, hi = FP32_NORMAL_RANGE
    stack = [("", d)]
    while stack:
        prefix, node = stack.pop()
        for key, value in node.items():
            if isinstance(value, dict):
                stack.append((f"{prefix}{key}.", value))
            elif (CAP_NAME.search(str(key)) and isinstance(value, (int, float)) and not isinstance(value, bool)
                  and value != 0 and not (math.isfinite(value) and lo <= value <= hi)):
                raise InputError(f"{where}{prefix}{key} = {value!r}: a soft-cap is 0 (off) or a finite number in "
                                 f"[{lo:.4g}, {hi:.4g}] (its tanh input is divided by it in fp32)")


def read_config_json(directory: Path) -> dict:
    """``config.json`` as a dictionary, read as data: bounded in size and depth, never a traceback."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise InputError(f"{directory}: no config.json there (give a local model directory, or --model-type)")
    try:
        if path.stat().st_size > CONFIG_BYTES:
            raise InputError(f"{path}: {path.stat().st_size:,} bytes is not a model configuration")
        d = json.loads(path.read_text(encoding="utf-8"))
    except RecursionError:
        raise InputError(f"{path}: nested deeper than {MAX_DEPTH} levels; not a model configuration") from None
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise InputError(f"{path}: not readable JSON: {' '.join(str(err).split())[:200]}") from None
    if not isinstance(d, dict):
        raise InputError(f"{path}: expected a JSON object, got {type(d).__name__}")
    if _depth(d) > MAX_DEPTH:
        raise InputError(f"{path}: nested deeper than {MAX_DEPTH} levels; not a model configuration")
    return d


def known_type(d: dict, path: Path) -> tuple[str, tuple]:
    """The dictionary's model type, which transformers must know; the notes for what is dropped (an auto_map)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = d.get("model_type")
    custom = "auto_map" in d
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        what = f"model_type {model_type!r}" if model_type is not None else "no model_type"
        if custom:
            raise InputError(f"{path}: {what} is not a transformers model type and its auto_map names code in the "
                             "directory; code from a model directory is never run: refused")
        raise InputError(f"{path}: {what} is not a transformers model type")
    if not custom:
        return model_type, ()
    names = sorted(d["auto_map"]) if isinstance(d["auto_map"], dict) else []
    return model_type, (f"config.json's auto_map ({', '.join(names) or 'custom code'}) was ignored: the model was built "
                        f"from transformers' own {model_type} classes, and no code from the directory ran.",)


def _fields(config_class) -> set[str]:
    if dataclasses.is_dataclass(config_class):
        return {f.name for f in dataclasses.fields(config_class)}
    import inspect

    return set(inspect.signature(config_class).parameters)


def _known(config_class, values: dict[str, Any], where: str) -> dict[str, Any]:
    """``values`` checked against the config class's fields; integers given to float fields become floats."""
    names = _fields(config_class)
    types = {f.name: str(f.type) for f in dataclasses.fields(config_class)} if dataclasses.is_dataclass(config_class) else {}
    out = {}
    for key, value in values.items():
        if key not in names:
            raise InputError(f"--set {where}{key}: {config_class.__name__} has no field {key!r}")
        kind = types.get(key, "")
        if isinstance(value, int) and not isinstance(value, bool) and "float" in kind and "int" not in kind:
            value = float(value)
        out[key] = value
    return out


def _merged(d: dict, sets: dict[str, Any]) -> dict:
    """A copy of ``d`` with the dotted ``sets`` written in (for the checks before building)."""
    import copy

    out = copy.deepcopy(d)
    for key, value in sets.items():
        target = out
        *heads, last = key.split(".")
        for head in heads:
            target = target.setdefault(head, {}) if isinstance(target.get(head, {}), dict) else {}
        target[last] = value
    return out


def checked_before_building(d: dict, sets: dict[str, Any], where: str, itemsize: int = 2) -> None:
    """Caps and size of ``d`` with ``sets`` applied, on the dictionary: nothing is built yet."""
    from softcapgrad.models import tiny

    merged = _merged(d, sets)
    check_caps(_merged({}, sets), "--set ")
    check_caps(merged, where)
    tiny.refuse_if_too_big_dict(merged, itemsize)


def model_type_config(model_type: str, sets: dict[str, Any], changes: list | None = None):
    """The tiny configuration of ``model_type`` (models/tiny.py), then ``sets`` (``SUB.KEY`` inside a sub-configuration)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from softcapgrad.models import tiny

    if model_type not in CONFIG_MAPPING:
        close = sorted(k for k in CONFIG_MAPPING if model_type.split("_")[0] in k)[:8]
        raise InputError(f"--model-type {model_type!r}: not a transformers model type"
                         + (f"; similar: {', '.join(close)}" if close else ""))
    check_caps(_merged({}, sets), "--set ")
    changes = [] if changes is None else changes
    try:
        with quiet(), tiny.address_space(tiny.available_bytes() * 9 // 10):
            base = tiny.tiny_config(model_type, smoke, changes=changes)
    except ImportError as err:
        base = _text_path(model_type, err, changes)
    except InputError:
        raise
    except Exception as err:
        raise InputError(f"--model-type {model_type}: its tiny configuration does not validate or run: "
                         f"{tiny.reason(err)}") from None
    if not sets:
        return base
    kwargs = base.to_dict()
    checked_before_building(kwargs, sets, "")  # a huge depth or width never reaches the class
    for key, value in sets.items():
        target, where, d = base, "", kwargs
        *heads, last = key.split(".")
        for head in heads:
            sub = getattr(target, head, None)
            if sub is None or not hasattr(sub, "to_dict"):
                raise InputError(f"--set {key}: {type(target).__name__} has no sub-configuration {head!r}")
            target, where = sub, f"{where}{head}."
            d = d.setdefault(head, {}) if isinstance(d.get(head, {}), dict) else {}
        if last in tiny.LAYER_COUNTS:  # a new depth: the class derives its per-layer lists again
            kept = tiny.without_layer_lists(d, last)
            d.clear()
            d.update(kept)
        d[last] = _known(type(target), {last: value}, where)[last]
    try:
        with quiet():
            return type(base)(**kwargs)
    except Exception as err:
        given = ", ".join(f"{k}={v!r}" for k, v in sets.items())
        raise InputError(f"--set {given}: {tiny.reason(err)}") from None


def _text_path(model_type: str, err: ImportError, changes: list):
    """A model whose full build needs a package not installed here, built as its text model when it has one
    (Gemma 3n without timm for its vision tower); the change is recorded. Else the one line naming the package."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from softcapgrad.models import tiny

    text = getattr(CONFIG_MAPPING[model_type](), "text_config", None)
    kind = getattr(text, "model_type", None)
    if kind is None or kind == model_type or kind not in CONFIG_MAPPING:
        raise InputError(missing_package(err, model_type)) from None
    try:
        with quiet(), tiny.address_space(tiny.available_bytes() * 9 // 10):
            config = tiny.tiny_config(kind, smoke, changes=changes)
    except Exception:  # noqa: BLE001 -- the text model fails too: the missing package is the answer
        raise InputError(missing_package(err, model_type)) from None
    changes.insert(0, f"built as its text model ({kind}): {missing_package(err, model_type)}")
    return config


@contextlib.contextmanager
def quiet():
    """The library's log kept to errors meanwhile: its warnings about a tiny configuration are not the answer."""
    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)


def smoke(config) -> None:
    """One forward of the tiny model in fp32 (it raises what the model raises): a tiny config must run."""
    import torch

    from softcapgrad.models import runnable
    from softcapgrad.models.inputs import DISCOVERY, text_tokens

    cls = runnable.model_class(config)
    torch.manual_seed(0)
    model = runnable.build(cls, config, "eager", torch.float32)
    ids = torch.randint(0, text_tokens(config), DISCOVERY, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        runnable.call(model, runnable.inputs(cls, config, ids, 0).kwargs)


def missing_package(err: ImportError, what: str) -> str:
    """One line naming the package an ImportError asks for."""
    text = " ".join(str(err).split())
    found = re.search(r"requires the (\S+) library", text) or re.search(r"No module named '([\w.]+)'", text)
    name = found.group(1) if found else (getattr(err, "name", None) or "an optional package")
    return f"{what} needs the package {name.split('.')[0]}, which is not installed here (pip install {name.split('.')[0]})"


def _validated(make, where: str):
    try:
        return make()
    except InputError:
        raise
    except Exception as err:  # transformers' strict dataclasses raise their own types
        from softcapgrad.models.tiny import reason

        raise InputError(f"--set {where}: {reason(err)}") from None


def directory_config(directory: Path, sets: dict[str, Any]):
    """``config.json`` of a local directory (never downloaded, no code of the directory run), with ``sets``."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from transformers.utils import logging

    from softcapgrad.models.source_weights import checked_weights

    logging.disable_progress_bar()  # the library's loading bar would split a one-line answer or error
    directory = Path(directory)
    d = read_config_json(directory)
    model_type, notes = known_type(d, directory / "config.json")
    not_quantized(d, directory / "config.json")
    d = floats_where_floats(CONFIG_MAPPING[model_type], {k: v for k, v in d.items() if k != "auto_map"})
    checked_before_building(d, sets, "config.json: ")
    try:
        with quiet():
            config = CONFIG_MAPPING[model_type].from_dict(d, trust_remote_code=False)
    except RecursionError:
        raise InputError(f"{directory}/config.json: nested too deeply for {model_type}'s configuration") from None
    except Exception as err:  # the class's own validation of the file's values
        raise InputError(f"{directory}/config.json: {' '.join(str(err).split())[:300]}") from None
    for key, value in sets.items():
        target, name = config, key
        while "." in name:
            head, name = name.split(".", 1)
            target = getattr(target, head, None)
            if target is None:
                raise InputError(f"--set {key}: {type(config).__name__} has no sub-configuration {head!r}")
        if not hasattr(target, name):
            raise InputError(f"--set {key}: {type(target).__name__} has no field {name!r}")
        value = _known(type(target), {name: value}, key[: len(key) - len(name)])[name]
        _validated(lambda: setattr(target, name, value), f"{key}={value!r}")
    enough_tokens(config, directory)
    checked_weights(directory, config)  # header, shapes and values, before any model is built
    return config, notes


def not_quantized(d: dict, path: Path) -> None:
    """A quantized checkpoint (bitsandbytes, GPTQ, AWQ...) is refused: its weights are not the model's
    numbers, and loading them would need the quantizer's own package and kernels."""
    for where, node in (("", d), *((f"{k}.", v) for k, v in d.items() if isinstance(v, dict))):
        q = node.get("quantization_config")
        if q is not None:
            method = q.get("quant_method", "unnamed") if isinstance(q, dict) else "unnamed"
            raise InputError(f"{path}: {where}quantization_config ({method}): quantized weights are not read here; "
                             "give the unquantized model")


def floats_where_floats(config_class, d: dict) -> dict:
    """``d`` with an integer given to a float field made a float (``"final_logit_softcapping": 30``), in the
    sub-configurations too: what --set does, and what the strict configuration classes would refuse."""
    subs = getattr(config_class, "sub_configs", None) or {}
    out = dict(_known_floats(config_class, d))
    for key, sub in subs.items():
        if isinstance(out.get(key), dict) and isinstance(sub, type):
            out[key] = floats_where_floats(sub, out[key])
    return out


def _known_floats(config_class, d: dict) -> dict:
    if not dataclasses.is_dataclass(config_class):
        return d
    types = {f.name: str(f.type) for f in dataclasses.fields(config_class)}
    return {k: float(v) if isinstance(v, int) and not isinstance(v, bool) and "float" in types.get(k, "")
            and "int" not in types.get(k, "") else v for k, v in d.items()}


MIN_TEXT_TOKENS = 2  # random text ids are drawn below the special ids: fewer than two would be one token repeated


def enough_tokens(config, directory: Path) -> None:
    """The vocabulary leaves at least two ordinary token ids below its special ones: else every input the
    tool draws is one token, repeated (a vocabulary of 2 whose ids are pad and eos)."""
    from softcapgrad.models.inputs import text_tokens, vocabulary

    vocab = vocabulary(config)
    if vocab > 1 and text_tokens(config) < MIN_TEXT_TOKENS:
        raise InputError(f"{directory}/config.json: a vocabulary of {vocab} leaves {text_tokens(config)} token id(s) "
                         f"below its special ids; at least {MIN_TEXT_TOKENS} are needed to run the model")


def source(directory: Path | None, model_type: str | None, sets: list[str]) -> Source:
    if (directory is None) == (model_type is None):
        raise InputError("give a model directory or --model-type NAME, not both and not neither")
    values = parse_sets(sets)
    with no_stdin():
        if directory is not None:
            config, notes = directory_config(directory, values)
            weights = any((Path(directory) / name).is_file() for name in WEIGHT_FILES)
            return Source(config, Path(directory), weights, notes)
        changes: list = []
        config = model_type_config(model_type, values, changes)
        return Source(config, None, False, changes=tuple(changes))
