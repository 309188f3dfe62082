"""The contract of a softplus or sigmoid site: what feeds it, its shape, how it is broadcast, its formats, what reads it.

softmax-softplus-gates.md: a runtime must tell two "softplus" apart by shape, source tensor, axis,
placement and consumer, not by a family label. Each traced site (:class:`~softcapgrad.models.trace.Gate`)
becomes a :class:`Contract` whose axes are named against the batch, the tokens and the
configuration's sizes (the tiny configurations give them distinct values, so a size names its
axis): the gate of Laguna comes out as ``softplus(linear g_proj)``, shape (batch, tokens, heads),
broadcast over head_dim into the attention output, then read by ``o_proj``.
"""

from __future__ import annotations

from dataclasses import dataclass

ROLES = (  # config field -> the axis it names (first match wins; the tiny sizes are distinct)
    ("num_attention_heads", "heads"), ("head_dim", "head_dim"), ("hidden_size", "channels"),
    ("num_key_value_heads", "kv_heads"), ("intermediate_size", "intermediate"), ("num_experts", "experts"),
    ("n_routed_experts", "experts"), ("num_local_experts", "experts"), ("moe_intermediate_size", "intermediate"),
    ("num_experts_per_tok", "top_k"),
)


@dataclass(frozen=True)
class Contract:
    module: str  # where it runs (layer indices as *)
    fn: str  # softplus | sigmoid
    source: str  # what feeds it: "linear model.layers.*.self_attn.g_proj.weight", "parameter …", an op
    shape: str  # "(batch, tokens, heads)"
    broadcast: str  # the consumer's axes it is broadcast over ("head_dim"), "" when none, "—" when not consumed
    runs_in: str  # the format the softplus / sigmoid ran in
    cast_to: str  # the format it is cast to before its consumer ("" when not cast)
    consumer: str  # "mul → (batch, tokens, heads, head_dim)"
    operand: str  # what the consumer combines it with
    reader: str  # the projection that reads the product, or "topk" for a router
    role: str  # a one-phrase summary of the contract
    count: int  # how many calls (layers, experts) share it
    kind: str = "gate"  # gate | activation | attention-sink rescale


def axis_names(config, batch: int, tokens: int) -> dict[int, str]:
    """Size -> axis name, from the batch, the tokens and the configuration (and its sub-configurations)."""
    from softcapgrad.models.caps import fields

    names: dict[int, str] = {}
    values = fields(config)
    for field, role in ROLES:
        for path, value in values.items():
            if path.rsplit(".", 1)[-1] == field and isinstance(value, int) and value > 1:
                names.setdefault(value, role)
    heads = names and next((v for v, r in names.items() if r == "heads"), None)
    dim = next((v for v, r in names.items() if r == "head_dim"), None)
    if heads and dim and heads * dim not in names:
        names[heads * dim] = "heads·head_dim"
    names[batch * tokens] = "batch·tokens"
    names[tokens] = "tokens"
    names[batch] = "batch"
    return names


ROUTED = -1  # an axis whose length differs from call to call of one site: the tokens routed to each expert


def _axes(shape, names) -> str:
    return "(" + ", ".join("routed tokens" if n == ROUTED else names.get(n, str(n)) for n in shape) + ")"


def _joined(shapes) -> tuple | None:
    """One shape for the calls of a site: an axis that differs between them (routed tokens) as ROUTED."""
    shapes = [s for s in shapes if s is not None]
    if not shapes:
        return None
    if len({len(s) for s in shapes}) > 1:
        return shapes[0]
    return tuple(d[0] if len(set(d)) == 1 else ROUTED for d in zip(*shapes))


def by_site(gates) -> list:
    """One gate per site: the calls of one site (every layer, every expert's routed tokens) as one, with a count."""
    import dataclasses

    from softcapgrad.models.trace import merged

    groups: dict = {}
    for g in merged(gates):
        key = (g.module, g.fn, g.source, g.kind, g.dtype, g.cast, g.consumer, g.operand, g.reader)
        groups.setdefault(key, []).append(g)
    out = []
    for group in groups.values():
        first = group[0]
        out.append(dataclasses.replace(first, shape=_joined([g.shape for g in group]),
                                       consumer_shape=_joined([g.consumer_shape for g in group]),
                                       broadcast=tuple(sorted({a for g in group for a in g.broadcast})),
                                       count=sum(g.count for g in group)))
    return out


def contract(gate, names: dict[int, str]) -> Contract:
    consumed = gate.consumer is not None
    out_shape = gate.consumer_shape or ()
    broadcast = ", ".join("routed tokens" if a < len(out_shape) and out_shape[a] == ROUTED else
                          names.get(out_shape[a], f"axis {a}") if a < len(out_shape) else f"axis {a}"
                          for a in gate.broadcast) if consumed else "—"
    reader = gate.reader or ""
    kind = getattr(gate, "kind", "gate")
    if kind == "activation":
        role = f"activation: {gate.operand or 'its input'} scaled by its own {gate.fn} (x·σ(αx)), not a gate"
    elif kind == "attention-sink rescale":
        role = "attention-sink rescale: σ(logsumexp − sink) scales the attention output"
    elif reader in ("topk", "sort", "argsort", "max"):
        role = "router: its values choose (top-k)"
    elif consumed and gate.consumer == "mul" and reader:
        over = f" over {broadcast}" if broadcast else " per element"
        role = f"scales {gate.operand or 'a tensor'}{over}, read by {reader.removesuffix('.weight')}"
    elif consumed and gate.consumer == "mul":
        role = f"scales {gate.operand or 'a tensor'}" + (f" over {broadcast}" if broadcast else " per element")
    elif consumed:
        role = f"feeds {gate.consumer}"
    else:
        role = "not consumed in the forward"
    return Contract(
        module=gate.module, fn=gate.fn, source=gate.source, shape=_axes(gate.shape, names), broadcast=broadcast,
        runs_in=gate.dtype, cast_to=gate.cast or "",
        consumer=f"{gate.consumer} → {_axes(out_shape, names)}" if consumed else "",
        operand=gate.operand or "", reader=reader, role=role, count=gate.count, kind=kind,
    )


def contracts(gates, config, batch: int, tokens: int) -> list[Contract]:
    names = axis_names(config, batch, tokens)
    return [contract(g, names) for g in by_site(gates)]
