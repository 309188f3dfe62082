"""Counting a compiled cap from inside the compiled graph, without changing what the graph computes.

Under ``torch.compile`` the cap ``c·tanh(a/c)`` becomes one fused loop, and its backward recomputes
tanh from the saved input ``a`` in fp32: whether an element's gradient is exactly 0 is decided by
``a`` alone, against the compiled path's own first zero-gradient input (``torch-compile-cpu``,
``torch-compile-cuda``). So a cap is counted by looking at ``a``.

An inductor pre-grad pass (installed by :func:`install`, before the model compiles) puts one call
of the custom op ``softcapgrad::cap_input(a, fn, module, site, cap)`` in front of each tanh, sigmoid
and softplus of the graph (``fn`` "sigmoid·x" where the sigmoid's output is multiplied by its own
input, x·σ(αx): an activation, which the gate monitor leaves out), and in front of each softmax
whose output a top-k reads (a router: ``fn`` "router:DIM:DTYPE", the softmax's dimension and
dtype): the module path inside the compiled region and the source line come from the trace's metadata, c from a division (or product) by a constant. The op does nothing and returns
nothing; it is declared side-effecting so that no pass removes it, and it only reads ``a``, so the
forward and backward kernels compute the same bits. Its kernel hands the real ``a`` to each monitor
active at the time (``WATCHERS``), with or without a dispatch mode on the stack; outside a monitor a
call costs one dispatch of an op that does nothing. No
compiled sigmoid stack has a measured first zero: a compiled sigmoid is counted, not judged.
"""

from __future__ import annotations

import operator
import threading

import torch

VERSION = "5"  # part of the pass's cache key: compiled graphs cached with an older pass are not reused


# the active monitors' counters, each with the thread that entered it (a dispatch mode is per thread too, and a
# monitor's own first-zero lookup compiles and runs caps in a thread of its own, which must not call it again)
WATCHERS: list[tuple[int, object]] = []


@torch.library.custom_op("softcapgrad::cap_input", mutates_args=())
def cap_input(a: torch.Tensor, fn: str, module: str, site: str, cap: float) -> None:
    """Nothing but hand the cap's input, inside compiled code, to the monitors active now (none: nothing).

    ``module``: the module path inside the compiled region ("" for the region's own code); ``site``:
    file:line of the tanh as traced; ``cap``: the c of a / c (0: no constant division before it).
    The call carries its site itself, so a graph loaded from inductor's cache needs nothing else.
    """
    here = threading.get_ident()
    for thread, count in tuple(WATCHERS):
        if thread == here:
            count(a, fn, module, site, cap)


@cap_input.register_fake
def _cap_input_fake(a: torch.Tensor, fn: str, module: str, site: str, cap: float) -> None:
    return None


OP = torch.ops.softcapgrad.cap_input.default
torch.fx.node.has_side_effect(OP)

_TANH = {torch.tanh, torch.tanh_, torch.nn.functional.tanh, torch.Tensor.tanh, torch.Tensor.tanh_}
_SIGMOID = {torch.sigmoid, torch.sigmoid_, torch.nn.functional.sigmoid, torch.Tensor.sigmoid, torch.Tensor.sigmoid_}
_SOFTPLUS = {torch.nn.functional.softplus}
_SOFTMAX = {torch.softmax, torch.nn.functional.softmax, torch.Tensor.softmax}
_TOPK = {torch.topk, torch.Tensor.topk}
_DIV = {operator.truediv, torch.div, torch.true_divide, torch.Tensor.div, torch.Tensor.__truediv__}
_MUL = {operator.mul, torch.mul, torch.Tensor.mul, torch.Tensor.__mul__}
# in place: ``a.div_(c)`` overwrites a, so the counter must read a before that node
_DIV_ = {operator.itruediv, torch.Tensor.div_, torch.Tensor.__itruediv__}
_MUL_ = {operator.imul, torch.Tensor.mul_, torch.Tensor.__imul__}


def _is(node: torch.fx.Node, functions: set, methods: tuple[str, ...]) -> bool:
    if node.op == "call_function":
        return node.target in functions
    return node.op == "call_method" and node.target in methods


def _numerator(x: torch.fx.Node) -> tuple[torch.fx.Node, float | None, torch.fx.Node | None]:
    """(a, c, the division node when it overwrites a) where x is a / c or a · (1/c) with a constant c;
    else (x, None, None)."""
    for divides, functions, methods in ((True, _DIV, ("div", "__truediv__", "true_divide")),
                                        (False, _MUL, ("mul", "__mul__"))):
        overwrites = _is(x, _DIV_ if divides else _MUL_, ("div_", "__itruediv__") if divides else ("mul_", "__imul__"))
        if not (overwrites or _is(x, functions, methods)) or len(x.args) != 2 or x.kwargs:
            continue
        a, k = x.args
        if not divides and isinstance(k, torch.fx.Node) and not overwrites:
            a, k = k, a
        if isinstance(a, torch.fx.Node) and isinstance(k, (int, float)) and k not in (0, 1):
            return a, abs(float(k) if divides else 1.0 / float(k)), x if overwrites else None
    return x, None, None


def _where(node: torch.fx.Node) -> tuple[str, str]:
    """(module path inside the region, file:line) from the node's trace metadata."""
    stack = node.meta.get("nn_module_stack") or {}
    path = ""
    if stack:
        path = list(stack.values())[-1][0]
        path = path.split(".", 1)[1] if path.startswith("L[") and "." in path else ""
    line = "(compiled)"
    for text in reversed((node.meta.get("stack_trace") or "").splitlines()):
        text = text.strip()
        if text.startswith('File "'):
            file, _, rest = text[len('File "'):].partition('", line ')
            line = f"{file}:{rest.split(',')[0]}"
            break
    return path, line


def _value(node: torch.fx.Node):
    return node.meta.get("example_value", node.meta.get("val"))


def _activation(node: torch.fx.Node, x: torch.fx.Node) -> bool:
    """Whether the sigmoid ``node`` of ``x`` is multiplied by its own input: x·σ(x), or x·σ(αx) with a constant α."""
    sources = {x}
    if _is(x, _MUL, ("mul", "__mul__")) and len(x.args) == 2:
        sources |= {a for a, k in (x.args, x.args[::-1])
                    if isinstance(a, torch.fx.Node) and isinstance(k, (int, float))}
    for user in node.users:
        if _is(user, _MUL, ("mul", "__mul__")) and len(user.args) == 2:
            other = user.args[1] if user.args[0] is node else user.args[0]
            if other in sources:
                return True
    return False


def _router(node: torch.fx.Node) -> str | None:
    """"router:DIM:DTYPE" where ``node`` is a softmax over a constant dimension whose output a top-k reads."""
    if not _is(node, _SOFTMAX, ("softmax",)) or not any(_is(u, _TOPK, ("topk",)) for u in node.users):
        return None
    dim = node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else None)
    dtype = node.kwargs.get("dtype", node.args[2] if len(node.args) > 2 else None)
    if not isinstance(dim, int) or not (dtype is None or isinstance(dtype, torch.dtype)):
        return None
    return f"router:{dim}:{str(dtype).removeprefix('torch.') if dtype is not None else ''}"


def instrument(graph: torch.fx.Graph) -> int:
    """Put a ``cap_input`` call before each tanh, sigmoid, softplus and router softmax of a pre-grad graph; the
    number put."""
    put = 0
    for node in list(graph.nodes):
        fn = "tanh" if _is(node, _TANH, ("tanh", "tanh_")) else \
            "sigmoid" if _is(node, _SIGMOID, ("sigmoid", "sigmoid_")) else \
            "softplus" if _is(node, _SOFTPLUS, ()) and len(node.args) == 1 and not node.kwargs else _router(node)
        if fn is None or not node.args or not isinstance(node.args[0], torch.fx.Node):
            continue
        a, cap, overwrite = _numerator(node.args[0]) if fn == "tanh" else (node.args[0], None, None)
        if fn == "sigmoid" and _activation(node, a):
            fn = "sigmoid·x"
        value = _value(a)
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            continue
        path, line = _where(node)
        with graph.inserting_before(overwrite or node):  # before an in-place division: a as it was
            graph.call_function(OP, (a, fn, path, line, cap or 0.0))
        put += 1
    return put


def _pass_base():
    from torch._inductor.custom_graph_pass import CustomGraphPass

    return CustomGraphPass


class CountingPass(_pass_base()):
    """The pre-grad pass; its uuid keys inductor's caches, so graphs compiled without it are not reused."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        instrument(graph)

    def uuid(self) -> str:
        return f"softcapgrad.cap_input v{VERSION}"


PASS = CountingPass()


def install() -> None:
    """Make every graph inductor compiles from now on carry the counters (once per process)."""
    from torch._inductor import config

    current = config.pre_grad_custom_pass
    if current is PASS or (isinstance(current, (list, tuple)) and any(p is PASS for p in current)):
        return
    if current is None:
        config.pre_grad_custom_pass = PASS
    else:
        config.pre_grad_custom_pass = [*(current if isinstance(current, (list, tuple)) else [current]), PASS]


def installed() -> bool:
    from torch._inductor import config

    current = config.pre_grad_custom_pass
    return current is PASS or (isinstance(current, (list, tuple)) and any(p is PASS for p in current))
