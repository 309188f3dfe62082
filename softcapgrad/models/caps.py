"""Which configuration fields are soft-caps, found by what the model does, not by what the field is called.

A soft-cap is ``c·tanh(a/c)``: a tanh whose input was divided by c (or multiplied by 1/c). One eager
forward of the model under :class:`~softcapgrad.models.trace.OpTrace` lists every tanh with its
divisor. A configuration field (at any depth: text, vision, audio, encoder, decoder) is a cap when
changing it changes a tanh's divisor in proportion (set to 1.25·v, the divisor goes from d to
1.25·d in the same module): that field *applied*. A field at 0 or None is a cap that is *off* when
setting it (to :data:`ON`) makes a tanh appear. The fields tried are those whose value equals a
divisor seen, the unset numbers the model's source reads, and any field named like a cap; a field
named like a cap that changes no tanh at any value is *dead config* when set, *unused* when not.
A tanh dividing by a number no field explains and multiplied back by it is *hard-coded*; one whose output
is multiplied by another number (GELU's tanh form) is not a cap.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import math
import re
from pathlib import Path
from dataclasses import dataclass

ON = 7.25  # the value an unset field is probed at: distinct from every tiny size and default cap
SCALE = 1.25  # a set field is probed at SCALE times its value
PROBE_CAP = 1e-3  # an implementation's probe: saturates every input above ~1e-3, so a cap that runs changes the output
HINTS = ("cap",)  # a field whose name holds this is tried even when no divisor equals it


@dataclass(frozen=True)
class Cap:
    field: str | None  # "final_logit_softcapping", "audio_config.attention_logit_cap"; None: hard-coded
    value: float | None  # the field's value in this configuration
    status: str  # applied | off | dead config | unused | hard-coded
    modules: tuple  # where its tanh runs (or would run, when off); layer indices as *
    divisor: float | None  # the number the tanh divides by (the field's value unless the model scales it)
    dtype: str | None  # the format the tanh ran in (eager); None where it did not run
    evidence: str  # what the probe saw


def _is_number(value) -> bool:
    return value is None or isinstance(value, (int, float)) and not isinstance(value, bool)


def _attributes(config) -> list[str]:
    """The configuration's attribute names: its dataclass fields and whatever else it holds."""
    from transformers import PreTrainedConfig

    names = list(vars(config))
    if dataclasses.is_dataclass(config):
        names += [f.name for f in dataclasses.fields(config) if f.name not in names]
    for cls in type(config).__mro__:  # plain class attributes of the model's own config classes (a fixed cap)
        if cls is PreTrainedConfig or not issubclass(cls, PreTrainedConfig):
            break
        names += [n for n, v in vars(cls).items() if n not in names and _is_number(v) and v is not None]
    return names


def fields(config, prefix: str = "") -> dict:
    """Every number (or None) in the configuration and its sub-configurations, by dotted path."""
    from transformers import PreTrainedConfig

    out = {}
    for name in _attributes(config):
        if name.startswith("_"):
            continue
        try:
            value = getattr(config, name)
        except Exception:  # noqa: BLE001 -- a per-layer attribute read globally: not one number
            continue
        if isinstance(value, PreTrainedConfig):
            out.update(fields(value, f"{prefix}{name}."))
        elif _is_number(value):
            out[prefix + name] = value
    return out


def annotation(config, path: str) -> str:
    target = config
    *heads, last = path.split(".")
    for head in heads:
        target = getattr(target, head)
    if dataclasses.is_dataclass(type(target)):
        for f in dataclasses.fields(type(target)):
            if f.name == last:
                return str(f.type)
    return ""


def with_value(config, path: str, value):
    """A copy of ``config`` with ``path`` set (the class's validation runs on the assignment)."""
    probe = copy.deepcopy(config)
    target = probe
    *heads, last = path.split(".")
    for head in heads:
        target = getattr(target, head)
    setattr(target, last, value)
    return probe


def referenced(model) -> set[str]:
    """Config attribute names the model's source files read (``config.x``, ``getattr(config, "x"…)``)."""
    files = set()
    for module in model.modules():
        try:
            files.add(inspect.getsourcefile(type(module)))
        except (TypeError, OSError):
            pass
    names = set()
    for path in sorted(f for f in files if f and "/transformers/" in f.replace("\\", "/")):
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError:
            continue
        names.update(re.findall(r"config\.(\w+)", text))
        names.update(re.findall(r"getattr\(\s*(?:self\.)?config\s*,\s*[\"'](\w+)", text))
    return names


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-5)


def _sites(tanhs) -> dict:
    """(module, divisor or None) -> (count, dtype) over a trace's tanhs, layer indices folded."""
    from softcapgrad.models.trace import layerless

    out: dict = {}
    for t in tanhs:
        if t.divisor is not None and t.then is not None and not _close(t.then, t.divisor):
            continue  # a scaled tanh not scaled back (GELU's tanh form): not c·tanh(a/c)
        key = (layerless(t.module), None if t.divisor is None else round(t.divisor, 6))
        n, _ = out.get(key, (0, t.dtype))
        out[key] = (n + 1, t.dtype)
    return out


def _new(base: dict, probe: dict) -> dict:
    return {k: v for k, v in probe.items() if k[1] is not None and (k not in base or v[0] > base[k][0])}


def discover(config, tanhs_of, model=None) -> list[Cap]:
    """The caps of ``config``: ``tanhs_of(config)`` is one eager forward's tanhs (it raises for a bad config).

    ``model`` (built from ``config``, or a callable giving it once ``tanhs_of`` ran) tells which
    unset fields its source reads.
    """
    base = _sites(tanhs_of(config))
    if model is not None and not hasattr(model, "modules"):
        model = model()
    divisors = {d for (_, d) in base if d is not None}
    values = fields(config)
    read = referenced(model) if model is not None else set()
    candidates = []
    for path, value in values.items():
        name = path.rsplit(".", 1)[-1]
        hinted = any(h in name.lower() for h in HINTS)
        matches = value not in (None, 0) and any(_close(float(value), d) for d in divisors)
        unset = value in (None, 0) and name in read and ("float" in annotation(config, path) or value is None)
        if matches or unset or hinted:
            candidates.append((path, value, hinted))
    caps, explained = [], set()
    for path, value, hinted in candidates:
        on = value not in (None, 0)
        trial = float(value) * SCALE if on else ON
        try:
            new = _new(base, _sites(tanhs_of(with_value(config, path, trial))))
        except Exception as err:  # the class or the model refuses the trial value
            if hinted:
                caps.append(Cap(path, _num(value), "unused" if not on else "dead config", (), None, None,
                                f"setting it to {trial:g} failed: {' '.join(str(err).split())[:120]}"))
            continue
        if on:  # the divisor moved in proportion: d -> d·SCALE in the same module
            moved = {k: v for k, v in new.items()
                     if any(k[0] == m and d is not None and _close(k[1], d * SCALE) for (m, d) in base)}
            if moved:
                modules = tuple(sorted({m for m, _ in moved}))
                divisor = next(k[1] for k in moved) / SCALE
                dtype = next(v[1] for v in moved.values())
                explained |= {(m, round(divisor, 6)) for m in modules}
                caps.append(Cap(path, float(value), "applied", modules, divisor, dtype,
                                f"set to {trial:g}: its tanh's divisor went from {divisor:g} to {divisor * SCALE:g}"))
                continue
        elif new:
            modules = tuple(sorted({m for m, _ in new}))
            divisor = next(iter(new))[1]
            caps.append(Cap(path, _num(value), "off", modules, None, None,
                            f"at {value!r} the code skips the cap; set to {ON:g}, a tanh dividing by {divisor:g} runs"))
            continue
        if hinted:
            caps.append(Cap(path, _num(value), "dead config" if on else "unused", (), None, None,
                            f"set to {trial:g}: no tanh changed"))
    for (module, divisor), (count, dtype) in sorted(base.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        if divisor is not None and (module, divisor) not in explained:
            caps.append(Cap(None, None, "hard-coded", (module,), divisor, dtype,
                            f"a tanh dividing by {divisor:g} that no configuration field moves"))
    return caps


def _num(value) -> float | None:
    return None if value is None else float(value)
