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
``ignore_compile_internals``); their tanh runs inside generated kernels, whose backward recomputes it
from the cap's input, so a compiled site is counted on that input against the compiled path's own
first zero, through an op that inductor's graph carries and whose kernel hands that input to the
monitors active at the time (softcapgrad.training.ingraph).
A region compiled without it (before any monitor existed, or by another backend) and kernels such as
flex_attention's are named in one line (``hidden``), not shown as zero.

A ``TorchFunctionMode`` would cost less (318 Python calls per tiny Gemma 2 step against 849 aten
ops), but dynamo traces function modes: a handler that records (frame walk, hooks) breaks the
graph and makes the cap run eagerly, and one that steps aside with ``torch.compiler.is_compiling()``
made torch 2.13's dynamo hand wrong values back to the traced code (``Tensor.dim()`` returned a
device) when it fell back from a failed trace. A monitor must not change what it measures.
"""

from __future__ import annotations

import io
import sys
import threading
import weakref
from dataclasses import asdict

import torch
from torch._ops import HigherOrderOperator

from softcapgrad.core.report import Report, render_table
from softcapgrad.training import ingraph, ranks
from softcapgrad.training.attribution import (
    CompiledRegions, FirstZero, FirstZeroLookup, Owners, call_site, compiled_site, no_lookup, one_step, path_name,
    recomputing, short_file,  # noqa: F401 -- short_file: addressed here too
)
from softcapgrad.training.sited import SitedMode, SiteWatch
from softcapgrad.training.tally import (
    Site, SiteRow, rows_report, _add, _largest, _lost_mass, _past, _stuck, _Tally, _zero_grads,
)

aten = torch.ops.aten
FORWARD = {aten.tanh.default: "tanh", aten.tanh_.default: "tanh",
           aten.sigmoid.default: "sigmoid", aten.sigmoid_.default: "sigmoid"}
BACKWARD = {aten.tanh_backward.default: "tanh", aten.sigmoid_backward.default: "sigmoid"}
SCALE = {aten.div.Tensor: False, aten.mul.Tensor: True,  # op -> the number multiplies (True) or divides
         aten.div_.Tensor: False, aten.mul_.Tensor: True}
IN_PLACE = {aten.tanh_.default, aten.sigmoid_.default}  # these overwrite the input the monitor reads
# one lookup per op, by identity (op overloads are singletons; their __hash__ runs Python code)
_ROLE = {id(op): ("forward", fn) for op, fn in FORWARD.items()} | {id(op): ("backward", fn) for op, fn in BACKWARD.items()} \
    | {id(op): ("scale", multiplies) for op, multiplies in SCALE.items()} \
    | {id(op): ("in place", FORWARD[op]) for op in IN_PLACE}
LOW = (torch.bfloat16, torch.float16)
# wrappers whose one child is the model (torch.compile's _orig_mod, DDP's module): rows name the model's modules


# --- the monitor -------------------------------------------------------------------------------


class DeadZoneMonitor(SitedMode):
    """Wrap a forward and backward; ``rows()`` / ``report()`` give one row per module, call site and format.

    ``keep_inputs=True`` also keeps a CPU fp32 copy of every tanh / sigmoid input (for audits that
    compare them with other paths' horizons). ``first_zero(path, scores, c, fn)`` gives each row its
    path's first zero-gradient input; ``softcapgrad.DeadZoneMonitor`` looks it up in the real-stack
    table (softcapgrad.stacks.watch). ``models={"teacher": m}`` names a model's rows (otherwise rows
    are qualified by class, and ``#k``, only when several models ran). ``compiled=True`` makes every
    graph inductor compiles from now on count its caps (softcapgrad.training.ingraph). ``every=N``:
    ``with monitor.step():`` watches one step in N. Nothing in the monitored code changes: forward and
    backward values are bit-identical with and without it.

    ``learn=True``: after a watched step whose caps all ran eagerly inside modules, the next watched
    steps watch only those modules' own code (softcapgrad.training.sited), with the same counts at a
    fraction of the cost; ``learnt_from=monitor`` starts with another monitor's sites. Entering a
    monitor that is already active (``with m:`` around ``with m.step():``) does nothing: it counts once.
    """

    supports_higher_order_operators = True  # flex_attention and friends pass through, counted as hidden

    def __init__(self, keep_inputs: bool = False, first_zero: FirstZeroLookup = no_lookup,
                 models: dict[str, torch.nn.Module] | None = None, compiled: bool = True, every: int = 1,
                 learn: bool = True, learnt_from: "DeadZoneMonitor | None" = None) -> None:
        super().__init__()
        if not (isinstance(every, int) and every >= 1):
            raise ValueError(f"every must be a whole number ≥ 1, got {every!r}")
        self.keep_inputs = keep_inputs
        self.first_zero = first_zero
        self.every = every
        self.steps = self.watched = 0  # steps offered to step(), and steps watched (step() or with-blocks)
        self._owners = Owners(models)
        self.higher_order: dict[str, int] = {}
        self._tallies: dict[Site, _Tally] = {}
        self._by_output: dict[int, Site] = {}  # forward output storage -> its site, for the backward
        self._inputs: dict[int, torch.Tensor] = {}  # forward output storage -> the op's input, for the mass lost
        self._scaled: tuple[int, tuple, float] | None = None  # last x/c: (data_ptr, shape, c)
        self._compiled = CompiledRegions()
        self._zones: dict[tuple, float | None] = {}
        self._reduced = False
        self._depth = 0  # with-blocks of this monitor open now: only the outermost one watches
        self.learn = learn
        self._learnt = learnt_from._learnt if learnt_from is not None and learn else None  # weakrefs to site modules
        self._seen: dict[int, weakref.ref] | None = None  # this block's eager site modules (None: one ran outside)
        self._ops = 0  # ops this block dispatched (a block that ran nothing teaches nothing)
        self._sited: SiteWatch | None = None
        if compiled:
            ingraph.install()

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True  # let torch.compile run compiled code; its in-graph counters call the monitor

    def _open(self) -> None:
        self.watched += 1
        self._watcher = (threading.get_ident(), self._compiled_input)
        ingraph.WATCHERS.append(self._watcher)  # compiled caps' counters call it, mode or no mode
        self._ops, self._seen = 0, {}

    def _watch(self, modules: list) -> SiteWatch:
        return SiteWatch(self, modules, self._backward_counted)

    def _closed(self, sited: bool, exc: tuple) -> None:
        ingraph.WATCHERS.remove(self._watcher)
        self._learn(sited, raised=exc[0] is not None)
        self._by_output.clear()  # storages are reused: a later watched step must not pair with these
        self._inputs.clear()
        self._scaled = None

    def step(self):
        """One training step: watched when it is one of every ``every`` (the first, then each N-th), else untouched."""
        return one_step(self)

    def _learn(self, sited: bool, raised: bool) -> None:
        """After a block: watch only its site modules from the next one on, or every op again (a block that
        raised may have stopped before some of its caps: it teaches nothing)."""
        regions = self._compiled.entered > self._regions_before
        if sited:
            if regions and self._learnt:  # modules hooked, and compiled code ran: hooks must not sit in traced code
                self._learnt = None
        elif self.learn and not raised and self._seen is not None and self._ops and self._compiled.supported \
                and not self.higher_order and not any(s.model < 0 and not s.compiled for s in self._tallies):
            # compiled caps count themselves (their counters call the monitor): learnt when every cap was one
            if not regions or (not self._seen and any(s.compiled for s in self._tallies)):
                self._learnt = list(self._seen.values())
        self._seen = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self._ops += 1
        role = _ROLE.get(id(func))
        if role is not None and role[0] == "in place":  # read the input before the op overwrites it
            x = args[0]
            before = x.clone()
            out = func(*args, **(kwargs or {}))
            self._forward(role[1], before, out, (x.data_ptr(), tuple(x.shape)))
            return out
        out = func(*args, **(kwargs or {}))
        if role is None:
            if isinstance(func, HigherOrderOperator):
                self.higher_order[func.name()] = self.higher_order.get(func.name(), 0) + 1
        elif role[0] == "scale":
            self._note_scale(role[1], args, out)
        elif role[0] == "forward":
            self._forward(role[1], args[0], out, (args[0].data_ptr(), tuple(args[0].shape)))
        elif role[0] == "backward":
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

    def _forward(self, fn: str, x: torch.Tensor, y: torch.Tensor, where: tuple) -> None:
        """``x`` the op's input as it was (``where``: its storage and shape, matched with a division's output)."""
        cap = None
        if fn == "tanh" and self._scaled is not None and self._scaled[:2] == where:
            cap = self._scaled[2]
        inner, outer, where = call_site(sys._getframe(2))
        model, module = self._owners.owner(inner, outer)
        site = Site(model, module, where, fn, str(x.dtype).removeprefix("torch."), x.device.type, cap)
        tally = self._tallies.setdefault(site, _Tally())
        if self._sited is not None:
            self._sited.backward_of(y, site, x)
        else:
            self._by_output[y.data_ptr()] = site
            self._inputs[y.data_ptr()] = x
        if self._seen is not None:
            if inner is None:
                self._seen = None  # a cap outside any module: only the mode over every op sees it
            else:
                self._seen.setdefault(id(inner), weakref.ref(inner))
        if recomputing():
            tally.recomputed += 1
            return
        tally.calls += 1
        tally.count += y.numel()
        if y.numel() == 0:
            return
        tally.saturated = _add(tally.saturated, _stuck(fn, y))
        tally.max_abs = _largest(tally.max_abs, x)
        if self.keep_inputs:
            tally.inputs.append(x.detach().float().cpu().reshape(-1))

    def _backward(self, fn: str, grad_output: torch.Tensor, output: torch.Tensor, grad_input: torch.Tensor) -> None:
        site = self._by_output.get(output.data_ptr())
        if site is None:  # its forward ran outside the monitor
            site = Site(-1, "(forward not seen)", "(forward not seen)", fn, str(output.dtype).removeprefix("torch."),
                        output.device.type, None)
        self._backward_counted(site, grad_output, grad_input, self._inputs.get(output.data_ptr()))

    def _backward_counted(self, site: Site, grad_output: torch.Tensor, grad_input: torch.Tensor,
                          x: torch.Tensor | None = None) -> None:
        tally = self._tallies.setdefault(site, _Tally())
        tally.backward_calls += 1
        tally.backward_count += grad_input.numel()
        tally.zero_grad = _add(tally.zero_grad, _zero_grads(grad_output, grad_input))
        if x is not None and x.shape == grad_input.shape and grad_output.shape == grad_input.shape:
            lost, mass = _lost_mass(site.fn, x, grad_output, grad_input)
            tally.lost, tally.mass = _add(tally.lost, lost), _add(tally.mass, mass)

    def _first_zero(self, path: str, dtype: str, cap: float | None, fn: str) -> FirstZero:
        key = (path, dtype, cap, fn)
        if key not in self._zones:
            # A live lookup takes gradients (and may compile); inside a compiled region's forward the thread runs
            # below autograd with dynamo off, so the lookup runs in a thread of its own, with torch's defaults.
            found: list = []
            worker = threading.Thread(target=lambda: found.append(self.first_zero(path, dtype, cap or 1.0, fn)))
            worker.start()
            worker.join()
            self._zones[key] = found[0] if found else FirstZero(None, "the lookup failed")
        return self._zones[key]

    def _compiled_input(self, a: torch.Tensor, fn: str, below: str, where: str, cap: float) -> None:
        """A cap inside compiled code: its input ``a`` against the compiled path's first zero (|a| ≥ it: dead)."""
        if recomputing() or fn == "softplus" or fn.startswith("router:"):  # gates, not caps (GateMonitor's)
            return
        fn = "sigmoid" if fn == "sigmoid·x" else fn  # every sigmoid is counted here, as eagerly
        model, module, where = compiled_site(sys._getframe(2), self._owners, below, where)
        dtype, device = str(a.dtype).removeprefix("torch."), a.device.type
        site = Site(model, module, where, fn, dtype, device, cap or None, compiled=True)
        tally = self._tallies.setdefault(site, _Tally())
        tally.calls += 1
        tally.count += a.numel()
        if a.numel() == 0:
            return
        tally.max_abs = _largest(tally.max_abs, a)
        edge = self._first_zero(path_name(device, compiled=True), dtype, site.cap, fn).value
        if edge is not None:
            tally.dead = _add(tally.dead, _past(a.detach(), edge))

    # -- many ranks

    def all_reduce(self, group=None, timeout: float = 60.0) -> None:
        """Sum the counts over a torch.distributed process group (a collective: every rank calls it once, at
        report time); afterwards ``rows()``, ``table()`` and ``report()`` give the totals on every rank.

        The ranks first check through the group's store that all of them called it: a rank still missing
        after ``timeout`` seconds is named in one line (a RuntimeError), instead of a hang until the process
        group's own timeout."""
        if self._reduced:
            raise RuntimeError("all_reduce() was already called: these counts are the sum over the ranks")
        self._tallies = {Site(-1, *key): tally for key, tally in ranks.sum_over_ranks(
            {site: (self._owners.qualifier(site.model), t.totals()) for site, t in self._tallies.items()},
            group, timeout).items()}
        self._by_output = {}
        self._reduced = True

    # -- results

    @property
    def sites_only(self) -> bool:
        """Whether the next watched step watches only the modules where an earlier one found every cap."""
        return self._learnt is not None

    @property
    def compiled_regions(self) -> int:
        return self._compiled.entered

    def hidden(self) -> str | None:
        """One line naming what ran inside the monitor and was not counted, if anything."""
        if not self._compiled.supported:
            return "this torch offers no way to see whether compiled regions ran; any tanh inside one was not counted"
        parts = []
        n = self._compiled.entered
        if n and not any(site.compiled for site in self._tallies):
            parts.append(f"{n} compiled region{'s' if n != 1 else ''} ran with no in-graph counter (compiled before "
                         "a monitor existed, or not by inductor): their tanh and sigmoid were not counted")
        if self.higher_order:
            parts.append(", ".join(f"{k} ×{v}" for k, v in sorted(self.higher_order.items())) +
                         " ran: a score_mod inside such a kernel (flex_attention) is not counted")
        return "; ".join(parts) or None

    def inputs(self, site: Site) -> torch.Tensor:
        """Every recorded input of a site, flattened, fp32 on the CPU (``keep_inputs=True``)."""
        parts = self._tallies[site].inputs
        return torch.cat(parts) if parts else torch.empty(0)

    def sites(self) -> list[Site]:
        return list(self._tallies)

    def rows(self) -> list[SiteRow]:
        rows = []
        for site, t in self._tallies.items():
            path = path_name(site.device, site.compiled)
            stack = self._first_zero(path, site.dtype, site.cap, site.fn)
            calls, recomputed, count, saturated, dead, largest, backward_calls, backward_count, zero_grad, lost, mass \
                = t.totals()
            if not site.compiled:
                saturated = saturated or 0
                dead = saturated  # eager backward 1 − y² (σ(1 − σ)) from the stored output: 0 exactly there
            elif dead is None and stack.value is not None:
                dead = 0
            largest = largest or 0.0
            qualifier = self._owners.qualifier(site.model)
            rows.append(SiteRow(
                module=f"{qualifier}/{site.module}" if qualifier else site.module, site=site.site, fn=site.fn,
                dtype=site.dtype, path=path, cap=site.cap, calls=calls, recomputed=recomputed, count=count,
                saturated=saturated, dead=dead, backward_count=backward_count,
                zero_grad=None if backward_calls == 0 else zero_grad,
                max_abs=largest if site.cap is None or site.compiled else site.cap * largest,
                max_abs_input=largest, first_zero_grad_input=stack.value, source=stack.source,
                saturated_fraction=None if saturated is None else saturated / count if count else 0.0,
                dead_fraction=None if dead is None else dead / count if count else 0.0,
                mass_lost=None if mass is None else lost / mass if mass else 0.0,
            ))
        return rows

    def report(self) -> Report:
        return rows_report([asdict(r) for r in self.rows()], self.hidden(),
                           {"compiled_regions": self.compiled_regions, "steps_watched": self.watched,
                            "all_reduced": self._reduced})

    def table(self, width: int = 100, wide: bool = False) -> str:
        """The report as text, as the command line prints it."""
        from rich.console import Console

        buffer = io.StringIO()
        render_table(self.report(), Console(file=buffer, width=width), wide=wide)
        return buffer.getvalue()
