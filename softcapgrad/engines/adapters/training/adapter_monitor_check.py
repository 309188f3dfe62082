"""softcapgrad's DeadZoneMonitor inside another library's training step, beside a brute force that counts the same.

A training adapter's ``monitor`` route runs its library's own step twice (an SGD update between them) inside
``DeadZoneMonitor`` (the first step watched op by op, the second through the sites it learnt), while a torch
function mode of its own records every tanh the library calls (``torch.tanh``, ``Tensor.tanh``), the module it
ran in (forward hooks on every submodule), its stored output and the gradient that reached that output. Per module
and step the brute force counts the elements, those stored as exactly ±1, and those whose backward is exactly 0
under a non-zero upstream gradient (eager tanh's backward g·(1 − y²), in the op's format, from the stored y). Both
counts go into the step's file; the test compares them.

softcapgrad is imported from this project's own package (the folder above the adapters), which needs only numpy
and torch here; nothing from the model folder or the working folder runs.
"""

import sys
from pathlib import Path

import numpy as np

FIELDS = ("calls", "count", "saturated", "zero_grad")


def _project() -> None:
    root = str(Path(__file__).resolve().parents[4])
    if root not in sys.path:
        sys.path.append(root)


class BruteForce:
    """Every tanh the wrapped code calls, per module name (the root model's calls under its class name)."""

    def __init__(self, model):
        import torch
        from torch.overrides import TorchFunctionMode

        self.calls = []  # [module, stored output, upstream gradient or None]
        self.stack = [type(model).__name__]
        self.handles = []
        for name, module in model.named_modules():
            if name:
                self.handles.append(module.register_forward_pre_hook(
                    lambda m, a, name=name: self.stack.append(name)))
                self.handles.append(module.register_forward_hook(lambda m, a, o: self.stack.pop() and None))
        calls, stack = self.calls, self.stack
        tanh_fns = {torch.tanh, torch.Tensor.tanh, torch.nn.functional.tanh}

        class Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if func in tanh_fns:
                    call = [stack[-1], out.detach().clone(), None]
                    calls.append(call)
                    if out.requires_grad:
                        out.register_hook(lambda g, call=call: call.__setitem__(2, g.detach().clone()))
                return out

        self.mode = Mode()

    def close(self) -> None:
        for h in self.handles:
            h.remove()

    def counts(self, start: int = 0) -> dict:
        """module -> [calls, elements, saturated, zero gradient] over the calls from ``start`` on."""
        out: dict = {}
        for module, y, g in self.calls[start:]:
            row = out.setdefault(module, [0, 0, 0, 0])
            row[0] += 1
            row[1] += y.numel()
            row[2] += int((y.abs() == 1).sum())
            if g is not None:
                back = g * (1 - y * y)  # eager tanh_backward, in the op's format
                row[3] += int(((back == 0) & (g != 0)).sum())
        return out


def monitored_steps(model, step, steps: int = 2, lr: float = 1e-3) -> tuple:
    """``step()`` (a forward and backward of the library's own) ``steps`` times inside DeadZoneMonitor and the
    brute force, an SGD update after each: the first step's result, and the arrays the step file keeps (per
    module, ``FIELDS`` summed over the steps, the monitor's and the brute force's)."""
    import torch

    _project()
    from softcapgrad.training.monitor import DeadZoneMonitor

    monitor, brute = DeadZoneMonitor(), BruteForce(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    results = []
    try:
        for _ in range(steps):
            optimizer.zero_grad(set_to_none=True)
            with brute.mode, monitor:
                results.append(step())
            optimizer.step()
    finally:
        brute.close()
    watched: dict = {}
    for row in monitor.rows():
        if row.fn != "tanh":
            continue
        got = watched.setdefault(row.module, [0, 0, 0, 0])
        for i, value in enumerate((row.calls, row.count, row.saturated, row.zero_grad)):
            got[i] += int(value or 0)
    counted = brute.counts()
    modules = sorted(set(watched) | set(counted))
    out = {"monitor/modules": np.array(modules),
           "monitor/watched": np.array([watched.get(m, [0, 0, 0, 0]) for m in modules], dtype=np.int64),
           "monitor/brute": np.array([counted.get(m, [0, 0, 0, 0]) for m in modules], dtype=np.int64)}
    return results[0], out
