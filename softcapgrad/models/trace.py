"""One eager forward, op by op: every tanh with the number its input was divided by, every softplus and sigmoid with its contract.

A ``TorchDispatchMode`` sees each aten op with its tensors. It remembers which op produced each
tensor (keyed by storage; the outputs are kept alive for the trace, so no storage is reused) and
which parameter a storage is, so that for each site it can walk back through views and casts to
the op that really feeds it (the ``g_proj`` linear, a parameter, a division by a number), and
forward to the op that consumes it: the multiplication it scales, the axes it is broadcast over,
the format it is cast to first, and the projection that reads the product.

Modules are attributed by forward pre/post hooks on the traced model (the innermost module
running). The trace is for discovery on tiny models in eager mode; the dead-zone counts come from
the training monitor.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
SITES = {aten.tanh.default: "tanh", aten.softplus.default: "softplus", aten.sigmoid.default: "sigmoid"}
# ops through which a value stays the same value (views, copies, casts): walked through both ways
PASS = {"view", "_unsafe_view", "reshape", "expand", "unsqueeze", "squeeze", "transpose", "t", "permute", "clone",
        "contiguous", "_to_copy", "to", "alias", "detach", "slice", "select", "unbind", "split", "chunk",
        "flatten", "unflatten", "lift_fresh", "_reshape_alias", "as_strided", "copy"}
MATMUL = {"mm", "addmm", "bmm", "matmul", "linear", "baddbmm", "einsum", "_grouped_mm", "conv1d", "convolution"}


def _name(func) -> str:
    return func.overloadpacket.__name__.rstrip("_") if hasattr(func, "overloadpacket") else str(func)


def _key(t: torch.Tensor):
    try:
        return t.untyped_storage().data_ptr(), t.dtype
    except (RuntimeError, NotImplementedError):
        return None


@dataclass
class Node:
    op: str
    inputs: list  # storage keys of tensor arguments
    scalars: list  # number arguments (python numbers and 0-d CPU tensors)
    shape: tuple
    dtype: str
    module: str


@dataclass
class Tanh:
    module: str
    divisor: float | None  # the number the input was divided by (or multiplied by the reciprocal of)
    dtype: str
    shape: tuple
    then: float | None = None  # the number its output is then multiplied by (c of c·tanh(a/c)), if one is
    count: int = 1


@dataclass
class Gate:
    module: str
    fn: str  # softplus | sigmoid
    source: str  # what feeds it: "linear g_proj.weight", "parameter A_log", an op name
    dtype: str  # the format it runs in
    shape: tuple  # its output's shape
    cast: str | None = None  # the format it is cast to before its consumer
    consumer: str | None = None  # the op that first uses it (mul, add, topk, …)
    consumer_shape: tuple | None = None  # that op's output shape
    operand: str | None = None  # what the consumer combines it with (the op or linear that made the other input)
    broadcast: tuple = ()  # axes of the consumer's output the gate is broadcast over
    reader: str | None = None  # the projection (parameter) that reads the gated product, if one does soon
    kind: str = "gate"  # gate | activation (x·σ(αx): its own input scaled) | attention-sink rescale (σ(lse − sink))
    count: int = 1


def _dtype(t) -> str:
    return str(t.dtype).removeprefix("torch.")


class OpTrace(TorchDispatchMode):
    """Trace one eager forward of ``model``: ``tanhs`` and ``gates`` afterwards (merged per module and shape)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.params = {}
        for name, p in model.named_parameters(remove_duplicate=False):
            self.params.setdefault(_key(p.detach()), name)
        self.nodes: dict = {}
        self.keep: list = []
        self.tanhs: list[Tanh] = []
        self.gates: list[Gate] = []
        self._follow: dict = {}  # storage key -> (gate index, cast dtype, depth past the consumer)
        self._own: dict = {}  # gate index -> storage keys of its input and of what a scalar scaled into it
        self._tanh_out: dict = {}  # storage key of a tanh's output -> its index
        self._stack: list[str] = []
        self._hooks: list = []

    # -- module attribution

    def __enter__(self):
        names = {id(m): n or type(m).__name__ for n, m in self.model.named_modules(remove_duplicate=False)}
        for m in self.model.modules():
            name = names[id(m)]
            self._hooks.append(m.register_forward_pre_hook(lambda mod, args, name=name: self._enter(name)))
            self._hooks.append(m.register_forward_hook(lambda mod, args, out: self._leave()))
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            for h in self._hooks:
                h.remove()
            self._hooks.clear()

    def _enter(self, name: str) -> None:
        self._stack.append(name)

    def _leave(self) -> None:  # returns None: a forward hook's result would replace the module's output
        if self._stack:
            self._stack.pop()

    @property
    def module(self) -> str:
        return self._stack[-1] if self._stack else type(self.model).__name__

    # -- ops

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = _name(func)
        flat = list(args) + list((kwargs or {}).values())
        tensors = [a for a in _flatten(flat) if isinstance(a, torch.Tensor)]
        scalars = [a for a in flat if isinstance(a, (int, float)) and not isinstance(a, bool)]
        scalars += [a.item() for a in tensors if a.dim() == 0 and a.device.type == "cpu" and a.is_floating_point()]
        outs = [o for o in _flatten([out]) if isinstance(o, torch.Tensor)]
        inputs = [_key(a) for a in tensors]
        for o in outs:
            k = _key(o)
            if k is not None and (k not in self.nodes or name not in PASS):
                self.nodes[k] = Node(name, inputs, scalars, tuple(o.shape), _dtype(o), self.module)
        self.keep.extend(outs)
        if func in SITES and outs:
            self._site(SITES[func], tensors[0], outs[0])
        else:
            self._consume(name, tensors, inputs, outs)
            self._rescale(name, inputs, outs, scalars)
        return out

    def _site(self, fn: str, x: torch.Tensor, y: torch.Tensor) -> None:
        if fn == "tanh":
            self.tanhs.append(Tanh(self.module, self._divisor(_key(x)), _dtype(x), tuple(x.shape)))
            self._tanh_out[_key(y)] = len(self.tanhs) - 1
            return
        k = _key(x)
        node = self.nodes.get(k)
        scaled = set(node.inputs) if node is not None and node.op in ("mul", "div") and node.scalars else set()
        self._own[len(self.gates)] = {k, *scaled}
        made = self._made_by(k, node=True)
        kind = "attention-sink rescale" if made is not None and made.op == "sub" and any(
            self._made_by(i) == "logsumexp" for i in made.inputs) else "gate"
        self.gates.append(Gate(self.module, fn, self._source(k), _dtype(x), tuple(y.shape), kind=kind))
        self._follow[_key(y)] = (len(self.gates) - 1, None, 0)

    def _made_by(self, k, depth: int = 0, node: bool = False):
        """The op (or with ``node``, the node) that made the value ``k``, through views and casts."""
        found = self.nodes.get(k)
        if found is not None and found.op in PASS and found.inputs and depth < 6:
            return self._made_by(found.inputs[0], depth + 1, node)
        return found if node or found is None else found.op

    def _rescale(self, name: str, inputs, outs, scalars) -> None:
        """What a tanh's output is first multiplied by (through views and casts): the c of c·tanh(a/c); 0 for none."""
        hit = [self._tanh_out.pop(k) for k in inputs if k in self._tanh_out]
        if not hit:
            return
        if name in PASS and outs:
            self._tanh_out[_key(outs[0])] = hit[0]
        else:
            self.tanhs[hit[0]].then = abs(float(scalars[0])) if name == "mul" and len(scalars) == 1 else 0.0

    def _divisor(self, k) -> float | None:
        node = self.nodes.get(k)
        if node is None or node.op not in ("div", "mul") or len(node.scalars) != 1:
            return None
        c = float(node.scalars[0])
        if c == 0:
            return None
        return abs(c) if node.op == "div" else abs(1.0 / c)

    def _source(self, k, depth: int = 0) -> str:
        if k in self.params:
            return f"parameter {self.params[k]}"
        node = self.nodes.get(k)
        if node is None or depth > 12:
            return "input"
        if node.op in PASS:
            return self._source(node.inputs[0], depth + 1) if node.inputs else node.op
        if node.op in MATMUL:
            weights = [self.params[i] for i in node.inputs if i in self.params]
            return f"linear {weights[0]}" if weights else node.op
        if node.op in ("add", "sub", "mul") and len(node.inputs) == 2:  # x·W + b, a bias added or a scale
            inner = [self._source(i, depth + 1) for i in node.inputs if i not in self.params]
            named = [s for s in inner if s.startswith(("linear", "parameter"))]
            if named:
                return f"{named[0]} ({node.op})"
        return node.op

    def _consume(self, name: str, tensors, inputs, outs) -> None:
        hit = [(i, self._follow[k]) for i, k in enumerate(inputs) if k in self._follow]
        if not hit or not outs:
            return
        i, (index, cast, depth) = hit[0]
        gate = self.gates[index]
        out = outs[0]
        if name in PASS and depth == 0:
            if name == "_to_copy" and _dtype(out) != _dtype(tensors[i]):
                cast = _dtype(out)
            self._follow[_key(out)] = (index, cast, 0)
            return
        if depth == 0 and gate.consumer is None:
            gate.cast = cast
            gate.consumer = name
            gate.consumer_shape = tuple(out.shape)
            mine = tuple(tensors[i].shape)
            pad = (1,) * (out.dim() - len(mine)) + mine
            gate.broadcast = tuple(a for a, (g, o) in enumerate(zip(pad, out.shape)) if g == 1 and o > 1)
            others = [k for j, k in enumerate(inputs) if j != i and tensors[j].dim() > 0]
            gate.operand = self._source(others[0]) if others else None
            if name == "mul" and others and others[0] in self._own.get(index, ()) and gate.kind == "gate":
                gate.kind = "activation"  # x·σ(αx): SiLU, QuickGELU, a clamped GLU
        if name in ("topk", "sort", "argsort", "max") and gate.reader is None:
            gate.reader = name  # it chooses (experts, tokens): a router
            return
        if name in MATMUL:
            weights = [self.params[k] for k in inputs if k in self.params]
            if weights and gate.reader is None and depth > 0:
                gate.reader = weights[0]
            return
        if depth < 4:
            self._follow[_key(out)] = (index, None, depth + 1)


def _flatten(items):
    for a in items:
        if isinstance(a, (list, tuple)):
            yield from _flatten(a)
        else:
            yield a


def merged(items: list) -> list:
    """Equal sites (same module but for layer indices, same everything else) as one, with a count."""
    out: dict = {}
    for item in items:
        values = {k: layerless(v) if isinstance(v, str) else v for k, v in vars(item).items()}
        key = tuple(v for k, v in values.items() if k != "count")
        if key in out:
            out[key].count += item.count
        else:
            out[key] = type(item)(**values)
    return list(out.values())


def layerless(name: str) -> str:
    """``model.layers.3.self_attn`` -> ``model.layers.*.self_attn`` (also inside ``linear model.layers.3.g``)."""
    return re.sub(r"(?<=\.)\d+(?=\.|$)", "*", name)


def trace(model, run) -> OpTrace:
    """``run(model)`` under an :class:`OpTrace`, without gradients."""
    with torch.no_grad(), OpTrace(model) as t:
        run(model)
    t.keep.clear()
    t.nodes.clear()
    t._follow.clear()
    t._own.clear()
    return t

