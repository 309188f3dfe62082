"""audit-model: which soft-caps of a transformers model are applied, in which format, and how much of a batch is dead.

The model is built from a local directory's ``config.json`` (its weights when present, else random
ones; never a download) or from a model type with a tiny configuration. Under each attention
implementation that is installed it runs one forward and backward inside :class:`DeadZoneMonitor`
and reports, per soft-cap site, the module, what it caps, the cap, the format the tanh ran in, the
path's first zero-gradient input and the fraction of the batch past it.

Whether a config soft-cap is applied is decided by running, not by reading: a field the monitor saw
applied (a tanh of the scores divided by its value, in the right kind of module) is ``applied``;
any other set field is probed by rebuilding the model with the field at 0.001 (same weights, same
batch, no gradient) and comparing the logits bit for bit: changed is ``applied`` inside a kernel the
monitor cannot see (``hidden``), unchanged is ``ignored``. A field no implementation applies is
dead config. Implementations that raise at build or at run are ``refused`` with their message.
"""

from __future__ import annotations

import copy
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
PROBE_CAP = 1e-3  # the probe's cap: saturates any score above ~1e-3, so an applied cap changes the logits
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


def _split(sets: dict[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    top, nested = {}, {}
    for key, value in sets.items():
        head, dot, rest = key.partition(".")
        if dot:
            nested.setdefault(head, {})[rest] = value
        else:
            top[key] = value
    return top, nested


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
    """A tiny configuration of ``model_type``: :data:`TINY` where the config has the field, then ``sets``."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        close = sorted(k for k in CONFIG_MAPPING if model_type.split("_")[0] in k)[:8]
        raise InputError(f"--model-type {model_type!r}: not a transformers model type"
                         + (f"; similar: {', '.join(close)}" if close else ""))
    cls = CONFIG_MAPPING[model_type]
    top, nested = _split(sets)
    subs = getattr(cls, "sub_configs", {}) or {}
    top = _known(cls, top, "")
    kwargs = {k: v for k, v in TINY.items() if k in _fields(cls)}
    for name, sub in subs.items():
        if not isinstance(sub, type):
            continue
        given = _known(sub, nested.pop(name, {}), f"{name}.")
        kwargs[name] = {**{k: v for k, v in TINY.items() if k in _fields(sub)}, **given}
    if nested:
        raise InputError(f"--set {next(iter(nested))}.…: {cls.__name__} has no sub-configuration {next(iter(nested))!r}")
    kwargs.update(top)
    return _validated(lambda: cls(**kwargs))


def _validated(make):
    try:
        return make()
    except InputError:
        raise
    except Exception as err:  # transformers' strict dataclasses raise their own types
        raise InputError(f"--set: {' '.join(str(err).split())[:300]}") from None


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
        _validated(lambda: setattr(target, name, value))
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
    """The transformers class with a language-model head for ``config`` (causal, else sequence-to-sequence)."""
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
    )

    if config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return AutoModelForCausalLM
    if config.model_type in MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES:
        return AutoModelForSeq2SeqLM
    raise InputError(f"model type {config.model_type!r} has no causal or sequence-to-sequence language-model head in transformers")


def random_ids(config, batch: int, seq_len: int, seed: int):
    """Token ids drawn uniformly below the vocabulary size, from their own generator."""
    import torch

    return torch.randint(0, vocabulary(config), (batch, seq_len), generator=torch.Generator().manual_seed(seed))


def check_ids(ids, config, where: str) -> None:
    vocab = vocabulary(config)
    if int(ids.min()) < 0 or int(ids.max()) >= vocab:
        raise InputError(f"{where}: token ids must lie in [0, {vocab}), got {int(ids.min())}..{int(ids.max())}")


def vocabulary(config) -> int:
    """The smallest ``vocab_size`` over the config and its sub-configurations: token ids must be below it."""
    sizes = [v for c in _configs(config) if isinstance(v := getattr(c[1], "vocab_size", None), int)]
    return min(sizes) if sizes else 0


def _configs(config, prefix: str = ""):
    """(prefix, config) for the config and every nested sub-configuration."""
    from transformers import PreTrainedConfig

    yield prefix, config
    for name, value in vars(config).items():
        if isinstance(value, PreTrainedConfig):
            yield from _configs(value, f"{prefix}{name}.")


# --- config soft-caps ------------------------------------------------------------------------


@dataclass(frozen=True)
class CapField:
    field: str  # "final_logit_softcapping", "decoder.attn_logit_softcapping"
    caps: str  # "attention" (scores) | "final logits" | "other"
    cap: float | None


def kind_of_field(name: str) -> str:
    name = name.rsplit(".", 1)[-1]
    if "attn" in name or "attention" in name:
        return "attention"
    if "final" in name or ("logit" in name and "router" not in name):
        return "final logits"
    return "other"


def cap_fields(config) -> list[CapField]:
    """Every config field whose name holds 'softcap', set or not."""
    out = []
    for prefix, c in _configs(config):
        for name, value in vars(c).items():
            if "softcap" in name and (value is None or isinstance(value, (int, float)) and not isinstance(value, bool)):
                out.append(CapField(prefix + name, kind_of_field(name), None if value is None else float(value)))
    return out


def with_field(config, name: str, value: float):
    probe = copy.deepcopy(config)
    target = probe
    *heads, last = name.split(".")
    for head in heads:
        target = getattr(target, head)
    setattr(target, last, value)
    return probe


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
    cls = model_class(config)
    config = copy.deepcopy(config)
    if src.weights:
        model = cls.from_pretrained(src.directory, config=config, attn_implementation=implementation, dtype=dtype,
                                    local_files_only=True)
    else:
        model = cls.from_config(config, attn_implementation=implementation, dtype=dtype)
    if state is not None:
        model.load_state_dict(state)
    return model.to(device)


@dataclass(frozen=True)
class Batch:
    ids: Any  # LongTensor [batch, seq]
    scale_logits: float
    autocast: str | None  # a format name, or None
    seed: int
    device: str


def forward(model, batch: Batch, grad: bool):
    """Logits (and the loss when ``grad``) of one batch; the output embedding scaled by ``scale_logits``."""
    import torch

    handle = None
    if batch.scale_logits != 1.0:
        head = model.get_output_embeddings()
        handle = head.register_forward_hook(lambda module, args, out: out * batch.scale_logits)
    ids = batch.ids.to(batch.device)
    torch.manual_seed(batch.seed)
    try:
        with torch.set_grad_enabled(grad), torch.autocast(batch.device, dtype=getattr(torch, batch.autocast or "float32"),
                                                          enabled=batch.autocast is not None):
            out = model(input_ids=ids, labels=ids)
        if grad:
            out.loss.backward()
        return out.logits.detach()
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


# --- verdicts ---------------------------------------------------------------------------------


def kind_of_site(module: str, root: str) -> str:
    last = module.rsplit(".", 1)[-1].lower()
    if "attn" in last or "attention" in last:
        return "attention"
    return "final logits" if module == root else "other"


def _sees(run: Run, f: CapField, root: str, by_sub_model: bool = True) -> bool:
    """The monitor saw a tanh dividing by the field's value in a module of the field's kind.

    ``by_sub_model``: a field of a sub-configuration (``decoder.…``) also needs the module to lie in
    that sub-model; a site on the root model cannot tell which sub-configuration it read.
    """
    prefix = f.field.rsplit(".", 1)[0] if "." in f.field else ""
    for s in run.sites:
        if s.fn != "tanh" or s.cap is None or not math.isclose(s.cap, f.cap, rel_tol=1e-6):
            continue
        if kind_of_site(s.module, root) != f.caps:
            continue
        if not (by_sub_model and prefix) or f".{prefix}." in f".{s.module}.":
            return True
    return False


def verdict(src: Source, run: Run, f: CapField, batch: Batch, dtype, state, root: str) -> str:
    """applied | hidden | ignored | not set | the run's status; see the module docstring."""
    if run.status not in ("ran", "forward only"):
        return run.status
    if f.cap is None:
        return "not set"
    if _sees(run, f, root):
        return "applied"
    changed = probe(src, run, f, batch, dtype, state)
    if changed != "changed":
        return changed
    return "applied" if _sees(run, f, root, by_sub_model=False) else "hidden"


def probe(src: Source, run: Run, f: CapField, batch: Batch, dtype, state) -> str:
    """'changed' when setting the field to PROBE_CAP changes the logits, 'ignored' when they stay bit-identical."""
    import torch

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the run itself already recorded this implementation's warnings
            model = build(src, with_field(src.config, f.field, PROBE_CAP), run.implementation, dtype, state, batch.device)
            model.train()
            base = forward(run.model, batch, grad=False)
            changed = forward(model, batch, grad=False)
    except Exception as err:
        return f"probe failed: {_first_line(err)}"
    return "ignored" if torch.equal(base, changed) else "changed"


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
    fields: list[CapField]
    runs: list[Run]
    verdicts: dict[str, dict[str, str]]  # field -> implementation -> verdict


def audit(src: Source, implementations: list[str], batch: Batch, dtype_name: str) -> Audit:
    import torch

    dtype = getattr(torch, dtype_name)
    torch.manual_seed(batch.seed)
    state = None
    if not src.weights:  # one set of random weights for every implementation
        base = build(src, src.config, "eager", dtype, device=batch.device)
        state = base.state_dict()
        root = type(base).__name__
    else:
        root = None
    fields = cap_fields(src.config)
    runs, verdicts = [], {f.field: {} for f in fields}
    with progress.task("audit-model: one forward and backward per attention implementation", len(implementations)) as advance:
        for implementation in implementations:
            run = run_implementation(src, implementation, batch, dtype, state)
            if run.model is not None:
                root = type(run.model).__name__
            for f in fields:
                verdicts[f.field][implementation] = verdict(src, run, f, batch, dtype, state, root)
            run.model = None
            runs.append(run)
            advance(1)
    return Audit(
        model=root or "?", model_type=src.config.model_type, dtype=dtype_name, device=batch.device, autocast=batch.autocast,
        shape=tuple(batch.ids.shape), scale_logits=batch.scale_logits, random_weights=not src.weights,
        fields=fields, runs=runs, verdicts=verdicts,
    )


def field_status(verdicts: dict[str, str], cap: float | None) -> str:
    if cap is None:
        return "not set"
    if any(v in ("applied", "hidden") for v in verdicts.values()):
        return "live"
    return "dead" if any(v == "ignored" for v in verdicts.values()) else "not run"


# --- the report -------------------------------------------------------------------------------


HIDDEN_PATH = {"flex_attention": "flex-attention", "flash_attention_2": "tanh-approx"}  # flash-attn caps with tanh.approx.f32


def site_rows(result: Audit) -> list[dict]:
    """One row per soft-cap site per implementation: the monitor's, then the applied-but-hidden fields."""
    from softcapgrad.stacks.watch import first_zero

    rows = []
    eager = next((r for r in result.runs if r.implementation == "eager" and r.status in ("ran", "forward only")), None)
    for run in result.runs:
        for s in run.sites:
            if s.fn != "tanh":
                continue
            rows.append({
                "implementation": run.implementation, "module": s.module, "caps": kind_of_site(s.module, result.model),
                "cap": s.cap, "dtype": s.dtype, "path": s.path, "first_zero_grad_input": s.first_zero_grad_input,
                "fraction": s.saturated_fraction, "count": s.count, "saturated": s.saturated, "zero_grad": s.zero_grad,
                "max_abs": s.max_abs, "source": s.source,
                "basis": "measured: stored ±1",
            })
        for f in result.fields:
            if result.verdicts[f.field].get(run.implementation) != "hidden":
                continue
            path = f"{HIDDEN_PATH.get(run.implementation, 'torch-compile')}-{result.device}"
            stack = first_zero(path, "float32", f.cap)
            values = [v for (module, cap), v in (eager.inputs.items() if eager else [])
                      if cap is not None and math.isclose(cap, f.cap, rel_tol=1e-6)
                      and kind_of_site(module, result.model) == f.caps]
            fraction = None
            if values and stack.value is not None:
                import torch

                a = torch.cat(values).abs() * f.cap
                fraction = float((a >= stack.value).double().mean())
            rows.append({
                "implementation": run.implementation, "module": f"(inside {run.implementation})", "caps": f.caps,
                "cap": f.cap, "dtype": "float32", "path": path, "first_zero_grad_input": stack.value,
                "fraction": fraction, "count": None, "saturated": None, "zero_grad": None,
                "max_abs": None, "source": stack.source or stack.reason,
                "basis": "eager pre-cap values of this batch" if fraction is not None else stack.reason,
            })
    return rows


def config_rows(result: Audit) -> list[dict]:
    implementations = [r.implementation for r in result.runs]
    rows = []
    for f in result.fields:
        v = result.verdicts[f.field]
        applied = [i for i in implementations if v[i] == "applied"] + [f"{i} (hidden)" for i in implementations if v[i] == "hidden"]
        row = {"field": f.field, "caps": f.caps, "cap": f.cap, "status": field_status(v, f.cap),
               "applied_by": ", ".join(applied), "ignored_by": ", ".join(i for i in implementations if v[i] == "ignored")}
        row.update({i: v[i] for i in implementations})
        rows.append(row)
    return rows


def answer(result: Audit, rows: list[dict], fields: list[dict]) -> tuple[str, ...]:
    ran = [r.implementation for r in result.runs if r.status in ("ran", "forward only")]
    head = (f"{result.model} ({result.model_type}, {result.dtype}"
            + (f" under {result.autocast} autocast" if result.autocast else "")
            + f", batch {result.shape[0]}×{result.shape[1]}"
            + (f", logits ×{result.scale_logits:g}" if result.scale_logits != 1.0 else "") + "): ")
    live = [f"{r['field']} = {r['cap']:g}" for r in fields if r["status"] == "live"]
    dead = [f"{r['field']} = {r['cap']:g}" for r in fields if r["status"] == "dead"]
    if not fields:
        head += "its config has no soft-cap field"
    else:
        head += f"applied: {', '.join(live)}" if live else "no config soft-cap is applied"
        if dead:
            head += f"; dead config (set, applied by no implementation): {', '.join(dead)}"
    refused = [r.implementation for r in result.runs if r.status.startswith("refused")]
    head += (f"; ran under {', '.join(ran) or 'no implementation'}"
             + (f"; refused by {', '.join(refused)}" if refused else "") + ".")
    out = [head]
    measured = [r for r in rows if r["fraction"] is not None and r["first_zero_grad_input"] is not None]
    if measured:
        worst = max(measured, key=lambda r: (r["fraction"], r["caps"]))
        out.append(f"Largest share of this batch past its path's first zero-gradient input: {worst['fraction']:.2%} "
                   f"of the {worst['caps']} at {worst['module']} under {worst['implementation']} "
                   f"({worst['dtype']}, c = {worst['cap']:g}, gradient exactly 0 from {worst['first_zero_grad_input']:g}).")
    elif not rows:
        out.append("No tanh ran in any implementation.")
    return tuple(out)


def audit_report(result: Audit, params: dict):
    from softcapgrad.core.report import Report, Table

    rows = site_rows(result)
    fields = config_rows(result)
    implementations = [r.implementation for r in result.runs]
    columns = ("module", "caps", "cap", "dtype", "first_zero_grad_input", "fraction")
    wide = ("max_abs", "path", "count", "saturated", "zero_grad", "source", "basis")
    per_run = tuple(
        Table(f"sites:{run.implementation}", f"soft-cap sites under {run.implementation} ({run.status}; path "
              f"{', '.join(sorted({r['path'] for r in rows if r['implementation'] == run.implementation})) or '—'})",
              [r for r in rows if r["implementation"] == run.implementation], columns, wide=wide, json=False)
        for run in result.runs if run.status in ("ran", "forward only")
    )
    return Report(
        command="audit-model",
        params={**params, "model_class": result.model},
        tables=(
            Table("rows", "soft-cap sites, every implementation", rows, ("implementation", *columns), show=False, wide=wide),
            *per_run,
            Table("config", "config soft-cap fields: which implementation applies each", fields,
                  ("field", "cap", "status", "applied_by", "ignored_by"), wide=("caps", *implementations)),
            Table("implementations", "attention implementations",
                  [{"implementation": r.implementation, "status": r.status, "reason": r.reason, "hidden": r.hidden or "",
                    "warnings": "; ".join(r.warnings)} for r in result.runs],
                  ("implementation", "status"), wide=("reason", "hidden", "warnings")),
        ),
        notes=(
            *(f"{r.implementation} {r.status}: {r.reason}" for r in result.runs if r.reason),
            *(f"{r.implementation}: {r.hidden}" for r in result.runs if r.hidden),
            "run with " + ", ".join(f"{k} {v}" for k, v in _versions().items()),
            "applied: the monitor saw the tanh of the scores divided by the cap (or, for a field of a sub-model, the "
            f"logits changed when the field was set to {PROBE_CAP:g}); hidden: not seen, but that probe changed the "
            "logits, so it is applied inside a kernel the monitor cannot see; ignored: the logits stayed bit-identical",
            "fraction: share of the site's values whose tanh output was stored as exactly ±1 (eager gradient exactly 0); "
            "for hidden sites, share of the eager run's pre-cap values at or past that path's first zero-gradient input",
            "first_zero_grad_input: the site's path and format in the real-stack table; — where that stack is not measured",
        ),
        answer=answer(result, rows, fields),
        figures={"versions": _versions()},
    )


def audit_model(src: Source, implementations: list[str], ids, dtype: str, autocast: str | None, seed: int,
                scale_logits: float, device: str, given: dict):
    """Audit and report: ``given`` names the model as the user gave it (directory or type, --set, --inputs)."""
    result = audit(src, implementations, Batch(ids, scale_logits, autocast, seed, device), dtype)
    params = {**given, "attn": implementations, "dtype": dtype, "autocast": autocast, "shape": list(ids.shape),
              "seed": seed, "scale_logits": scale_logits, "device": device, "random_weights": result.random_weights}
    return audit_report(result, params)


EXAMPLE = ["final_logit_softcapping=30", "attn_logit_softcapping=50"]


def example_report():
    """The README's example: ``audit-model --model-type gemma2 --set … --attn eager --attn sdpa --scale-logits 300``."""
    src = source(None, "gemma2", EXAMPLE)
    return audit_model(src, ["eager", "sdpa"], random_ids(src.config, 2, 16, 0), "bfloat16", None, 0, 300.0, "cpu",
                       {"model": "gemma2", "set": EXAMPLE, "inputs": None})


def _versions() -> dict[str, str]:
    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__}
