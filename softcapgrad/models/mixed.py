"""Which module refused a mix of formats, found by watching the model run, not by reading the error.

A model that makes float32 tensors of its own (a vocoder's fixed filter kept in float32, a length
regulator's positions) fails in bfloat16 where one of those tensors meets a bfloat16 one in a module
whose op wants a single format (a convolution, a linear layer, a layer norm). The kernel library
words that refusal differently on each CPU (oneDNN's bfloat16 convolution on a CPU with bfloat16
instructions, ATen's own check elsewhere), and raises it at different depths of the dispatcher, so
the refusal is decided here by what the module was given: one forward with forward hooks on every
module, and when the forward raises, the innermost module still running is looked at. It refused a
mix the model made when the floating tensors it held (its arguments, its own weights and buffers)
are of two formats and one of them, of another format than the model's weights, is not a parameter:
the model computed it or keeps it as a buffer, since the audit feeds its inputs in the weights'
format. The module is the same on every CPU; the error's text is never read.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mix:
    module: str  # the innermost module running when the forward raised, layer numbers as *
    kind: str  # its class, e.g. "Conv1d"
    made: str  # the format of the tensor the model made itself, e.g. "float32"
    weights: str  # the format of the model's weights, e.g. "bfloat16"

    def said(self) -> str:
        return f"first met in {self.module}, a {self.kind} given {self.made} beside {self.weights}"


def _floating(items) -> list:
    import torch

    out = []
    for item in items:
        if isinstance(item, torch.Tensor) and item.is_floating_point():
            out.append(item)
        elif isinstance(item, (list, tuple)):
            out += _floating(item)
        elif isinstance(item, dict):
            out += _floating(list(item.values()))
    return out


def _mix(module, args, kwargs, weights, params: set):
    """(made format) when ``module``, given ``args`` and ``kwargs``, holds a tensor of the model's own in another
    format than ``weights`` beside ones of two formats; else None."""
    held = _floating([*args, *kwargs.values(), *module.parameters(recurse=False), *module.buffers(recurse=False)])
    if len({t.dtype for t in held}) < 2:
        return None
    made = [t for t in held if t.dtype != weights and t.untyped_storage().data_ptr() not in params]
    return made[0].dtype if made else None


def refused_mix(model, run) -> Mix | None:
    """``run(model)`` once without gradients: the mix of formats of the model's own that the innermost module
    running refused when the run raised, or None (it ran, or what raised was something else)."""
    import torch

    from softcapgrad.models.trace import layerless

    weights = {p.dtype for p in model.parameters() if p.is_floating_point()}
    dtype = getattr(model, "dtype", None) or (weights.pop() if len(weights) == 1 else None)
    if dtype is None:
        return None
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    names = {id(m): n or type(model).__name__ for n, m in model.named_modules(remove_duplicate=False)}
    stack: list = []  # (module, the format of the model's own it was given, or None)

    def enter(module, args, kwargs):
        stack.append((module, _mix(module, args, kwargs, dtype, params)))

    def leave(module, args, kwargs, out):  # returns None: a result would replace the module's output
        if stack:
            stack.pop()

    hooks = [h for m in model.modules() for h in (m.register_forward_pre_hook(enter, with_kwargs=True),
                                                  m.register_forward_hook(leave, with_kwargs=True))]
    try:
        with torch.no_grad():
            run(model)
    except Exception:  # noqa: BLE001 -- the raise is what is watched: the module still running made it
        if stack and stack[-1][1] is not None:
            module, made = stack[-1]
            return Mix(layerless(names[id(module)]), type(module).__name__, str(made).removeprefix("torch."),
                       str(dtype).removeprefix("torch."))
        return None
    finally:
        for h in hooks:
            h.remove()
    return None
