"""The torch calls that reach a gate: how GateMonitor watches a gate module's own code once it knows them.

A dispatch mode costs a Python call per aten op and re-enters the dispatcher for each; a torch function mode sees
the calls of Python code (torch functions and Tensor methods) before they dispatch, for a fraction of that, and
nothing of the backward, which the gates' autograd nodes report (sited.py). GateMonitor pushes it only where the
dispatch mode has shown every gate and the function mode, probed once beside it, saw each of them too.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode


def _function_roles() -> dict:
    """The Python-level calls (torch functions, Tensor methods) that reach the ops of ``_ROLE``: the watch over a
    gate module's own code sees them, and a learning step checks that it saw every gate the ops showed."""
    F, T = torch.nn.functional, torch.Tensor
    roles = {f: ("forward", "sigmoid") for f in (torch.sigmoid, T.sigmoid, F.sigmoid, torch.special.expit)}
    roles |= {f: ("forward_", "sigmoid") for f in (torch.sigmoid_, T.sigmoid_)}
    roles |= {F.softplus: ("forward", "softplus")}
    roles |= {f: ("forward", "softmax") for f in (torch.softmax, T.softmax, F.softmax, torch.special.softmax)}
    roles |= {f: ("choose", "") for f in (torch.topk, T.topk, torch.sort, T.sort, torch.argsort, T.argsort)}
    roles |= {f: ("choose_dim", "") for f in (torch.max, T.max)}  # max with a dim only (aten.max.dim)
    roles |= {f: ("mul", "") for f in (torch.mul, T.mul, torch.div, T.div, T.__truediv__)}
    return roles


_FUNCTION_ROLE = _function_roles()
# what a watch over learnt gate modules needs: their gates, and a softmax only where a router was found (its top-k
# too); the products that tell x·σ(αx) apart were judged while the ops were watched
_GATES = {f: r for f, r in _FUNCTION_ROLE.items() if r[1] in ("sigmoid", "softplus")}
_ROUTERS = _GATES | {f: r for f, r in _FUNCTION_ROLE.items() if r[1] == "softmax" or r[0].startswith("choose")}


class GateCalls(TorchFunctionMode):
    """The monitor's eyes on a gate module's own code once a step has found every gate (SiteWatch pushes it there
    only): one Python call per torch call of that code, where a dispatch mode costs several times more per op,
    and none in the backward, which the gates' autograd nodes report. ``probe``: inside a step the dispatch mode
    counts, only note which gate sites this watch would have seen."""

    def __init__(self, monitor: "GateMonitor") -> None:
        super().__init__()
        self.monitor = monitor
        self.probe: set | None = None
        self.roles = _FUNCTION_ROLE
        self.watching = False  # counting for the monitor (not probing)

    def watch(self, routers: bool) -> None:
        self.roles, self.watching = (_ROUTERS if routers else _GATES), True

    def unwatch(self) -> None:
        self.roles, self.watching = _FUNCTION_ROLE, False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        role = self.roles.get(func)
        if role is None:  # most calls: as little Python as possible
            return func(*args, **kwargs) if kwargs else func(*args)
        kwargs = kwargs or {}
        kind, fn = role
        x = args[0] if args else None
        if not isinstance(x, torch.Tensor) or torch.compiler.is_compiling():  # traced code: counted, if at all,
            return func(*args, **kwargs)  # where it runs compiled (the monitor names compiled regions)
        before = (x.data_ptr(), x.clone() if kind == "forward_" else x)
        out = func(*args, **kwargs)
        m = self.monitor
        if kind.startswith("forward"):
            x_in = before[1] if out.dtype == x.dtype else before[1].to(out.dtype)  # softmax(dtype=): as it ran
            if self.probe is not None:
                self._probe(fn, x_in)
            else:
                m._forward(fn, x_in, out, before[0])
        elif self.probe is not None:
            pass
        elif kind == "choose" or (kind == "choose_dim" and (len(args) > 1 or "dim" in kwargs)):
            m._choose(x)
        elif kind == "mul":
            m._mul(args, out)
        return out

    def _probe(self, fn: str, x: torch.Tensor) -> None:  # at the depth of GateMonitor._forward: _site reads frame 3
        if torch._C._current_graph_task_id() == -1:
            self.probe.add(self.monitor._site(fn, x)[0])
