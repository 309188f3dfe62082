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
or unset that the code skips is ``off`` under every implementation; a set field that moved no tanh
is dead config unless the class has no head or no attention to run it (models/dead_config.py).
Implementations that raise at build or at run are ``refused`` with their message. The report is
models/audit_report.py.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass, field
from typing import Any

from softcapgrad.core import progress
from softcapgrad.core.checks import InputError
from softcapgrad.models.inputs import (  # noqa: F401 -- the old addresses of the input helpers
    check_ids, DISCOVERY, random_ids, read_token_ids, text_tokens, TOKEN_KINDS, vocabulary,
)
from softcapgrad.models.source import (  # noqa: F401 -- the old addresses of the configuration's reading
    directory_config, missing_package, model_type_config, parse_sets, quiet, smoke, source, Source, WEIGHT_FILES,
)

IMPLEMENTATIONS = ("eager", "sdpa", "flex_attention", "flash_attention_2")
FORMATS = {"bfloat16", "float16", "float32"}


def model_class(config):
    """The class audited: the language-model head where there is one, else the module that holds the caps."""
    from softcapgrad.models.runnable import model_class as chosen

    return chosen(config)


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
    gate_health: list = field(default_factory=list)  # GateMonitor GateRow


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
    floating = {k for k, v in kwargs.items() if isinstance(v, torch.Tensor) and v.is_floating_point()}  # not a flag
    kwargs = {k: v.to(model.dtype) if k in floating else v for k, v in kwargs.items()}
    torch.manual_seed(batch.seed)
    try:
        with torch.set_grad_enabled(grad), torch.autocast(batch.device, dtype=getattr(torch, batch.autocast or "float32"),
                                                          enabled=batch.autocast is not None):
            out = runnable.call(model, kwargs)
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
    from softcapgrad.stacks.watch import DeadZoneMonitor, GateMonitor

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
        with DeadZoneMonitor(keep_inputs=True) as monitor, GateMonitor() as gates:
            forward(model, batch, grad=True)
    except NotImplementedError as err:  # e.g. no backward on this device: the forward alone, then
        status, reason = "forward only", _first_line(err)
        model.zero_grad(set_to_none=True)
        try:
            with DeadZoneMonitor(keep_inputs=True) as monitor, GateMonitor() as gates:
                forward(model, batch, grad=False)
        except Exception as err2:
            return Run(implementation, "refused at run", _first_line(err2))
    except Exception as err:
        return Run(implementation, "refused at run", _first_line(err))
    inputs = {(s.module, s.cap): monitor.inputs(s) for s in monitor.sites() if s.fn == "tanh"}
    return Run(implementation, status, reason, monitor.rows(), inputs, monitor.hidden(), model, gate_health=gates.rows())


# --- caps and gates, found by running -----------------------------------------------------------


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


MIXED_FORMATS = "in bfloat16 the model meets float32 tensors it makes itself, which bfloat16 weights refuse"


def mixed_formats(src: Source, batch: Batch, dtype_name: str = "bfloat16"):
    """Why a model refused ``dtype_name``, when the reason is a float32 tensor of its own (a vocoder's fixed filters,
    a length regulator) meeting that format in an op: the op and module (models/mixed.py), decided by the tensors
    the op was given, never by the error's wording (which changes with the CPU's kernels). None otherwise. Such a
    model runs in float32 only, which is how transformers itself runs it."""
    import torch

    from softcapgrad.models.mixed import refused_mix

    try:
        with quiet(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.manual_seed(batch.seed)
            model = build(src, src.config, "eager", getattr(torch, dtype_name), device=batch.device)
    except Exception:  # noqa: BLE001 -- a model that cannot even be built mixes nothing
        return None
    model.eval()
    return refused_mix(model, lambda m: forward(m, batch, grad=False))


def audit(src: Source, implementations: list[str], batch: Batch, dtype_name: str) -> Audit:
    """Find the caps and gates, then run every implementation (an allocation past the memory available fails
    as an error, not as the process killed)."""
    from softcapgrad.models.tiny import address_space, available_bytes

    with quiet(), address_space(available_bytes() * 9 // 10):
        return _audit(src, implementations, batch, dtype_name)


def _audit(src: Source, implementations: list[str], batch: Batch, dtype_name: str) -> Audit:
    import torch

    from softcapgrad.models import dead_config, runnable, tiny

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
    found = Discovery(dead_config.qualified(found.caps, cls, src.config), found.gates)
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
    params = {**given, "tiny_changes": list(src.changes), "attn": implementations, "dtype": dtype, "autocast": autocast, "shape": list(ids.shape),
              "seed": seed, "scale_logits": scale_logits, "device": device, "random_weights": result.random_weights}
    from softcapgrad.models.audit_report import audit_report

    report = audit_report(result, params)
    if src.directory is not None and not src.weights:  # said next to the model it qualifies, not only in --json
        report = dataclasses.replace(report, answer=(
            report.answer[0], f"It ran on random weights (seed {seed}): {src.directory} holds no weights, so every share "
            "below is an untrained model's.", *report.answer[1:]))
    said = (*src.notes, *(f"The tiny configuration was {c}." for c in src.changes if c.startswith("built as")))
    return dataclasses.replace(report, answer=(*report.answer, *said)) if said else report


EXAMPLE = ["final_logit_softcapping=30", "attn_logit_softcapping=50"]


def example_report():
    """The README's example: ``audit-model --model-type gemma2 --set … --attn eager --attn sdpa --scale-logits 300``."""
    src = source(None, "gemma2", EXAMPLE)
    return audit_model(src, ["eager", "sdpa"], random_ids(src.config, 2, 16, 0), "bfloat16", None, 0, 300.0, "cpu",
                       {"model": "gemma2", "set": EXAMPLE, "inputs": None})
