"""The size a model configuration would take, estimated before anything is built, and the memory it may use.

The estimate reads widths, depths, vocabularies, heads and experts from the configuration's plain
dictionary (a ``config.json``, a ``to_dict()`` with ``--set`` written in), so a depth of ten million
layers or a million heads is refused in a blink, before a configuration class derives its per-layer
lists from it. Parameters × the format's bytes, twice over (weights and gradients), must fit in the
memory available. The address-space cap turns an allocation past it into an error, not a killed process.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass

from softcapgrad.core.checks import InputError

LAYER_COUNTS = ("num_hidden_layers", "num_blocks", "num_layers", "n_layer", "conf_num_hidden_layers", "encoder_layers",
                "decoder_layers", "depth")
WIDTHS = ("hidden_size", "d_model", "hidden_dim", "n_embd", "embed_dim", "text_hidden_size")
HEADS = ("num_attention_heads", "num_heads", "n_head", "encoder_attention_heads", "decoder_attention_heads")
KV_HEADS = ("num_key_value_heads",)
INNERS = ("intermediate_size", "ffn_dim", "d_ff", "encoder_ffn_dim", "decoder_ffn_dim", "mlp_dim")
EXPERTS = ("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts")
EXPERT_INNERS = ("moe_intermediate_size", "expert_intermediate_size")
VOCABS = ("vocab_size", "text_vocab_size")
BIG = float(1 << 62)  # a size past every machine: an unbounded or non-finite value counts as this


def _number(d: dict, names: tuple) -> float:
    """The first of ``names`` in ``d`` that is a positive size (an integral float counts; inf counts as BIG)."""
    for name in names:
        value = d.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if isinstance(value, float) and math.isnan(value):
            continue
        if value > 0:
            return min(float(value), BIG)
    return 0.0


def _dicts(d: dict):
    """``d`` and every dictionary inside it (sub-configurations), without recursion."""
    stack = [d]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(v for v in node.values() if isinstance(v, dict))


def estimate_dict(d: dict) -> float:
    """Parameters a configuration's model would hold, roughly: embeddings, attention and MLP (experts) per layer.

    An upper-order estimate (within a small factor for decoder stacks) used only to refuse a size
    that cannot fit before anything is allocated; a float so that no product overflows.
    """
    total = 0.0
    for c in _dicts(d):
        width = _number(c, WIDTHS)
        layers = _number(c, LAYER_COUNTS)
        vocab = _number(c, VOCABS)
        heads = _number(c, HEADS)
        kv = _number(c, KV_HEADS)
        head_dim = _number(c, ("head_dim",)) or (width // heads if heads else 0)
        inner = _number(c, INNERS) or 4 * width
        experts = _number(c, EXPERTS)
        expert_inner = _number(c, EXPERT_INNERS) or inner
        attention = width * (max(heads * head_dim, width) * 2 + max(kv * head_dim, 0) * 2) + heads + kv
        mlp = 3 * width * (inner + experts * expert_inner)
        total += 2 * vocab * width + layers * (attention + mlp + 1)
    return total


def plain(config) -> dict:
    """A configuration object as the plain dictionary of its attributes, sub-configurations nested."""
    from transformers import PreTrainedConfig

    def walk(c):
        return {k: walk(v) if isinstance(v, PreTrainedConfig) else v for k, v in vars(c).items()}

    return walk(config)


def parameters_estimate(config) -> int:
    """:func:`estimate_dict` of a configuration object."""
    return int(min(estimate_dict(plain(config)), BIG))


def available_bytes() -> int:
    """Memory this process could still allocate: MemAvailable where the system says it, else the physical memory."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 40


@contextlib.contextmanager
def address_space(headroom: int):
    """Cap this process's address space at its current size plus ``headroom`` (Linux): a model that allocates
    past it fails with an error (a one-line answer, a census row) instead of the process being killed."""
    try:
        import resource

        with open("/proc/self/statm", encoding="ascii") as f:
            size = int(f.read().split()[0]) * resource.getpagesize()
        previous = resource.getrlimit(resource.RLIMIT_AS)
        limit = size + headroom
        if previous[0] != resource.RLIM_INFINITY:
            limit = min(limit, previous[0])  # inside a tighter cap (the census's), keep it
        resource.setrlimit(resource.RLIMIT_AS, (limit, previous[1]))
    except (ImportError, OSError, ValueError):
        yield
        return
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, previous)


@dataclass(frozen=True)
class Size:
    parameters: float
    bytes: float
    available: int

    @property
    def fits(self) -> bool:
        return self.bytes * 2 <= self.available  # weights, gradients: twice the weights at least


def size(config, itemsize: int) -> Size:
    n = parameters_estimate(config)
    return Size(n, n * itemsize, available_bytes())


def _refuse(s: Size, itemsize: int) -> Size:
    if not s.fits:
        raise InputError(f"this configuration would hold about {s.parameters:.3g} parameters ({s.bytes / 2**30:.3g} GiB "
                         f"in {itemsize}-byte weights, twice that with gradients) and {s.available / 2**30:.3g} GiB "
                         "is available: refused before building")
    return s


def refuse_if_too_big(config, itemsize: int) -> Size:
    return _refuse(size(config, itemsize), itemsize)


def refuse_if_too_big_dict(d: dict, itemsize: int) -> Size:
    """The same check on a configuration's plain dictionary, before any class builds it."""
    n = estimate_dict(d)
    return _refuse(Size(n, n * itemsize, available_bytes()), itemsize)
