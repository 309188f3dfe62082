"""A gate fed straight by a child module, watched through its own autograd node: no mode at all.

Many gates are σ or softplus of one child's output (lfm3: σ(g_proj(h)); Qwen3-Next's shared-expert gate), of a cast
of it (Laguna: softplus(g_proj(h).float())), or of one of the gate module's own outputs (Laguna's router returns the
logits its σ reads: σ(F.linear(h, W).float())). For those, a step that GateMonitor watches with the dispatch mode
also asks (``FeedProbe``) whether the gate's input is a child's output, whole and unchanged from the child's return
to the module's (or one cast of it: a ToCopyBackward node reading that output's node), or one of the module's own
outputs, and whether the gate's autograd node is the one node of its kind that reads that input's node, found by
walking back from the module's output through the module's own graph (the module's inputs and leaves end the walk).
Where every gate of the step was found so, later steps (``GraphWatch``) keep only a hook on each feeding child (its
output) and one on each gate module: after the module's forward, the path the probe learnt leads to the node again
(or, if the code changed, a walk), and x is the child's output (cast again to the format the gate's node received:
the same cast of the same tensor gives the same bits, which the probe checks) or the module's output. The gate's
output is computed again from x (``gate_function``: for softplus, with the node's β and threshold): the same kernel
on the same tensor gives the same bits, which the probe checks too. The node's hook counts the backward, as the
other watches do. On lfm3's attention a torch function mode costs about 4 µs for each of its 170-odd calls; this
costs two hooks per gate and a few steps along a path.

A call whose node is not found (another code path ran), or whose feeding child's output changed in place
before the module returned, is not counted: ``missed`` tells the monitor, which says
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
from torch.utils.hooks import RemovableHandle

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


def _is_gate(node, source, fn: str, cast: torch.dtype | None = None) -> bool:
    """Whether ``node`` is ``fn``'s node reading ``source`` (``cast``: through one ToCopyBackward node, the gate's
    input in that format)."""
    edges = node.next_functions
    if not edges or not type(node).__name__.startswith(NODE[fn]):
        return False
    first = edges[0][0]
    if cast is None:
        return first is source
    return (first is not None and type(first).__name__.startswith("ToCopyBackward") and bool(first.next_functions)
            and first.next_functions[0][0] is source and node._input_metadata[0].dtype == cast)


def gate_node(outputs: list, source, fn: str, cast: torch.dtype | None = None, unique: bool = False,
              stop: set[int] = frozenset()) -> tuple[object, tuple] | tuple[None, None]:
    """The autograd node of ``fn`` whose input is ``source`` (a node; ``cast``: a cast of it to that format),
    walking back from the ``outputs`` nodes breadth first (a gate sits a few nodes before a module's output; an
    attention core's are many more), and the path to it: (the output's index, the edge taken at each node). At
    most ``_MOST`` nodes; leaves, ``source`` and the nodes whose ids are in ``stop`` end a branch. ``unique``: walk
    on, and give the node only if no other such node reads ``source``. (None, None): not found."""
    if source is None:
        return None, None
    queue = deque((n, (i,)) for i, n in enumerate(outputs) if n is not None and n is not source and id(n) not in stop)
    seen: set[int] = set(stop)
    found: list[tuple] = []
    while queue:
        node, path = queue.popleft()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if len(seen) > _MOST + len(stop):
            break
        if _is_gate(node, source, fn, cast):
            found.append((node, path))
            if not unique:
                break
        for k, (child, _) in enumerate(node.next_functions):
            if child is not None and child is not source:
                queue.append((child, path + (k,)))
    return found[0] if len(found) == 1 and not (unique and queue) else (None, None)


def follow(outputs: list, path: tuple, source, fn: str, cast: torch.dtype | None = None):
    """The node at the end of ``path`` when it is still the gate of ``source`` (the same code ran); else a walk."""
    node = outputs[path[0]] if path[0] < len(outputs) else None
    for k in path[1:]:
        edges = node.next_functions if node is not None else ()
        node = edges[k][0] if k < len(edges) else None
    if node is not None and _is_gate(node, source, fn, cast):
        return node
    return gate_node(outputs, source, fn, cast)[0]


def _same(t: torch.Tensor, x: torch.Tensor) -> bool:
    """Whether ``t`` and ``x`` are the same tensor's values: storage, shape, strides and format."""
    return t.data_ptr() == x.data_ptr() and t.shape == x.shape and t.stride() == x.stride() and t.dtype == x.dtype


def _fed_by(kept: tuple, x: torch.Tensor):
    """How a child's output, kept with its version when the child returned, feeds the gate's input ``x``: None
    (it is ``x``), the format it is cast to (``x`` is one cast of it), or False (neither, or changed in place)."""
    t, version = kept
    if t._version != version or t.shape != x.shape or t.device != x.device:
        return False
    if _same(t, x):
        return None
    node = x.grad_fn
    if (t.grad_fn is not None and node is not None and type(node).__name__.startswith("ToCopyBackward")
            and node.next_functions and node.next_functions[0][0] is t.grad_fn
            and node.next_functions[0][1] == t.output_nr):
        return x.dtype
    return False


def gate_function(node, fn: str):
    """The gate as its node ran it, a function of its input (softplus with the node's own β and threshold): computed
    again from the same input, the same kernel gives the same bits (the probe checks it once). Not the output the
    node stores: unpacking it inside a checkpointed region would run that region's recomputation in the middle of
    the forward."""
    if fn == "sigmoid":
        return torch.sigmoid
    return functools.partial(torch.nn.functional.softplus, beta=node._saved_beta, threshold=node._saved_threshold)


def _hook(module: torch.nn.Module, hook) -> tuple:
    """``module.register_forward_hook(hook)`` without its handle, as a (hooks dict, key) pair for ``_unhook``: the
    same dict entry under an id from the handles' own counter, for less than the handle's weak references cost (five
    hooks a watched step, set and removed)."""
    key = RemovableHandle.next_id
    RemovableHandle.next_id += 1
    module._forward_hooks[key] = hook
    return module._forward_hooks, key


def _unhook(hooked: tuple) -> None:
    hooked[0].pop(hooked[1], None)


class _Hooks:
    """Forward hooks on the gate modules (after each: ``left``) and on their feeding children (their outputs)."""

    def __init__(self, gates: list[torch.nn.Module], children: list[torch.nn.Module]) -> None:
        self.outputs: dict[int, tuple] = {}  # id(child) -> its last output this step, and that output's version
        self._hooked = [_hook(c, self._child_output) for c in children]  # each child once
        self._hooked += [_hook(m, self._leave) for m in gates]
        self._handles: list = []  # handles of the hooks registered otherwise (the probe's pre-hooks)

    @staticmethod
    def _live() -> bool:  # a forward with a graph, not one replayed inside the backward (checkpointing)
        return torch.is_grad_enabled() and not recomputing()

    def _child_output(self, module, args, output) -> None:
        if isinstance(output, torch.Tensor) and self._live():
            self.outputs[id(module)] = (output, output._version)

    def _leave(self, module, args, output) -> None:
        if not self._live():
            return
        if torch._C._len_torch_dispatch_stack() or torch._C._len_torch_function_stack():
            with _disable_current_modes():  # unseen(), inline: most steps run with no mode on the stack
                self.left(module, _tensors(output))
        else:
            self.left(module, _tensors(output))

    def left(self, module, outputs: list[torch.Tensor]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        for hooked in self._hooked:
            _unhook(hooked)
        for handle in self._handles:
            handle.remove()
        self._hooked.clear()
        self._handles.clear()
        self.outputs.clear()


class FeedProbe(_Hooks):
    """Beside a dispatch-mode step over the gate modules: which gate is fed by a child's output (or a cast of it, or
    the module's own output), and found from the module's output by its node. ``saw`` is the monitor's call for each
    gate the mode counted."""

    def __init__(self, gates: list[torch.nn.Module]) -> None:
        self._child = {id(c): c for m in gates for c in m.children()}
        super().__init__(gates, list(self._child.values()))
        self._pending: dict[int, list] = {}  # id(gate module) -> (site, (child, cast) or None, x, y) this call
        self._inputs: dict[int, list] = {}  # id(gate module) -> its inputs' nodes, per call (a stack)
        self._handles += [m.register_forward_pre_hook(self._enter, with_kwargs=True) for m in gates]
        self.found: dict = {}  # site -> (gate module (weak), its feed, the path to its node); a feed: (the child
        # (weak) or None, the module's output index or None, the format of the cast or None)
        self.lost: set = set()  # sites some call of which was not found so

    def _enter(self, module, args, kwargs) -> None:
        self._inputs.setdefault(id(module), []).append(
            {id(t.grad_fn) for t in _tensors((args, kwargs)) if t.grad_fn is not None})

    def saw(self, site, module, x: torch.Tensor, y: torch.Tensor) -> None:
        fed = [(c, cast) for i, c in self._child.items()
               if (kept := self.outputs.get(i)) is not None and (cast := _fed_by(kept, x)) is not False]
        if module is None or len(fed) > 1:
            self.lost.add(site)
            return
        self._pending.setdefault(id(module), []).append((site, fed[0] if fed else None, x, y))  # none: its output?

    def _leave(self, module, args, output) -> None:
        calls = self._inputs.get(id(module))
        self._stop = calls.pop() if calls else set()
        super()._leave(module, args, output)

    def left(self, module, outputs: list[torch.Tensor]) -> None:
        nodes = [t.grad_fn for t in outputs]
        for site, fed, x, y in self._pending.pop(id(module), []):
            if fed is None:  # one of the module's own outputs, whole
                index = next((i for i, t in enumerate(outputs) if _same(t, x)), None)
                feed, source, cast, x_in, whole = (None, index, None), x.grad_fn, None, x.detach(), index is not None
            else:
                child, cast = fed
                t, version = self.outputs[id(child)]
                feed, source, whole = (child, None, cast), t.grad_fn, t._version == version  # unchanged since
                x_in = t.detach() if cast is None else t.detach().to(cast)
            node, path = gate_node(nodes, source, site.fn, cast, unique=True, stop=self._stop) if whole else (None, None)
            earlier = self.found.get(site)
            if node is None or not torch.equal(x_in, x.detach()) or not torch.equal(
                    gate_function(node, site.fn)(x_in), y) or (earlier is not None and _feed(earlier[1]) != feed):
                self.lost.add(site)
            else:
                self.found[site] = (weakref.ref(module), (weakref.ref(feed[0]) if feed[0] is not None else None,)
                                    + feed[1:], path)

    def feeds(self, sites) -> dict | None:
        """Each counted site's (gate module, feed, path), when every one of them was found by its node; else None."""
        sites = list(sites)
        ok = sites and all(s in self.found and s not in self.lost for s in sites)
        return {s: self.found[s] for s in sites} if ok else None


def _feed(feed: tuple) -> tuple:
    """A kept feed with its child, while it lives (weak references compare by identity)."""
    return (feed[0]() if feed[0] is not None else None,) + feed[1:]


def graph_watch(monitor, feeds: dict | None):
    """The watch with no mode for this step, where the probe found every gate's feed and node, each still lives, and
    this step records a graph (a no-grad forward has no nodes); None: watch with a mode."""
    if not feeds or monitor.routers or not torch.is_grad_enabled():
        return None
    of: dict[int, list] = {}  # id(gate module) -> (site, child or None, output index or None, cast or None, path)
    gates, children = {}, {}
    for site, (module, feed, path) in feeds.items():
        module, (child, index, cast) = module(), _feed(feed)
        if module is None or (feed[0] is not None and child is None):
            return None
        gates[id(module)] = module
        if child is not None:
            children[id(child)] = child
        of.setdefault(id(module), []).append((site, child, index, cast, path))
    return GraphWatch(monitor, of, list(gates.values()), list(children.values()))


class GraphWatch(_Hooks):
    """A step watched with no mode: each gate counted from its feed and its node (see above)."""

    def __init__(self, monitor, of: dict[int, list], gates: list, children: list) -> None:
        self.monitor, self.open, self.missed = monitor, True, 0  # missed: gate calls whose node was not found
        self._of = of
        super().__init__(gates, children)

    def left(self, module, outputs: list[torch.Tensor]) -> None:
        calls = self._of.get(id(module), ())
        nodes = None
        monitor = self.monitor
        for site, child, index, cast, path in calls:
            if child is None:  # the module's own output
                x = outputs[index] if index < len(outputs) else None
                if x is None:
                    self.missed += 1
                    continue
            else:
                kept = self.outputs.get(id(child))
                if kept is None:
                    continue  # the gate's feeding child did not run: nor did the gate, in the code path the probe saw
                x = kept[0]
                if x._version != kept[1]:  # changed in place after the child returned: which values the gate read
                    self.missed += 1  # is not known
                    continue
            nodes = nodes if nodes is not None else [t.grad_fn for t in outputs]
            node = follow(nodes, path, x.grad_fn, site.fn, cast)
            if node is None:  # another code path ran: this call is not counted, and the monitor goes back to a mode
                self.missed += 1
                continue
            x = x.detach() if cast is None else x.detach().to(cast)  # the cast as the model ran it: the same bits
            token = monitor._count_soon(site, x, gate_function(node, site.fn))
            node.register_hook(functools.partial(self._backward, site, token))
        for _, child, _, _, _ in calls:
            if child is not None:
                self.outputs.pop(id(child), None)

    def _backward(self, site, token, grad_inputs, grad_outputs) -> None:
        if self.open and grad_inputs and grad_inputs[0] is not None:
            self.monitor._backward_soon(site, grad_outputs[0], grad_inputs[0], token)

    def close(self) -> None:
        self.open = False
        super().close()
