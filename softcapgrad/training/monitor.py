"""DeadZoneMonitor: every tanh and sigmoid that runs inside a step, and where its gradient is exactly 0.

softcapgrad.md, "The bf16 dead-zone", measured on code nobody here wrote. A ``TorchDispatchMode``
(the shape of torch's ``FlopCounterMode``) sees ``aten.tanh`` / ``aten.sigmoid`` and their backward
ops ``tanh_backward(grad_output, output)`` / ``sigmoid_backward``, below autograd and autocast, so
the format it records is the one the op really ran in. Per module and call site it counts

    saturated  elements whose stored output is exactly ±1 (0 or 1 for the sigmoid)
    zero_grad  elements whose backward returned exactly 0 while the upstream gradient was not 0

and keeps the largest |input|. Where the tanh's input is the output of a division by a number c
(or a product with 1/c), c is recorded as the cap of ``c·tanh(a/c)``; the path's first
zero-gradient input is then in units of a (otherwise of the tanh's own input, c = 1).

Attribution is by the Python stack at the forward op: the innermost ``nn.Module`` being called
(its name from the outermost one's ``named_modules``, learnt once per model, so that two models or
two instances of a class keep their own rows) and the first frame outside torch (file:line).
Each backward op is paired with its forward through the saved output's storage. A forward op run
while autograd runs a backward is a replay (gradient checkpointing, reentrant or not): it is paired
with the backward that reads it, in the module that first ran it, and not counted again. torch's
``ModuleTracker`` is not used: its global module hooks make torch 2.13's dynamo fail on a
``torch.compile``d module. Compiled regions run compiled under the monitor (the mode declares
``ignore_compile_internals``); their ops are inside generated kernels, so the monitor counts how
many compiled regions ran instead, and says that their tanh and sigmoid are not counted.

A ``TorchFunctionMode`` would cost less (318 Python calls per tiny Gemma 2 step against 849 aten
ops), but dynamo traces function modes: a handler that records (frame walk, hooks) breaks the
graph and makes the cap run eagerly, and one that steps aside with ``torch.compiler.is_compiling()``
made torch 2.13's dynamo hand wrong values back to the traced code (``Tensor.dim()`` returned a
device) when it fell back from a failed trace. A monitor must not change what it measures.
"""

from __future__ import annotations

import io
import os
import sys
import weakref
from dataclasses import asdict, dataclass
from typing import Callable

import torch
from torch._ops import HigherOrderOperator
from torch.utils._python_dispatch import TorchDispatchMode

from softcapgrad.core.report import Report, Table, render_table

aten = torch.ops.aten
FORWARD = {aten.tanh.default: "tanh", aten.tanh_.default: "tanh",
           aten.sigmoid.default: "sigmoid", aten.sigmoid_.default: "sigmoid"}
BACKWARD = {aten.tanh_backward.default: "tanh", aten.sigmoid_backward.default: "sigmoid"}
SCALE = {aten.div.Tensor: False, aten.mul.Tensor: True}  # op -> the number multiplies (True) or divides
# one lookup per op, by identity (op overloads are singletons; their __hash__ runs Python code)
_ROLE = {id(op): ("forward", fn) for op, fn in FORWARD.items()} | {id(op): ("backward", fn) for op, fn in BACKWARD.items()} \
    | {id(op): ("scale", multiplies) for op, multiplies in SCALE.items()}
LOW = (torch.bfloat16, torch.float16)
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_CALL = torch.nn.Module._call_impl.__code__


# --- where a path's gradient dies: looked up by the caller ------------------------------------


@dataclass(frozen=True)
class FirstZero:
    """A path's first zero-gradient input for one format and cap, and where that figure comes from."""

    value: float | None
    source: str


FirstZeroLookup = Callable[[str, str, float, str], FirstZero]  # (path, scores format, c, fn)


def no_lookup(path: str, scores: str, c: float, fn: str = "tanh") -> FirstZero:
    return FirstZero(None, "not looked up")


def path_name(device: str, compiled: bool = False) -> str:
    return f"torch-{'compile' if compiled else 'eager'}-{device}"


# --- where an op was called from ---------------------------------------------------------------


def short_file(filename: str) -> str:
    """A file relative to the import path entry holding it (site-packages, the project), else its name."""
    best = ""
    for entry in sys.path:
        entry = os.path.join(os.path.abspath(entry or "."), "")
        if filename.startswith(entry) and len(entry) > len(best):
            best = entry
    return filename[len(best):] if best else os.path.basename(filename)


def call_site(frame) -> tuple[torch.nn.Module | None, torch.nn.Module | None, str]:
    """(innermost module, outermost module, file:line) of the op whose dispatch runs below ``frame``."""
    inner = outer = None
    site = None
    while frame is not None:
        code = frame.f_code
        if code is _CALL:
            module = frame.f_locals.get("self")
            inner = inner or module
            outer = module
        elif site is None and not code.co_filename.startswith(_TORCH_DIR):
            site = f"{short_file(code.co_filename)}:{frame.f_lineno}"
        frame = frame.f_back
    return inner, outer, site or "(torch)"


def recomputing() -> bool:
    """Whether a forward op runs while autograd runs a backward: a replayed forward (gradient checkpointing,
    either mode, recomputes the forward inside the backward) whose elements were counted when it first ran."""
    return torch._C._current_graph_task_id() != -1


class Owners:
    """Each module's model and qualified name, learnt from the outermost module called around an op.

    A model is registered the first time one of its ops runs, with every module under it; a forward
    replayed inside the backward (transformers' checkpointing calls the layer's ``forward``, outside
    the model) then finds its modules already owned. Two models (or two instances of one class) get
    separate owners; ``qualifier`` names them only when more than one model ran.
    """

    def __init__(self, names: dict[str, torch.nn.Module] | None = None) -> None:
        self._given = {id(m): name for name, m in (names or {}).items()}
        self._of: dict[int, tuple[weakref.ref, int, str]] = {}  # id(module) -> (module, model index, name)
        self.models: list[tuple[str, str | None]] = []  # (class name, given name)

    def _register(self, root: torch.nn.Module) -> None:
        index = len(self.models)
        self.models.append((type(root).__name__, self._given.get(id(root))))
        for name, m in root.named_modules(remove_duplicate=False):
            known = self._of.get(id(m))
            if known is None or known[0]() is not m:
                self._of[id(m)] = (weakref.ref(m), index, name)

    def owner(self, inner: torch.nn.Module | None, outer: torch.nn.Module | None) -> tuple[int, str]:
        """(model index, name under the model) of ``inner``; (-1, "Global") outside any module."""
        if inner is None:
            return -1, "Global"
        known = self._of.get(id(inner))
        if known is None or known[0]() is not inner:
            self._register(outer)
            known = self._of[id(inner)]
        return known[1], known[2] or type(inner).__name__

    def qualifier(self, index: int) -> str:
        """How a row names its model: '' for one unnamed model, else the given name, the class, or class#k."""
        if index < 0 or (len(self.models) < 2 and self.models[index][1] is None):
            return ""
        cls, given = self.models[index]
        if given is not None:
            return given
        same = [i for i, (c, _) in enumerate(self.models) if c == cls]
        return cls if len(same) == 1 else f"{cls}#{same.index(index) + 1}"


# --- compiled regions --------------------------------------------------------------------------


class CompiledRegions:
    """Counts compiled regions entered (dynamo cache hits and new compilations) while active."""

    def __init__(self) -> None:
        self.entered = 0
        self.supported = True
        self._previous = None

    def _hit(self, cache_hit: bool) -> bool:
        if cache_hit:
            self.entered += 1
        return self._previous(cache_hit) if self._previous is not None else cache_hit

    def _compile(self, args) -> None:
        if args.callback_trigger.name == "DYNAMO":
            self.entered += 1

    def __enter__(self):
        try:
            from torch._C._dynamo.eval_frame import set_guard_complete_hook
            from torch._dynamo.callback import callback_handler
        except ImportError:
            self.supported = False
            return self
        self._previous = set_guard_complete_hook(self._hit)
        callback_handler.register_start_callback(self._compile)
        return self

    def __exit__(self, *exc) -> None:
        if not self.supported:
            return
        from torch._C._dynamo.eval_frame import set_guard_complete_hook
        from torch._dynamo.callback import callback_handler

        set_guard_complete_hook(self._previous)
        callback_handler.remove_start_callback(self._compile)


# --- the monitor -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Site:
    model: int  # the owner's index (-1: no module); rows qualify ``module`` by it when several models ran
    module: str
    site: str
    fn: str
    dtype: str
    device: str
    cap: float | None


class _Tally:
    """Running sums of one site, kept as tensors on the op's device (no host sync per op)."""

    __slots__ = ("calls", "count", "saturated", "max_abs", "backward_calls", "backward_count", "zero_grad", "inputs",
                 "recomputed")

    def __init__(self) -> None:
        self.calls = self.count = self.backward_calls = self.backward_count = self.recomputed = 0
        self.saturated = self.max_abs = self.zero_grad = None
        self.inputs: list[torch.Tensor] = []


def _add(total, value):
    return value if total is None else total + value


@dataclass(frozen=True)
class SiteRow:
    module: str
    site: str
    fn: str
    dtype: str
    path: str
    cap: float | None  # the divisor feeding the tanh (None: none seen, the tanh's own input)
    calls: int
    recomputed: int  # forward calls replayed inside the backward (checkpointing): paired with it, not counted again
    count: int  # elements through the forward
    saturated: int  # stored output exactly ±1 (0 or 1 for the sigmoid)
    backward_count: int  # elements through the backward
    zero_grad: int | None  # backward exactly 0 with a non-zero upstream gradient (None: no backward seen)
    max_abs: float  # largest |a|: c·(largest |a/c| as stored) with a cap, else max_abs_input
    max_abs_input: float  # largest |input| of the tanh / sigmoid
    first_zero_grad_input: float | None  # the path's, in units of a (c·tanh(a/c)) or of the sigmoid's input
    source: str
    saturated_fraction: float


class DeadZoneMonitor(TorchDispatchMode):
    """Wrap a forward and backward; ``rows()`` / ``report()`` give one row per module, call site and format.

    ``keep_inputs=True`` also keeps a CPU fp32 copy of every tanh / sigmoid input (for audits that
    compare them with other paths' horizons). ``first_zero(path, scores, c, fn)`` gives each row its
    path's first zero-gradient input; ``softcapgrad.DeadZoneMonitor`` looks it up in the real-stack
    table (softcapgrad.stacks.watch). Nothing in the monitored code changes: forward and backward
    values are bit-identical with and without it.
    """

    supports_higher_order_operators = True  # flex_attention and friends pass through, counted as hidden

    def __init__(self, keep_inputs: bool = False, first_zero: FirstZeroLookup = no_lookup,
                 models: dict[str, torch.nn.Module] | None = None) -> None:
        super().__init__()
        self.keep_inputs = keep_inputs
        self.first_zero = first_zero
        self._owners = Owners(models)
        self.higher_order: dict[str, int] = {}
        self._tallies: dict[Site, _Tally] = {}
        self._by_output: dict[int, Site] = {}  # forward output storage -> its site, for the backward
        self._scaled: tuple[int, tuple, float] | None = None  # last x/c: (data_ptr, shape, c)
        self._compiled = CompiledRegions()

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True  # let torch.compile run compiled code; its ops stay out of sight (counted as regions)

    def __enter__(self):
        self._compiled.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._compiled.__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        role = _ROLE.get(id(func))
        if role is None:
            if isinstance(func, HigherOrderOperator):
                self.higher_order[func.name()] = self.higher_order.get(func.name(), 0) + 1
        elif role[0] == "scale":
            self._note_scale(role[1], args, out)
        elif role[0] == "forward":
            self._forward(role[1], args[0], out)
        else:
            self._backward(role[1], args[0], args[1], out)
        return out

    # -- recording

    def _note_scale(self, multiplies: bool, args, out) -> None:
        other = args[1] if len(args) > 1 else None
        if isinstance(other, torch.Tensor):
            if other.dim() != 0 or other.device.type != "cpu":
                return
            other = other.item()
        if isinstance(other, (int, float)) and other not in (0, 1) and isinstance(out, torch.Tensor):
            c = 1.0 / other if multiplies else float(other)
            self._scaled = (out.data_ptr(), tuple(out.shape), abs(c))

    def _forward(self, fn: str, x: torch.Tensor, y: torch.Tensor) -> None:
        cap = None
        if fn == "tanh" and self._scaled is not None and self._scaled[:2] == (x.data_ptr(), tuple(x.shape)):
            cap = self._scaled[2]
        inner, outer, where = call_site(sys._getframe(2))
        model, module = self._owners.owner(inner, outer)
        site = Site(model, module, where, fn, str(x.dtype).removeprefix("torch."), x.device.type, cap)
        tally = self._tallies.setdefault(site, _Tally())
        self._by_output[y.data_ptr()] = site
        if recomputing():
            tally.recomputed += 1
            return
        tally.calls += 1
        tally.count += y.numel()
        if y.numel() == 0:
            return
        stuck = (y.abs() == 1) if fn == "tanh" else (y == 0) | (y == 1)
        tally.saturated = _add(tally.saturated, stuck.sum())
        big = x.detach().abs().max().float()
        tally.max_abs = big if tally.max_abs is None else torch.maximum(tally.max_abs, big)
        if self.keep_inputs:
            tally.inputs.append(x.detach().float().cpu().reshape(-1))

    def _backward(self, fn: str, grad_output: torch.Tensor, output: torch.Tensor, grad_input: torch.Tensor) -> None:
        site = self._by_output.get(output.data_ptr())
        if site is None:  # its forward ran outside the monitor
            site = Site(-1, "(forward not seen)", "(forward not seen)", fn, str(output.dtype).removeprefix("torch."),
                        output.device.type, None)
        tally = self._tallies.setdefault(site, _Tally())
        tally.backward_calls += 1
        tally.backward_count += grad_input.numel()
        tally.zero_grad = _add(tally.zero_grad, ((grad_input == 0) & (grad_output != 0)).sum())

    # -- results

    @property
    def compiled_regions(self) -> int:
        return self._compiled.entered

    def hidden(self) -> str | None:
        """One line when compiled code ran inside the monitor (its tanh and sigmoid were not seen)."""
        if not self._compiled.supported:
            return "this torch offers no way to see whether compiled regions ran; any tanh inside one was not counted"
        n = self._compiled.entered
        if n == 0 and not self.higher_order:
            return None
        what = f"{n} compiled region{'s' if n != 1 else ''}"
        if self.higher_order:
            what += " and " + ", ".join(f"{k} ×{v}" for k, v in sorted(self.higher_order.items()))
        return (f"{what} ran inside the monitor: the tanh and sigmoid ops inside them run in generated kernels, "
                "are not counted here, and have their own dead zone (torch.compile and flex_attention paths, not eager)")

    def inputs(self, site: Site) -> torch.Tensor:
        """Every recorded input of a site, flattened, fp32 on the CPU (``keep_inputs=True``)."""
        parts = self._tallies[site].inputs
        return torch.cat(parts) if parts else torch.empty(0)

    def sites(self) -> list[Site]:
        return list(self._tallies)

    def rows(self) -> list[SiteRow]:
        rows = []
        for site, t in self._tallies.items():
            path = path_name(site.device)
            stack = self.first_zero(path, site.dtype, site.cap or 1.0, site.fn)
            saturated = 0 if t.saturated is None else int(t.saturated)
            largest = 0.0 if t.max_abs is None else float(t.max_abs)
            qualifier = self._owners.qualifier(site.model)
            rows.append(SiteRow(
                module=f"{qualifier}/{site.module}" if qualifier else site.module, site=site.site, fn=site.fn,
                dtype=site.dtype, path=path, cap=site.cap, calls=t.calls, recomputed=t.recomputed, count=t.count, saturated=saturated, backward_count=t.backward_count,
                zero_grad=None if t.backward_calls == 0 else int(t.zero_grad),
                max_abs=largest if site.cap is None else site.cap * largest, max_abs_input=largest,
                first_zero_grad_input=stack.value, source=stack.source,
                saturated_fraction=saturated / t.count if t.count else 0.0,
            ))
        return rows

    def report(self) -> Report:
        rows = [asdict(r) for r in self.rows()]
        hidden = self.hidden()
        low = [r for r in rows if r["dtype"] in ("bfloat16", "float16")]
        dead = sum(r["zero_grad"] or 0 for r in rows)
        if rows:
            answer = [f"{len(rows)} tanh/sigmoid call site{'s' if len(rows) != 1 else ''} ran outside compiled code "
                      f"({sum(r['count'] for r in rows):,} elements, {len(low)} in bf16/fp16); "
                      f"{sum(r['saturated'] for r in rows):,} elements were stored as exactly ±1 (0 or 1) and "
                      f"{dead:,} received an exactly-zero gradient from a non-zero upstream."]
        else:
            answer = ["No tanh or sigmoid ran outside compiled code" + (": nothing was counted." if hidden else ".")]
        if hidden:
            answer.append(hidden[0].upper() + hidden[1:] + ".")
        return Report(
            command="monitor",
            params={"compiled_regions": self.compiled_regions},
            tables=(
                Table("rows", "tanh and sigmoid per module and call site", rows, show=False),
                Table("where", "where each tanh / sigmoid ran", rows,
                      ("module", "fn", "dtype", "cap", "first_zero_grad_input"), wide=("site", "path", "source"), json=False),
                Table("counts", "what it did", rows, ("module", "count", "saturated", "zero_grad", "max_abs"),
                      wide=("calls", "backward_count", "max_abs_input", "saturated_fraction"), json=False),
            ),
            notes=(
                "saturated: stored output exactly ±1 (0 or 1 for the sigmoid); zero_grad: backward exactly 0 where the upstream gradient was not",
                "cap: the number the tanh's input was divided by; first_zero_grad_input is in units of the pre-cap a (of the tanh input when no cap was seen)",
            ),
            answer=tuple(answer),
        )

    def table(self, width: int = 100, wide: bool = False) -> str:
        """The report as text, as the command line prints it."""
        from rich.console import Console

        buffer = io.StringIO()
        render_table(self.report(), Console(file=buffer, width=width), wide=wide)
        return buffer.getvalue()
