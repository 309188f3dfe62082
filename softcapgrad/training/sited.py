"""Watching only where the caps ran: a dispatch mode pushed while a site module's own code runs.

A dispatch mode over every aten op costs one Python call per op: about 850 of them in a tiny Gemma 2
step, which make the step about 1.6× slower with a mode that does nothing at all. The monitor's
first watched step finds the modules whose own code calls tanh or sigmoid (the innermost module
at each call); from then on the mode is on only while such a module's own code runs, and off while
its children run (a Gemma 2 model's final cap is in the model's own forward, around the whole
network it calls). The backward is then watched without any mode: the tanh's autograd node gets a
hook that sees the same two tensors ``tanh_backward`` gets (the upstream gradient and the result),
so the counts are those of the mode over every op.

Caps inside compiled code need no mode at all: their in-graph counters call the active monitors.
What the first step cannot show is not seen later: a cap that first runs in another module after
it, or outside any module. The monitor therefore learns only from a step whose every eager cap ran
inside a module, and never hooks modules when compiled code runs beside eager caps (dynamo would
trace the hooks): there it keeps the mode over every op.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

BACKWARD_NODES = ("TanhBackward", "SigmoidBackward")


class SiteWatch:
    """Hooks on the site modules and their children that push ``mode`` in a site's own code only."""

    def __init__(self, mode, modules: list[torch.nn.Module], on_backward: Callable[..., None],
                 nodes: tuple[str, ...] = BACKWARD_NODES, base: type = TorchDispatchMode, also=None,
                 children: bool = True) -> None:
        # ``mode`` is pushed as a ``base`` (a dispatch mode, or a torch function mode); ``also``, a torch
        # function mode pushed with it in the same places; ``children=False`` leaves the mode on in the site
        # modules' children too (a function mode sees a Linear's one call for less than two hooks cost)
        self.modes = [(mode, base)] + ([(also, TorchFunctionMode)] if also is not None else [])
        self.nodes = nodes  # the autograd nodes (by class-name prefix) whose backward is counted
        self.on_backward = on_backward
        self.open = True
        self._on = False
        self._states: list[bool] = []
        self._pending: list[tuple] = []  # (output, site, input): outputs whose autograd node is set after dispatch
        hooked: dict[int, tuple[torch.nn.Module, bool]] = {}
        for module in modules:
            hooked[id(module)] = (module, True)
            for child in module.children() if children else ():
                hooked.setdefault(id(child), (child, False))
        self._handles = []
        for module, site in hooked.values():
            self._handles.append(module.register_forward_pre_hook(functools.partial(self._enter, site)))
            self._handles.append(module.register_forward_hook(self._leave, always_call=True))

    def _set(self, on: bool) -> None:
        if on == self._on:
            return
        if on:
            for mode, base in self.modes:
                base.__enter__(mode)
        else:
            for mode, base in reversed(self.modes):
                base.__exit__(mode, None, None, None)
            self.flush()
        self._on = on

    def _enter(self, site: bool, module, args) -> None:
        self._states.append(self._on)
        self._set(site)

    def _leave(self, module, args, output) -> None:
        if self._states:  # none: the monitor was entered inside this module's forward
            self._set(self._states.pop())

    def backward_of(self, y: torch.Tensor, site, x: torch.Tensor | None = None) -> None:
        """Count the backward of the tanh / sigmoid whose output is ``y`` and input ``x`` (its node is set once
        dispatch returns)."""
        self._pending.append((y, site, x))

    def flush(self) -> None:
        for y, site, x in self._pending:
            node = y.grad_fn
            if node is not None and type(node).__name__.startswith(self.nodes):
                node.register_hook(functools.partial(self._backward, site, x))
        self._pending.clear()

    def _backward(self, site, x, grad_inputs, grad_outputs) -> None:
        """The node's (grad_input,) and (grad_output,): the result and first argument of tanh_backward."""
        if self.open and grad_inputs and grad_inputs[0] is not None:
            self.on_backward(site, grad_outputs[0], grad_inputs[0], x)

    def close(self) -> None:
        """Remove the hooks; a backward that runs after this is not counted (as with the mode over every op)."""
        self.open = False
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._states.clear()
        self._set(False)
        self.flush()



class SitedMode(TorchDispatchMode):
    """The with-block both monitors share. Nested blocks count once (the outermost); a block runs the dispatch mode
    over every op until one has shown where the sites are, then ``_watch(modules)`` returns the SiteWatch that
    watches only there. A subclass sets ``_depth``, ``_learnt``, ``_sited`` and ``_compiled``, and gives
    ``_open()`` (a block starts), ``_watch(modules)`` and ``_closed(sited, exc)`` (a block ended, its compiled
    regions counted)."""

    def __enter__(self):
        self._depth += 1
        if self._depth > 1:  # already active (``with m:`` around ``with m.step():``): the outer block counts, once
            return self
        self._compiled.__enter__()
        self._regions_before = self._compiled.entered
        self._open()
        modules = [m for m in (ref() for ref in self._learnt or ()) if m is not None]
        if self._learnt is not None and len(modules) == len(self._learnt):
            self._sited = self._watch(modules)
            return self
        return super().__enter__()

    def __exit__(self, *exc):
        self._depth -= 1
        if self._depth:
            return None
        sited, self._sited = self._sited, None
        try:
            if sited is not None:
                sited.close()
            else:
                return super().__exit__(*exc)
        finally:
            self._compiled.__exit__(*exc)
            self._closed(sited is not None, exc)
