"""audit-model: which soft-caps of a transformers model are applied, in which format, and how much of a batch is dead.

The model is built from a local directory's ``config.json`` (its weights when present, else random
ones; never a download) or from a model type with a tiny configuration. Under each attention
implementation that is installed it runs one forward and backward inside :class:`DeadZoneMonitor`
and reports, per soft-cap site, the module, what it caps, the cap, the format the tanh ran in, the
path's first zero-gradient input and the fraction of the batch past it.

Which fields are caps is found by running (models/caps.py): one eager forward traced op by op,
then the fields moved one at a time, whatever they are called and at any depth of the
configuration; the same trace gives every softplus and sigmoid site's contract
(models/contracts.py). Per implementation, a cap the monitor saw (its module, its divisor) is
``applied``; a set cap field it did not see is probed by rebuilding the model with the field at
0.001 (same weights, same batch, no gradient) and comparing the output bit for bit: changed is
applied inside a kernel the monitor cannot see (``hidden``), unchanged is ``ignored``. A field at 0
or unset that the code skips is ``off`` under every implementation. Implementations that raise at
build or at run are ``refused`` with their message. The report is models/audit_report.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from softcapgrad.core import progress
from softcapgrad.core.checks import InputError

IMPLEMENTATIONS = ("eager", "sdpa", "flex_attention", "flash_attention_2")
TINY = {  # applied, where the config has the field, before --set: a model that builds in a blink
    "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "max_position_embeddings": 128,
}
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
TOKEN_KINDS = (".npy", ".pt", ".txt")
FORMATS = {"bfloat16", "float16", "float32"}


# --- input ------------------------------------------------------------------------------------


def parse_sets(items: list[str]) -> dict[str, Any]:
    """``key=value`` pairs; values read as JSON (numbers, true/false, null, lists), else as text."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise InputError(f"--set {item!r}: expected KEY=VALUE, e.g. --set final_logit_softcapping=30")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = None if raw.strip().lower() == "none" else raw
        out[key.strip()] = value
    return out


def read_token_ids(path: Path):
    """Token ids from ``.npy`` / ``.pt`` (an integer array, 1-D or 2-D) or ``.txt`` (integers, one sequence a line)."""
    import numpy as np
    import torch

    from softcapgrad.core.files import readable_file

    path = Path(path)
    kind = readable_file(path, TOKEN_KINDS, "--inputs")
    try:
        if kind == ".npy":
            ids = torch.from_numpy(np.load(path, allow_pickle=False))
        elif kind == ".pt":
            ids = torch.load(path, map_location="cpu", weights_only=True)
        else:
            lines = [line.split() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
            if len({len(line) for line in lines}) > 1:
                raise InputError(f"--inputs {path}: every line must hold the same number of token ids")
            ids = torch.tensor([[int(t) for t in line] for line in lines], dtype=torch.int64)
    except InputError:
        raise
    except (ValueError, OSError, RuntimeError) as err:
        raise InputError(f"--inputs {path}: cannot read token ids: {str(err).splitlines()[0]}") from None
    if not isinstance(ids, torch.Tensor) or ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise InputError(f"--inputs {path}: expected an integer array of token ids, got {getattr(ids, 'dtype', type(ids).__name__)}")
    if ids.dim() == 1:
        ids = ids[None]
    if ids.dim() != 2 or ids.numel() == 0:
        raise InputError(f"--inputs {path}: expected a non-empty 1-D or 2-D array of token ids, got shape {tuple(ids.shape)}")
    return ids.long()


# --- the model --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """Where the model comes from, and its configuration."""

    config: Any  # a transformers PreTrainedConfig
    directory: Path | None  # a local model directory, or None for --model-type
    weights: bool  # the directory holds weights


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


def model_type_config(model_type: str, sets: dict[str, Any]):
    """The tiny configuration of ``model_type`` (models/tiny.py), then ``sets`` (``SUB.KEY`` inside a sub-configuration)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from softcapgrad.models import caps, tiny

    if model_type not in CONFIG_MAPPING:
        close = sorted(k for k in CONFIG_MAPPING if model_type.split("_")[0] in k)[:8]
        raise InputError(f"--model-type {model_type!r}: not a transformers model type"
                         + (f"; similar: {', '.join(close)}" if close else ""))
    try:
        with quiet(), tiny.address_space(tiny.available_bytes() * 9 // 10):
            base = tiny.tiny_config(model_type, smoke)
    except ImportError as err:
        raise InputError(missing_package(err, model_type)) from None
    except InputError:
        raise
    except Exception as err:
        raise InputError(f"--model-type {model_type}: its tiny configuration does not validate or run: "
                         f"{tiny.reason(err)}") from None
    if not sets:
        return base
    early = base
    for key, value in sets.items():  # the size first, on the built config: a huge depth never reaches the class
        try:
            early = caps.with_value(early, key, value)
        except Exception:  # noqa: BLE001 -- the class's own check below names the field and the reason
            pass
    tiny.refuse_if_too_big(early, 2)
    kwargs = base.to_dict()
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
            return CONFIG_MAPPING[model_type](**kwargs)
    except Exception as err:
        given = ", ".join(f"{k}={v!r}" for k, v in sets.items())
        raise InputError(f"--set {given}: {tiny.reason(err)}") from None


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

    cls = runnable.model_class(config)
    torch.manual_seed(0)
    model = runnable.build(cls, config, "eager", torch.float32)
    ids = torch.randint(0, text_tokens(config), DISCOVERY, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model(**runnable.inputs(cls, config, ids, 0).kwargs)


def missing_package(err: ImportError, what: str) -> str:
    """One line naming the package an ImportError asks for."""
    import re

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
    """``config.json`` of a local directory (never downloaded), with ``sets`` applied."""
    from transformers import AutoConfig

    directory = Path(directory)
    if not (directory / "config.json").is_file():
        raise InputError(f"{directory}: no config.json there (give a local model directory, or --model-type)")
    try:
        config = AutoConfig.from_pretrained(directory, local_files_only=True)
    except (ValueError, KeyError, OSError) as err:
        raise InputError(f"{directory}/config.json: {str(err).splitlines()[0][:300]}") from None
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
    return config


def source(directory: Path | None, model_type: str | None, sets: list[str]) -> Source:
    if (directory is None) == (model_type is None):
        raise InputError("give a model directory or --model-type NAME, not both and not neither")
    values = parse_sets(sets)
    if directory is not None:
        config = directory_config(directory, values)
        weights = any((Path(directory) / name).is_file() for name in WEIGHT_FILES)
        return Source(config, Path(directory), weights)
    return Source(model_type_config(model_type, values), None, False)


def model_class(config):
    """The class audited: the language-model head where there is one, else the module that holds the caps."""
    from softcapgrad.models.runnable import model_class as chosen

    return chosen(config)


def random_ids(config, batch: int, seq_len: int, seed: int):
    """Token ids drawn uniformly below the vocabulary size, from their own generator."""
    import torch

    return torch.randint(0, text_tokens(config), (batch, seq_len), generator=torch.Generator().manual_seed(seed))


def check_ids(ids, config, where: str) -> None:
    vocab = vocabulary(config)
    if int(ids.min()) < 0 or int(ids.max()) >= vocab:
        raise InputError(f"{where}: token ids must lie in [0, {vocab}), got {int(ids.min())}..{int(ids.max())}")


def vocabulary(config) -> int:
    """The smallest ``vocab_size`` over the config and its sub-configurations: token ids must be below it."""
    sizes = [v for _, c in _configs(config) for name in ("vocab_size", "unpadded_vocab_size", "text_vocab_size")
             if isinstance(v := getattr(c, name, None), int) and v > 0]
    return min(sizes) if sizes else 1  # a model without tokens: the ids only give the batch its shape


def text_tokens(config) -> int:
    """Random text ids are drawn below this: the vocabulary less the special ids in its upper half (an image
    token drawn at random would ask for an image)."""
    from softcapgrad.models.tiny import _is_token

    vocab = vocabulary(config)
    special = [v for _, c in _configs(config) for name, v in vars(c).items()
               if _is_token(name) and isinstance(v, int) and not isinstance(v, bool) and vocab // 2 <= v < vocab]
    return min([vocab, *special])


def _configs(config, prefix: str = ""):
    """(prefix, config) for the config and every nested sub-configuration."""
    from transformers import PreTrainedConfig

    yield prefix, config
    for name, value in vars(config).items():
        if isinstance(value, PreTrainedConfig):
            yield from _configs(value, f"{prefix}{name}.")


# --- running ----------------------------------------------------------------------------------


@dataclass
class Run:
    implementation: str
    status: str  # "ran" | "forward only" | "refused at build" | "refused at run" | "not installed"
    reason: str = ""
    sites: list = field(default_factory=list)  # monitor SiteRow
    inputs: dict = field(default_factory=dict)  # (module, cap) -> fp32 tanh inputs (kept for hidden sites)
    hidden: str | None = None
    model: Any = None
    warnings: list = field(default_factory=list)  # the library's warnings during the run, one line each


def installed(implementation: str) -> bool:
    if implementation == "flash_attention_2":
        from transformers.utils import is_flash_attn_2_available

        return bool(is_flash_attn_2_available())
    if implementation == "flex_attention":
        from transformers.utils import is_torch_flex_attn_available

        return bool(is_torch_flex_attn_available())
    return True


def _first_line(err: BaseException) -> str:
    """The exception's type and first sentence, on one line."""
    text = " ".join(str(err).split()) or type(err).__name__
    end = text.find(". ")
    return f"{type(err).__name__}: {text[: end + 1] if 0 < end < 240 else text[:240]}"


def build(src: Source, config, implementation: str, dtype, state=None, device: str = "cpu"):
    from softcapgrad.models import runnable

    cls = model_class(config)
    model = runnable.build(cls, config, implementation, dtype, state, src.directory if src.weights else None)
    return model.to(device)


@dataclass(frozen=True)
class Batch:
    ids: Any  # LongTensor [batch, seq]
    scale_logits: float
    autocast: str | None  # a format name, or None
    seed: int
    device: str


def forward(model, batch: Batch, grad: bool):
    """The output (logits, else the last hidden state) of one batch, and its backward when ``grad``.

    The output embedding is scaled by ``scale_logits`` (a confident model); a model without one
    takes the batch unscaled.
    """
    import torch

    from softcapgrad.models import runnable

    handle = None
    head = model.get_output_embeddings() if batch.scale_logits != 1.0 and hasattr(model, "get_output_embeddings") else None
    if head is not None:
        handle = head.register_forward_hook(lambda module, args, out: out * batch.scale_logits)
    fed = runnable.inputs(type(model), model.config, batch.ids, batch.seed)
    kwargs = {k: v.to(batch.device) if hasattr(v, "to") else v for k, v in fed.kwargs.items()}
    if any(v.is_floating_point() for v in kwargs.values()):
        kwargs = {k: v.to(model.dtype) if v.is_floating_point() else v for k, v in kwargs.items()}
    torch.manual_seed(batch.seed)
    try:
        with torch.set_grad_enabled(grad), torch.autocast(batch.device, dtype=getattr(torch, batch.autocast or "float32"),
                                                          enabled=batch.autocast is not None):
            out = model(**kwargs)
            loss = runnable.loss(out, fed.labels) if grad else None
        if grad:
            loss.backward()
        return runnable.output(out).detach()
    finally:
        if handle is not None:
            handle.remove()


def run_implementation(src: Source, implementation: str, batch: Batch, dtype, state) -> Run:
    """Build and run one implementation; the library's warnings are kept on the run, not printed."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = _run_implementation(src, implementation, batch, dtype, state)
    run.warnings = sorted({f"{w.category.__name__}: {' '.join(str(w.message).split())[:160]}" for w in caught})
    return run


def _run_implementation(src: Source, implementation: str, batch: Batch, dtype, state) -> Run:
    from softcapgrad.stacks.watch import DeadZoneMonitor

    if not installed(implementation):
        return Run(implementation, "not installed", f"{implementation} is not installed here")
    try:
        model = build(src, src.config, implementation, dtype, state, batch.device)
    except ImportError as err:
        return Run(implementation, "not installed", _first_line(err))
    except Exception as err:  # the library refuses this implementation for this model
        return Run(implementation, "refused at build", _first_line(err))
    model.train()
    status, reason = "ran", ""
    try:
        with DeadZoneMonitor(keep_inputs=True) as monitor:
            forward(model, batch, grad=True)
    except NotImplementedError as err:  # e.g. no backward on this device: the forward alone, then
        status, reason = "forward only", _first_line(err)
        model.zero_grad(set_to_none=True)
        try:
            with DeadZoneMonitor(keep_inputs=True) as monitor:
                forward(model, batch, grad=False)
        except Exception as err2:
            return Run(implementation, "refused at run", _first_line(err2))
    except Exception as err:
        return Run(implementation, "refused at run", _first_line(err))
    inputs = {(s.module, s.cap): monitor.inputs(s) for s in monitor.sites() if s.fn == "tanh"}
    return Run(implementation, status, reason, monitor.rows(), inputs, monitor.hidden(), model)


# --- caps and gates, found by running -----------------------------------------------------------


DISCOVERY = (3, 7)  # batch and tokens of the discovery forward: apart from every tiny size, so shapes name axes


@dataclass(frozen=True)
class Discovery:
    caps: list  # caps.Cap
    gates: list  # contracts.Contract


def discover(src: Source, dtype, state, seed: int, device: str) -> Discovery:
    """One eager forward traced op by op, then one per probed field (models/caps.py); gates from the first."""
    import torch

    from softcapgrad.models import caps, contracts, trace

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, text_tokens(src.config), DISCOVERY, generator=g)
    batch = Batch(ids, 1.0, None, seed, device)
    first: dict = {}

    def tanhs_of(config):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = build(src, config, "eager", dtype, state, device)
            model.eval()
            t = trace.trace(model, lambda m: forward(m, batch, grad=False))
        first.setdefault("trace", t)
        first.setdefault("model", model)
        return t.tanhs

    found = caps.discover(src.config, tanhs_of, lambda: first["model"])
    gates = contracts.contracts(first["trace"].gates, src.config, *DISCOVERY)
    return Discovery(found, gates)


def _module(name: str) -> str:
    from softcapgrad.models.trace import layerless

    return layerless(name)


def seen(run: Run, cap) -> bool:
    """The monitor saw this cap's tanh (its module, its divisor) in this run."""
    return any(s.fn == "tanh" and s.cap is not None and cap.divisor is not None and math.isclose(s.cap, cap.divisor, rel_tol=1e-5)
               and _module(s.module) in cap.modules for s in run.sites)


def verdict(src: Source, run: Run, cap, batch: Batch, dtype, state) -> str:
    """applied | hidden | ignored | the cap's own status (off, unused, no head here) | the run's status.

    A set field the eager trace saw move no tanh (dead config) is probed under every implementation
    too: one that applies it inside a kernel makes it hidden there, not dead.
    """
    if cap.status not in ("applied", "hard-coded", "dead config"):
        return cap.status
    if run.status not in ("ran", "forward only"):
        return run.status
    if cap.status != "dead config" and seen(run, cap):
        return "applied"
    if cap.field is None:
        return "not seen"
    return probe(src, run, cap, batch, dtype, state)


def probe(src: Source, run: Run, cap, batch: Batch, dtype, state) -> str:
    """'hidden' when setting the field to PROBE_CAP changes this implementation's output, 'ignored' when it stays
    bit-identical. PROBE_CAP saturates every input above about 1e-3, so a cap that runs changes the output even
    where the model's scores are far below its real cap (a scale of 1.25 would change them by less than the
    format's rounding); an off field is never probed this way (its 0 would become a cap)."""
    import torch

    from softcapgrad.models.caps import PROBE_CAP, with_value

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the run itself already recorded this implementation's warnings
            model = build(src, with_value(src.config, cap.field, PROBE_CAP), run.implementation, dtype, state,
                          batch.device)
            model.train()
            base = forward(run.model, batch, grad=False)
            moved = forward(model, batch, grad=False)
    except Exception as err:
        return f"probe failed: {_first_line(err)}"
    return "ignored" if torch.equal(base, moved) else "hidden"


@dataclass(frozen=True)
class Audit:
    model: str  # class name
    model_type: str
    dtype: str
    device: str
    autocast: str | None
    shape: tuple[int, int]
    scale_logits: float
    random_weights: bool
    caps: list  # caps.Cap, found by running
    gates: list  # contracts.Contract
    runs: list[Run]
    verdicts: dict[int, dict[str, str]]  # index into caps -> implementation -> verdict


def audit(src: Source, implementations: list[str], batch: Batch, dtype_name: str) -> Audit:
    """Find the caps and gates, then run every implementation (an allocation past the memory available fails
    as an error, not as the process killed)."""
    from softcapgrad.models.tiny import address_space, available_bytes

    with quiet(), address_space(available_bytes() * 9 // 10):
        return _audit(src, implementations, batch, dtype_name)


def _audit(src: Source, implementations: list[str], batch: Batch, dtype_name: str) -> Audit:
    import torch

    from softcapgrad.models import runnable, tiny

    dtype = getattr(torch, dtype_name)
    tiny.refuse_if_too_big(src.config, dtype.itemsize)
    cls = runnable.model_class(src.config)
    torch.manual_seed(batch.seed)
    try:  # one set of weights for every implementation and probe: random, or the directory's
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            state = build(src, src.config, "eager", dtype, device=batch.device).state_dict()
    except ImportError as err:
        raise InputError(missing_package(err, cls.__name__)) from None
    except Exception as err:
        where = f"the weights in {src.directory}" if src.weights else f"{cls.__name__} (tiny {src.config.model_type})"
        raise InputError(f"{where} cannot be built or read: {_first_line(err)}") from None
    weights = Source(src.config, src.directory, False)  # from here on: the weights read once, as a state
    try:
        found = discover(weights, dtype, state, batch.seed, batch.device)
    except InputError:
        raise
    except Exception as err:
        raise InputError(f"{cls.__name__} does not run a forward on its tiny inputs: {_first_line(err)}") from None
    if runnable.headless(cls):  # a field its head would read is not dead: this module has no head
        found = Discovery([dataclasses.replace(c, status="no head here", evidence=c.evidence + f"; {cls.__name__} has no "
                                               "output head, which is where a final cap would run")
                           if c.status == "dead config" else c for c in found.caps], found.gates)
    runs, verdicts = [], {i: {} for i in range(len(found.caps))}
    with progress.task("audit-model: one forward and backward per attention implementation", len(implementations)) as advance:
        for implementation in implementations:
            run = run_implementation(weights, implementation, batch, dtype, state)
            for i, cap in enumerate(found.caps):
                verdicts[i][implementation] = verdict(weights, run, cap, batch, dtype, state)
            run.model = None
            runs.append(run)
            advance(1)
    if not any(r.status in ("ran", "forward only") for r in runs) and all(r.status != "not installed" for r in runs):
        first = runs[0]
        raise InputError(f"{cls.__name__} ran under no implementation: {first.implementation} {first.status}: {first.reason}")
    return Audit(
        model=cls.__name__, model_type=src.config.model_type, dtype=dtype_name, device=batch.device, autocast=batch.autocast,
        shape=tuple(batch.ids.shape), scale_logits=batch.scale_logits, random_weights=not src.weights,
        caps=found.caps, gates=found.gates, runs=runs, verdicts=verdicts,
    )


def audit_model(src: Source, implementations: list[str], ids, dtype: str, autocast: str | None, seed: int,
                scale_logits: float, device: str, given: dict):
    """Audit and report: ``given`` names the model as the user gave it (directory or type, --set, --inputs)."""
    result = audit(src, implementations, Batch(ids, scale_logits, autocast, seed, device), dtype)
    params = {**given, "attn": implementations, "dtype": dtype, "autocast": autocast, "shape": list(ids.shape),
              "seed": seed, "scale_logits": scale_logits, "device": device, "random_weights": result.random_weights}
    from softcapgrad.models.audit_report import audit_report

    return audit_report(result, params)


EXAMPLE = ["final_logit_softcapping=30", "attn_logit_softcapping=50"]


def example_report():
    """The README's example: ``audit-model --model-type gemma2 --set … --attn eager --attn sdpa --scale-logits 300``."""
    src = source(None, "gemma2", EXAMPLE)
    return audit_model(src, ["eager", "sdpa"], random_ids(src.config, 2, 16, 0), "bfloat16", None, 0, 300.0, "cpu",
                       {"model": "gemma2", "set": EXAMPLE, "inputs": None})
