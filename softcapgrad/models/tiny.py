"""Tiny configurations of any transformers model type, and the size a configuration would take.

A model type's tiny configuration is its config class's defaults with every size shrunk (width,
heads, experts, vocabulary) in the configuration and each of its sub-configurations, its layers
cut to one of each distinct layer (the per-layer lists and per-layer dicts cut alike, so a
sliding/full pattern keeps both kinds), then the type's own overrides where the class's validation
needs them. The config class validates the result; nothing is downloaded.

The size of a configuration is estimated before anything is built, from its widths, depths,
vocabularies and experts: parameters × the format's bytes against the memory available.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from softcapgrad.core.checks import InputError
from softcapgrad.models.families import OVERRIDES as FAMILY_OVERRIDES
from softcapgrad.models.sizes import (  # noqa: F401 -- the old addresses of the size checks
    address_space, available_bytes, LAYER_COUNTS, parameters_estimate, refuse_if_too_big, refuse_if_too_big_dict, size,
    Size,
)

HIDDEN, INTER, HEADS, KV, HEAD_DIM, EXPERTS = 64, 128, 2, 1, 32, 6  # experts apart from heads and batch
SIZES = {  # field -> its tiny value (a field is only ever shrunk, never grown)
    **dict.fromkeys(("vocab_size", "vocab_size_per_layer_input", "text_vocab_size"), 256),
    **dict.fromkeys(("hidden_size", "text_hidden_size", "out_hidden_size", "d_model", "hidden_dim", "n_embd",
                     "embed_dim", "projection_dim", "output_proj_dims"), HIDDEN),
    **dict.fromkeys(("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size", "ffn_dim",
                     "moe_hidden_size", "projector_hidden_size", "projection_hidden_dim", "d_ff", "mlp_dim",
                     "expert_intermediate_size", "dense_intermediate_size", "decoder_ffn_dim", "encoder_ffn_dim"), INTER),
    **dict.fromkeys(("num_attention_heads", "swa_num_attention_heads", "conf_num_attention_heads", "index_n_heads",
                     "num_heads", "n_head", "encoder_attention_heads", "decoder_attention_heads",
                     "num_attention_heads_per_layer"), HEADS),
    **dict.fromkeys(("num_key_value_heads", "swa_num_key_value_heads", "num_global_key_value_heads"), KV),
    **dict.fromkeys(("head_dim", "swa_head_dim", "global_head_dim", "index_head_dim", "qk_nope_head_dim",
                     "qk_rope_head_dim", "v_head_dim", "attention_head_dim"), HEAD_DIM),
    **dict.fromkeys(("kv_lora_rank", "q_lora_rank", "laurel_rank"), 32),
    **dict.fromkeys(("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts"), EXPERTS),
    **dict.fromkeys(("num_experts_per_tok", "moe_topk", "top_k"), 2),
    **dict.fromkeys(("hidden_size_per_layer_input",), 16),
    **dict.fromkeys(("max_position_embeddings",), 128),
    **dict.fromkeys(("index_topk",), 8),
    **dict.fromkeys(("n_group", "topk_group", "num_group"), 1),
    **dict.fromkeys(("unpadded_vocab_size",), 250),
}
NOT_SIZES = ("_id", "_index", "token", "eps", "layers", "window", "seed", "scalar")  # never shrunk as an alias of a size
MIN_LAYERS = 2
TINY_LIMIT = 20_000_000  # parameters: a repaired tiny configuration past this is refused, not built
OVERRIDES = FAMILY_OVERRIDES  # model type -> fields set after shrinking (dotted for sub-configs): models/families/


def _pick_layers(d: dict, count: int) -> list[int]:
    """Indices of one layer of each distinct kind (over every per-layer list and dict), at least MIN_LAYERS."""
    lists = {k: v for k, v in d.items() if isinstance(v, list) and len(v) == count}
    dicts = {k: v for k, v in d.items() if _per_layer(v, count)}
    shared = d.get("num_kv_shared_layers") if isinstance(d.get("num_kv_shared_layers"), int) else 0
    seen, keep = set(), []
    for i in range(count):
        kind = json.dumps([_kind(lists[k], i, count) for k in sorted(lists)]
                          + [str(i) in map(str, dicts[k]) for k in sorted(dicts)]
                          + [i >= count - shared if shared else False],
                          default=str, sort_keys=True)
        if kind not in seen:
            seen.add(kind)
            keep.append(i)
    for i in range(count):
        if len(keep) >= MIN_LAYERS:
            break
        if i not in keep:
            keep.append(i)
    return sorted(keep)


def _layer_refs(value, count: int) -> bool:
    """A per-layer list of layer indices, each layer naming an earlier (or its own) layer that names itself: the
    layer whose cache it reads; or every layer's index, a set of layers that holds them all (MoE layers). A flag
    list of 0s and 1s names layer 1 at layer 0, a later one, so it is not one."""
    return (isinstance(value, list) and len(value) == count and count > 1
            and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= i for i, v in enumerate(value))
            and all(value[v] == v for v in value) and any(v == i for i, v in enumerate(value) if i))


def _kind(value: list, i: int, count: int):
    """What layer ``i``'s entry says of its kind: the value, but for a list of layer indices whether the layer owns
    what it names, and whether later layers name it (every index differs, the kinds do not)."""
    if not _layer_refs(value, count):
        return value[i]
    return ["own" if value[i] == i else "reuses", i in value[i + 1:]]


def _per_layer(value, count: int) -> bool:
    """A dict of per-layer overrides: layer index -> a dict of fields."""
    return isinstance(value, dict) and bool(value) and all(
        _index(i, count) is not None and isinstance(v, dict) for i, v in value.items())


def _index(key, count: int) -> int | None:
    try:
        i = int(key)
    except (TypeError, ValueError):
        return None
    return i if 0 <= i < count else None


def _aliases(d: dict, out: dict) -> dict:
    """Original size -> tiny size, over the whole tree: a field holding the same number is the same size."""
    for key, value in d.items():
        if isinstance(value, dict):
            _aliases(value, out)
        elif key in SIZES and isinstance(value, int) and not isinstance(value, bool) and value > SIZES[key] > 8:
            out.setdefault(value, SIZES[key])
    return out


def _is_size(key: str, value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and not any(w in key for w in NOT_SIZES)


SPECIAL = 16  # the top ids of the tiny vocabulary hold the special tokens (image, audio, pad…); text ids stay below


def _is_token(key: str) -> bool:
    return key.endswith(("_token_id", "_token_index", "_token_ids", "token_id", "_id")) and "vocab" not in key


def _special(value, ids: dict):
    """A special token id past the tiny vocabulary, moved into its top ``SPECIAL`` ids (the same id, the same place)."""
    vocab = SIZES["vocab_size"]
    if isinstance(value, list):
        return [_special(v, ids) for v in value]
    if isinstance(value, int) and not isinstance(value, bool) and value >= vocab:
        if value not in ids:
            ids[value] = vocab - 1 - len(ids) % SPECIAL
        return ids[value]
    return value


def shrink(d: dict, aliases: dict | None = None, ids: dict | None = None) -> dict:
    """A config dict (``to_dict()``) with sizes shrunk and layers cut, sub-configurations alike."""
    aliases = _aliases(d, {}) if aliases is None else aliases
    ids = {} if ids is None else ids
    out = dict(d)
    for key, value in d.items():
        if isinstance(value, dict) and value and all(isinstance(k, str) and not k.isdigit() for k in value):
            out[key] = shrink(value, aliases, ids)
        elif isinstance(value, dict) and value:  # per-layer overrides keyed by layer index
            out[key] = {k: shrink(v, aliases, ids) if isinstance(v, dict) else v for k, v in value.items()}
        elif _is_token(key):
            out[key] = _special(value, ids)
        elif key in SIZES and isinstance(value, int) and not isinstance(value, bool) and value > SIZES[key]:
            out[key] = SIZES[key]
        elif key in SIZES and isinstance(value, list) and all(_is_size(key, v) for v in value):
            out[key] = [min(v, SIZES[key]) for v in value]
        elif _is_size(key, value) and value in aliases:
            out[key] = aliases[value]
    patch = d.get("patch_size")
    if isinstance(patch, int) and isinstance(d.get("image_size"), int) and d["image_size"] > 2 * patch:
        out["image_size"] = 2 * patch  # a 2 × 2 grid of patches
    if isinstance(d.get("num_frames"), int) and d["num_frames"] > 2:
        out["num_frames"] = 2
    for name in LAYER_COUNTS:
        count = d.get(name)
        if not isinstance(count, int) or isinstance(count, bool) or count <= MIN_LAYERS:
            continue
        keep = _pick_layers(d, count)
        pattern = max((len(v) for v in d.values() if isinstance(v, list) and 1 < len(v) < count
                       and all(isinstance(x, str) for x in v)), default=0)  # a repeating block pattern
        keep += [i for i in range(count) if i not in keep][: max(0, pattern - len(keep))]
        refs = [v for v in d.values() if _layer_refs(v, count)]
        keep = sorted(set(keep) | {v[i] for v in refs for i in keep})  # a kept layer's source layer kept too
        out[name] = len(keep)
        for key, value in d.items():
            if _layer_refs(value, count):  # layer indices renumbered to the kept layers'
                out[key] = [keep.index(out[key][i]) for i in keep]
            elif isinstance(value, list) and len(value) == count:
                out[key] = [out[key][i] for i in keep]
            elif _per_layer(value, count):
                out[key] = {keep.index(_index(i, count)): out[key][i] for i in value if _index(i, count) in keep}
        shared = d.get("num_kv_shared_layers")
        if isinstance(shared, int) and 0 < shared < count:  # the last layers reuse earlier ones' caches
            out["num_kv_shared_layers"] = sum(1 for i in keep if i >= count - shared)
    return out


def _set(d: dict, dotted: str, value) -> None:
    *heads, last = dotted.split(".")
    for head in heads:
        d = d.setdefault(head, {})
    d[last] = value


def without_layer_lists(d: dict, field: str) -> dict:
    """``d`` without the per-layer lists and dicts sized by ``d[field]``: the class derives them for a new count."""
    count = d.get(field)
    if not isinstance(count, int):
        return d
    return {k: v for k, v in d.items() if not (isinstance(v, list) and len(v) == count and k not in SIZES
                                               or _per_layer(v, count))}


def tiny_dict(model_type: str) -> dict:
    """The tiny configuration of ``model_type`` as keyword arguments of its config class."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    try:
        defaults = cls().to_dict()
    except ImportError:
        raise
    except Exception as err:
        raise InputError(f"{model_type}: its config class does not build with its own defaults: {reason(err)}") from None
    d = shrink(defaults)
    for key, value in OVERRIDES.get(model_type, {}).items():
        _set(d, key, value)
    d.pop("transformers_version", None)
    return d


def reason(err: BaseException) -> str:
    """An exception as one line: the validation's own words, without the library's wrapper."""
    text = " ".join(str(err).split())
    if isinstance(err, KeyError) and err.args and err.args[0] in ("eager", "sdpa"):  # a bare KeyError says nothing
        return (f"its attention reads the library's attention functions under {err.args[0]!r}, which has no such "
                f"entry: the model has no {err.args[0]} path (KeyError {text})")
    for wrapper in ("Class validation error for validator", "Validation error for field"):
        if text.startswith(wrapper):
            text = text.split(": ", 1)[-1]
    return text[:300] or type(err).__name__


def tiny_config(model_type: str, smoke=None, attempts: int = 8, changes: list | None = None):
    """The tiny configuration of ``model_type``, validated by its class and (with ``smoke(config)``) by a forward.

    Where the class or the forward refuses, the repair its message points at (models/repairs.py) is
    made and it tries again; the last refusal is raised. ``changes`` receives, in words, every field
    set other than by shrinking: the type's overrides and each repair, so a report says what ran.
    """
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING, CONFIG_MAPPING_NAMES

    from softcapgrad.models import repairs

    changes = [] if changes is None else changes
    cls = CONFIG_MAPPING[model_type]
    d = tiny_dict(model_type)
    changes.extend(f"{k} = {v!r} (override)" for k, v in OVERRIDES.get(model_type, {}).items())
    defaults = cls().to_dict()
    tried: set = set()

    def class_of(level: dict, prefix: str) -> str | None:
        return cls.__name__ if not prefix else CONFIG_MAPPING_NAMES.get(level.get("model_type"))

    for attempt in range(attempts):
        try:
            config = cls(**copy.deepcopy(d))
            if smoke is not None:
                n = parameters_estimate(config)
                if n > TINY_LIMIT:  # a repair back to a default size must not build a full model
                    raise InputError(f"{model_type}: no tiny configuration found: after the class's own repairs it "
                                     f"would hold about {n:.2g} parameters")
                smoke(config)
            return config
        except (ImportError, InputError):
            raise
        except Exception as err:
            if attempt == attempts - 1:
                raise
            made = repairs.repair(d, defaults, str(err), class_of, tried)
            if not made:
                raise
            changes.extend(f"{m} (repair)" for m in made)
    raise AssertionError("unreachable")
