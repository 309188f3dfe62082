"""A gate fed straight by a child module, watched through its own autograd node: no mode at all.

Many head gates are σ or softplus of one child's output (lfm3: σ(g_proj(h)); Laguna: softplus(g_proj(h)) in
float32; Qwen3-Next's shared-expert gate). For those, a step that GateMonitor watches with the dispatch mode also
asks (``FeedProbe``) whether the gate's input is a child's output, whole and unchanged, and whether the gate's
autograd node is the one node of its kind that reads that output's node, found by walking back from the module's
output through the module's own graph (the module's inputs and leaves end the walk). Where every gate of the step
was found so, later steps (``GraphWatch``) keep only a hook on each feeding child (its output, x) and one on each
gate module: after the module's forward, the path the probe learnt leads to the node again (or, if the code
changed, a walk). The gate's output is computed again from x (``gate_function``: for softplus, with the node's β
and threshold): the same kernel on the same tensor gives the same bits, which the probe checks. The node's hook
counts the backward, as the other watches do. On lfm3's attention a torch function mode costs about 4 µs for each
of its 170-odd calls; this costs two hooks per gate and a few steps along a path.

A call whose node is not found (another code path ran) is not counted: ``missed`` tells the monitor, which says
so in its report and watches with a mode from the next step on. A small gate's call is counted when the block
closes (gatecount.Later), and one whose input changed in place meanwhile is not counted either. A step without
autograd takes a mode from the start.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections import deque

import torch
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_leaves

from softcapgrad.training.attribution import recomputing

NODE = {"sigmoid": "SigmoidBackward", "softplus": "SoftplusBackward"}
_MOST = 4096  # nodes a walk may visit (more: given up, the gate not found)


def unseen():
    """A context in which no torch mode (this monitor's, another's) sees the counting's own ops: a plain one when no
    mode is on the stack (entering the disabling context costs more than the hook's other work)."""
    if torch._C._len_torch_dispatch_stack() or torch._C._len_torch_function_stack():
        return _disable_current_modes()
    return contextlib.nullcontext()


def _tensors(value) -> list[torch.Tensor]:
    """The tensors in a module's arguments or output (tuples, lists, dicts, a ModelOutput), in pytree order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if type(value) is tuple and all(v is None or isinstance(v, torch.Tensor) for v in value):  # (output, weights)
        return [v for v in value if v is not None]
    return [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]


def _is_gate(node, source, fn: str) -> bool:
    edges = node.next_functions
    return bool(edges) and edges[0][0] is source and type(node).__name__.startswith(NODE[fn])


def gate_node(outputs: list, source, fn: str, unique: bool = False,
              stop: set[int] = frozenset()) -> tuple[object, tuple] | tuple[None, None]:
    """The autograd node of ``fn`` whose input is ``source`` (a node), walking back from the ``outputs`` nodes
    breadth first (a gate sits a few nodes before a module's output; an attention core's are many more), and the
    path to it: (the output's index, the edge taken at each node). At most ``_MOST`` nodes; leaves, ``source`` and
    the nodes whose ids are in ``stop`` end a branch. ``unique``: walk on, and give the node only if no other such
    node reads ``source``. (None, None): not found."""
    queue = deque((n, (i,)) for i, n in enumerate(outputs) if n is not None and id(n) not in stop)
    seen: set[int] = set(stop)
    found: list[tuple] = []
    while queue:
        node, path = queue.popleft()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if len(seen) > _MOST + len(stop):
            break
        if _is_gate(node, source, fn):
            found.append((node, path))
            if not unique:
                break
        for k, (child, _) in enumerate(node.next_functions):
            if child is not None and child is not source:
                queue.append((child, path + (k,)))
    return found[0] if len(found) == 1 and not (unique and queue) else (None, None)


def follow(outputs: list, path: tuple, source, fn: str):
    """The node at the end of ``path`` when it is still the gate of ``source`` (the same code ran); else a walk."""
    node = outputs[path[0]] if path[0] < len(outputs) else None
    for k in path[1:]:
        edges = node.next_functions if node is not None else ()
        node = edges[k][0] if k < len(edges) else None
    return node if node is not None and _is_gate(node, source, fn) else gate_node(outputs, source, fn)[0]


def gate_function(node, fn: str):
    """The gate as its node ran it, a function of its input (softplus with the node's own β and threshold): computed
    again from the same input, the same kernel gives the same bits (the probe checks it once). Not the output the
    node stores: unpacking it inside a checkpointed region would run that region's recomputation in the middle of
    the forward."""
    if fn == "sigmoid":
        return torch.sigmoid
    return functools.partial(torch.nn.functional.softplus, beta=node._saved_beta, threshold=node._saved_threshold)


class _Hooks:
    """Forward hooks on the gate modules (after each: ``left``) and on their feeding children (their outputs)."""

    def __init__(self, gates: list[torch.nn.Module], children: list[torch.nn.Module]) -> None:
        self.outputs: dict[int, torch.Tensor] = {}  # id(child) -> its last output this step
        self._handles = [c.register_forward_hook(self._child_output) for c in children]  # each child once
        self._handles += [m.register_forward_hook(self._leave) for m in gates]

    @staticmethod
    def _live() -> bool:  # a forward with a graph, not one replayed inside the backward (checkpointing)
        return torch.is_grad_enabled() and not recomputing()

    def _child_output(self, module, args, output) -> None:
        if isinstance(output, torch.Tensor) and self._live():
            self.outputs[id(module)] = output

    def _leave(self, module, args, output) -> None:
        if not self._live():
            return
        with unseen():
            self.left(module, [t.grad_fn for t in _tensors(output)])

    def left(self, module, outputs: list) -> None:
        raise NotImplementedError

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self.outputs.clear()


class FeedProbe(_Hooks):
    """Beside a dispatch-mode step over the gate modules: which gate is fed by a child's output, and found from the
    module's output by its node. ``saw`` is the monitor's call for each gate the mode counted."""

    def __init__(self, gates: list[torch.nn.Module]) -> None:
        self._child = {id(c): c for m in gates for c in m.children()}
        super().__init__(gates, list(self._child.values()))
        self._pending: dict[int, list] = {}  # id(gate module) -> (site, child, the gate's output) this call
        self._inputs: dict[int, list] = {}  # id(gate module) -> its inputs' nodes, per call (a stack)
        self._handles += [m.register_forward_pre_hook(self._enter, with_kwargs=True) for m in gates]
        self.found: dict = {}  # site -> (gate module, child), both weak, and the path to its node
        self.lost: set = set()  # sites some call of which was not found so

    def _enter(self, module, args, kwargs) -> None:
        self._inputs.setdefault(id(module), []).append(
            {id(t.grad_fn) for t in _tensors((args, kwargs)) if t.grad_fn is not None})

    def saw(self, site, module, x: torch.Tensor, y: torch.Tensor) -> None:
        fed = [c for i, c in self._child.items() if (t := self.outputs.get(i)) is not None and t.data_ptr() ==
               x.data_ptr() and t.shape == x.shape and t.stride() == x.stride() and t.dtype == x.dtype]
        if module is None or len(fed) != 1:
            self.lost.add(site)
            return
        self._pending.setdefault(id(module), []).append((site, fed[0], y))

    def _leave(self, module, args, output) -> None:
        calls = self._inputs.get(id(module))
        self._stop = calls.pop() if calls else set()
        super()._leave(module, args, output)

    def left(self, module, outputs: list) -> None:
        for site, child, y in self._pending.pop(id(module), []):
            x = self.outputs.get(id(child))
            node, path = (gate_node(outputs, x.grad_fn, site.fn, unique=True, stop=self._stop) if x is not None
                          else (None, None))
            earlier = self.found.get(site)
            if node is None or not torch.equal(gate_function(node, site.fn)(x.detach()), y) or (
                    earlier is not None and earlier[1]() is not child):
                self.lost.add(site)
            else:
                self.found[site] = (weakref.ref(module), weakref.ref(child), path)

    def feeds(self, sites) -> dict | None:
        """Each counted site's (gate module, child, path), when every one of them was found by its node; else None."""
        sites = list(sites)
        ok = sites and all(s in self.found and s not in self.lost for s in sites)
        return {s: self.found[s] for s in sites} if ok else None


def graph_watch(monitor, feeds: dict | None):
    """The watch with no mode for this step, where the probe found every gate's feed and node, each still lives, and
    this step records a graph (a no-grad forward has no nodes); None: watch with a mode."""
    if not feeds or monitor.routers or not torch.is_grad_enabled():
        return None
    of: dict[int, list] = {}  # id(gate module) -> (site, child, path)
    gates, children = {}, {}
    for site, (module, child, path) in feeds.items():
        module, child = module(), child()
        if module is None or child is None:
            return None
        gates[id(module)], children[id(child)] = module, child
        of.setdefault(id(module), []).append((site, child, path))
    return GraphWatch(monitor, of, list(gates.values()), list(children.values()))


class GraphWatch(_Hooks):
    """A step watched with no mode: each gate counted from its feeding child's output and its node (see above)."""

    def __init__(self, monitor, of: dict[int, list], gates: list, children: list) -> None:
        self.monitor, self.open, self.missed = monitor, True, 0  # missed: gate calls whose node was not found
        self._of = of
        super().__init__(gates, children)

    def left(self, module, outputs: list) -> None:
        calls = self._of.get(id(module), ())
        for site, child, path in calls:
            x = self.outputs.get(id(child))
            if x is None:
                continue  # the gate's feeding child did not run: nor did the gate, in the code path the probe saw
            node = follow(outputs, path, x.grad_fn, site.fn)
            if node is None:  # another code path ran: this call is not counted, and the monitor goes back to a mode
                self.missed += 1
                continue
            token = self.monitor._count_soon(site, x.detach(), gate_function(node, site.fn))
            node.register_hook(functools.partial(self._backward, site, token))
        for _, child, _ in calls:
            self.outputs.pop(id(child), None)

    def _backward(self, site, token, grad_inputs, grad_outputs) -> None:
        if self.open and grad_inputs and grad_inputs[0] is not None:
            self.monitor._backward_soon(site, grad_outputs[0], grad_inputs[0], token)

    def close(self) -> None:
        self.open = False
        super().close()
