"""Repairs of a tiny configuration that its class or its first forward refuses, each named for the census.

Shrinking every size alike can break a relation the model's code assumes: key/value heads that
must divide (or equal) the query heads, rotary sections that must add up to half a head, a sliding
window the attention needs, an attribute the code reads but the class never sets. Each repair reads
the refusal's own message, changes the dictionary, and says what it changed; the class's validation
and one forward then decide again. Nothing here guesses a value the message does not point at.
"""

from __future__ import annotations

import re

MROPE = (16, 24, 24)  # the temporal, height and width rotary sections most multimodal rotary codes default to
WINDOW = 64  # a sliding window for a tiny model: longer than the census's tokens, shorter than its positions


def _per_layer(value) -> bool:
    return isinstance(value, dict) and bool(value) and all(str(k).isdigit() for k in value)


def _paths(d: dict, prefix: str = ""):
    for key, value in d.items():
        if isinstance(value, dict) and not _per_layer(value) and all(isinstance(k, str) for k in value):
            yield from _paths(value, f"{prefix}{key}.")
        yield prefix + key, value


def _levels(d: dict, prefix: str = ""):
    """(prefix, dict) for the configuration and each sub-configuration dictionary."""
    yield prefix, d
    for key, value in d.items():
        if isinstance(value, dict):  # sub-configurations and per-layer overrides alike
            yield from _levels(value, f"{prefix}{key}.")


def _get(d: dict, dotted: str):
    for part in dotted.split("."):
        d = d[part]
    return d


def _set(d: dict, dotted: str, value) -> None:
    *heads, last = dotted.split(".")
    for head in heads:
        d = d.setdefault(head, {})
    d[last] = value


def restore(d: dict, defaults: dict, message: str, kept: set = frozenset()) -> list[str]:
    """Set back to their defaults the shrunk fields the message names (not those another repair set: ``kept``)."""
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", message))
    restored = []
    for path, value in list(_paths(d)):
        name = path.rsplit(".", 1)[-1]
        if name not in words or isinstance(value, dict) or path in kept:
            continue
        try:
            original = _get(defaults, path)
        except (KeyError, TypeError):
            continue
        if original != value:
            _set(d, path, original)
            restored.append(f"{path} = {original!r} (its default)")
    return restored


def equal_heads(d: dict) -> list[str]:
    """Key/value heads as many as query heads, at every level and for every kind of head (sliding, global)."""
    changed = []
    for prefix, level in _levels(d):
        for key, value in list(level.items()):
            if "key_value_heads" not in str(key) or not isinstance(value, int) or isinstance(value, bool):
                continue
            twin = str(key).replace("key_value", "attention")
            heads = next((h for h in (level.get(twin), level.get("num_attention_heads"), d.get(twin),
                                      d.get("num_attention_heads"))
                          if isinstance(h, int) and not isinstance(h, bool)), None)
            if isinstance(heads, int) and not isinstance(heads, bool) and heads != value:
                level[key] = heads
                changed.append(f"{prefix}{key} = {heads} (as many as the query heads)")
    return changed


def sliding_window(d: dict, message: str) -> list[str]:
    """A window where the attention asks for one and the configuration has none."""
    if "sliding_window" not in message:
        return []
    changed = [f"{p}sliding_window = {WINDOW}" for p, level in _levels(d) if "sliding_window" in level
               and level["sliding_window"] is None]
    for p, level in _levels(d):
        if "sliding_window" in level and level["sliding_window"] is None:
            level["sliding_window"] = WINDOW
    if not changed and d.get("sliding_window") is None:
        d["sliding_window"] = WINDOW
        changed.append(f"sliding_window = {WINDOW}")
    return changed


def rope_sections(d: dict, message: str) -> list[str]:
    """Rotary sections (``mrope_section``) scaled to add up to the size the split asks for."""
    found = re.search(r"split_sizes to sum exactly to (\d+)", message)
    if found:
        target = int(found.group(1))
    elif re.search(r"mrope_section.*summing to .?qk_rope_head_dim // 2", message):
        rope = next((v for p, v in _paths(d) if p.rsplit(".", 1)[-1] == "qk_rope_head_dim" and isinstance(v, int)), 0)
        target = rope // 2
    else:
        return []
    if target < 3:
        return []
    changed = []
    if not any(p.rsplit(".", 1)[-1] == "mrope_section" for p, _ in _paths(d)):  # the code's own default is used
        for prefix, level in _levels(d):
            if isinstance(level.get("rope_parameters"), dict):
                level["rope_parameters"]["mrope_section"] = list(MROPE)
    for path, value in list(_paths(d)):
        if path.rsplit(".", 1)[-1] != "mrope_section" or not isinstance(value, list) or not value or sum(value) == target:
            continue
        total = sum(value)
        new = [max(1, v * target // total) for v in value]
        new[0] += target - sum(new)
        if new[0] < 1:
            continue
        _set(d, path, new)
        changed.append(f"{path} = {new} (adds up to {target})")
    return changed


def sums(d: dict, message: str) -> list[str]:
    """``X must equal A + B`` (a head as wide as its two parts): X set to the sum, at every level that has A and B;
    a split into negative parts (a rotary part wider than its head): the rotary part halved to fit."""
    changed = []
    found = re.search(r"(\w+) must equal (\w+) \+ (\w+)", message)
    for prefix, level in _levels(d):
        if found:
            x, a, b = found.groups()
            va, vb = level.get(a, d.get(a)), level.get(b, d.get(b))
            if isinstance(va, int) and isinstance(vb, int) and level.get(x, d.get(x)) != va + vb and (x in level or not prefix):
                level[x] = va + vb
                changed.append(f"{prefix}{x} = {va + vb} ({a} + {b})")
        elif "non-negative" in message:
            head, rope = level.get("head_dim"), level.get("qk_rope_head_dim")
            if isinstance(head, int) and isinstance(rope, int) and rope >= head:
                level["qk_rope_head_dim"] = head // 2
                changed.append(f"{prefix}qk_rope_head_dim = {head // 2} (half of head_dim)")
    return changed


def stages(d: dict, message: str) -> list[str]:
    """A backbone's chosen stages (``out_features``, ``out_indices``) that its cut depth no longer has: dropped, so
    the backbone picks its own from the stages it has."""
    if "must be a subset of stage_names" not in message and "out_indices" not in message:
        return []
    changed = []
    for prefix, level in _levels(d):
        for key in ("out_features", "out_indices"):
            if level.get(key) is not None:
                level[key] = None
                changed.append(f"{prefix}{key} = None (the stages of the cut backbone)")
    return changed


def missing_attribute(d: dict, message: str, class_of) -> list[str]:
    """An attribute the model reads and the configuration class never sets: a token id 0, a rate 0.0.

    ``class_of(level)`` names a sub-dictionary's configuration class, so the attribute lands where the
    message says it is missing."""
    found = re.search(r"'(\w+Config)' object has no attribute '(\w+)'", message)
    if not found:
        return []
    cls, name = found.groups()
    beside = next((v for p, v in _paths(d) if p.rsplit(".", 1)[-1] == name and not isinstance(v, dict)), None)
    if beside is not None:  # a sub-configuration holds it (the text model's vocabulary): the same value
        value = beside
    elif name.endswith(("_token_id", "_id")):
        value = 0
    elif any(w in name for w in ("dropout", "rate", "prob")):
        value = 0.0
    else:
        return []
    changed = []
    for prefix, level in _levels(d):
        if class_of(level, prefix) == cls and name not in level:
            level[name] = value
            changed.append(f"{prefix}{name} = {value!r} (read by the model, not set by {cls})")
    return changed


def repair(d: dict, defaults: dict, message: str, class_of, tried: set) -> list[str]:
    """The first repair the message points at and not yet tried; what it changed (empty: nothing left to try)."""
    steps = (
        ("window", lambda: sliding_window(d, message)),
        ("rope", lambda: rope_sections(d, message)),
        ("attribute", lambda: missing_attribute(d, message, class_of)),
        ("sums", lambda: sums(d, message)),
        ("stages", lambda: stages(d, message)),
        ("heads", lambda: equal_heads(d) if ("head" in message or "size of tensor" in message) else []),
        ("restore", lambda: restore(d, defaults, message, {m.split(" = ")[0] for m in tried if " = " in m})),
        ("heads-anyway", lambda: equal_heads(d)),
    )
    for name, step in steps:
        if name.startswith("heads") and "heads" in tried:
            continue
        changed = step()
        if changed:
            tried.add("heads" if name.startswith("heads") else name)
            if name != "restore":
                tried.update(changed)  # what a repair set, never restored to its default afterwards
            return changed
    return []
