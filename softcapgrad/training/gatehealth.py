"""GateMonitor: how open each gate of a model is, step after step, and where its gradient is exactly 0.

softmax-softplus-gates.md §5–6: a sigmoid gate's backward g·σ(1 − σ) is read from the stored output, a
softplus gate's g·σ(x) from the input, a softmax router's p ⊙ (u − ⟨u, p⟩) from the stored output. A
``TorchDispatchMode`` sees ``aten.sigmoid``, ``aten.softplus`` and ``aten._softmax`` with their backward
ops, in the format they really ran in (below autocast). Per gate site and watched step it counts

    closed      elements below 1e-3 of the gate's range (σ and softmax: y < 1e-3; softplus, which has no top:
                y < 1e-3 of a unit gate), as real numbers in every format and size (gaterows.closed_below)
    saturated   elements stored as exactly the value the function only approaches (σ, softmax: 0 or 1;
                softplus: 0)
    zero_grad   elements whose backward returned exactly 0 under a non-zero upstream gradient; again after the
                casts back to the layer feeding the gate, where the weights see it (gatecount.casts_back)
    mean        the mean gate, summed in float64

A site whose mean fell 20 %, or closed share rose 0.01, from its first window to its last is closing (gaterows.trend).

What counts as a gate follows the census (softcapgrad.models.contracts): a sigmoid multiplied by its own
input (x·σ(αx): QuickGELU and friends) is an activation and is left out; a softmax is a router only when
its output feeds a top-k (attention's softmax never does). ``first_zero(fn, dtype, device, upstream)`` gives
each row the input from which the site's gradient is exactly 0 with the gate stuck open (σ stored as 1.0) and
stuck shut, under the upstream gradient the site received (gaterows.upstream_median);
``softcapgrad.stacks.watch.GateMonitor`` looks them up in the measured gate stacks.

Compiled code: a gate inside a compiled region runs inside generated kernels the mode does not see. The
in-graph counters of softcapgrad.training.ingraph (a pre-grad pass the monitor installs: create it before
the model compiles) hand each compiled sigmoid's, softplus's and router softmax's input to the monitor,
which counts the gate from it (its output recomputed in the gate's format as the kernel computes it: a 16-bit
format in fp32, rounded to it; a router's softmax over its dimension in its dtype); their backward runs in
generated code, so those rows have no zero-gradient share.
Regions compiled before the pass are not counted, and the report says so in one line (``hidden``).
"""

from __future__ import annotations

import io
import sys
import threading
import weakref
from dataclasses import asdict
from typing import Callable

import torch
from torch.overrides import TorchFunctionMode

from softcapgrad.core.report import Report, render_table
from softcapgrad.training import ingraph
from softcapgrad.training.attribution import CompiledRegions, Owners, call_site, compiled_site, one_step, recomputing
from softcapgrad.training.gatecalls import GateCalls
from softcapgrad.training.gategraph import FeedProbe, GraphWatch, graph_watch, unseen
from softcapgrad.training.sited import SitedMode, SiteWatch
from softcapgrad.training.gaterows import (  # noqa: F401 -- GateZero and the lookup's shape: addressed here too
    GateRow, GateSite, GateZero, GateZeroLookup, Step, WINDOWS, compiled_note, gate_report, looked_up,
    lower_median, no_gate_lookup, trend,
)
from softcapgrad.training.gatecount import (Later, casts_back, compiled_output, count_backward, count_forward, small,
                                              step_of)
from softcapgrad.training.gateheads import head_count, merge, module_named, per_head

aten = torch.ops.aten
FORWARD = {aten.sigmoid.default: "sigmoid", aten.sigmoid_.default: "sigmoid", aten.softplus.default: "softplus",
           aten._softmax.default: "softmax"}
BACKWARD = {aten.sigmoid_backward.default: "sigmoid", aten.softplus_backward.default: "softplus",
            aten._softmax_backward_data.default: "softmax"}
NODES = ("SigmoidBackward", "SoftplusBackward", "SoftmaxBackward")  # their autograd nodes, for a sited step
CHOOSERS = {aten.topk.default, aten.sort.default, aten.sort.stable, aten.argsort.default, aten.argsort.stable,
            aten.max.dim}
SCALERS = {aten.mul.Tensor, aten.div.Tensor}
_ROLE = {id(op): ("forward", fn) for op, fn in FORWARD.items()} | {id(op): ("backward", fn) for op, fn in BACKWARD.items()} \
    | {id(op): ("choose", "") for op in CHOOSERS} | {id(op): ("mul", "") for op in SCALERS}


class GateMonitor(SitedMode):
    """Wrap a forward and backward (or ``with monitor.step():`` each training step, one in ``every``);
    ``rows()`` / ``report()`` / ``table()`` give one row per gate site, as DeadZoneMonitor does for caps.

    ``only=predicate(module, fn)`` keeps the sites it accepts (audit-model passes the census's gate sites).
    Nothing in the monitored code changes: forward and backward values are bit-identical with and without it."""

    supports_higher_order_operators = True  # flex_attention and friends pass through (no gate runs inside them)

    def __init__(self, first_zero: GateZeroLookup = no_gate_lookup, models: dict[str, torch.nn.Module] | None = None,
                 every: int = 1, window: int = 1, only: Callable[[str, str], bool] | None = None,
                 learn: bool = True) -> None:
        super().__init__()
        for name, v in (("every", every), ("window", window)):
            if not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
                raise ValueError(f"{name} must be a whole number ≥ 1, got {v!r}")
        self.first_zero, self.every, self.window, self.only = first_zero, every, window, only
        self.steps = self.watched = 0
        self._owners = Owners(models)
        self._history: dict[GateSite, list[tuple]] = {}
        self._ranges: dict[GateSite, list[float]] = {}
        self._upstream: dict[GateSite, list[float]] = {}  # each backward call's upstream_median (gaterows.py)
        self._block: dict[GateSite, Step] = {}
        self._by_output: dict[int, GateSite] = {}  # σ / softmax output storage (softplus: input) -> its site
        self._own_input: dict[int, tuple] = {}  # σ output storage -> (its site, its input storages, the inputs kept
        # alive until the output's first product, so that no other tensor takes their storage meanwhile)
        self._scaled: dict[int, int] = {}  # output of a product with a number -> the other factor's storage
        self._softmax: dict[int, tuple] = {}  # softmax outputs not yet known to feed a top-k: (site, shape, input)
        self.activations: set[tuple] = set()  # (module, site): x·σ(αx), not gates
        self.routers: set[GateSite] = set()
        self._zones: dict[tuple, GateZero] = {}
        self._casts: dict[GateSite, tuple] = {}  # the formats a sigmoid or softplus site's gradient is cast back to
        self._heads: dict[GateSite, int | None] = {}  # H of a per-head gate; its per-head sums over the steps:
        self._per_head: dict[GateSite, list] = {}
        self._compiled = CompiledRegions()
        self._depth = 0
        self.held = False  # True: with-blocks add up to one step until end_step() (a Trainer's micro-batches)
        self.learn = learn
        self._learnt: list[weakref.ref] | None = None  # the modules whose own code ran every gate (None: not learnt)
        self._seen: dict[int, weakref.ref] | None = None  # this block's gate modules (None: a gate ran outside one)
        self._sited: SiteWatch | None = None
        self._calls = GateCalls(self)
        self._calls_ok: bool | None = None  # whether _GateCalls saw every gate a sited step counted (None: not asked)
        self._feeds: dict | None = None  # each gate's (module, feeding child, path), when a probe found them all
        self.unfound = 0  # gate calls the watch with no mode did not find by their node (not counted)
        self._probe: FeedProbe | None = None
        self._graph: GraphWatch | None = None
        self._later = Later()  # small gates' calls, counted when the block closes
        self.compiled_sites: set[GateSite] = set()  # sites counted from inside compiled code
        ingraph.install()

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True  # compiled regions run compiled (uncounted, and said so), never traced through the mode

    def _open(self) -> None:
        self.watched += not self.held
        self._seen = {}
        self._watcher = (threading.get_ident(), self._compiled_gate)
        ingraph.WATCHERS.append(self._watcher)  # compiled gates' counters call it, mode or no mode

    def _watch(self, modules: list) -> SiteWatch | GraphWatch:
        self._graph = graph_watch(self, self._feeds)  # the gates' own nodes: no mode at all (gategraph.py)
        if self._graph is not None:
            return self._graph
        if self._calls_ok:  # the torch calls of the gate modules' own code: the cheaper watch
            self._calls.watch(routers=bool(self.routers))
            return SiteWatch(self._calls, modules, self._backward_counted, NODES, TorchFunctionMode, children=False)
        # the dispatch mode there; the first such step also asks whether the cheaper watch sees it all
        self._calls.probe = set() if self._calls_ok is None else None
        watch = SiteWatch(self, modules, self._backward_counted, NODES,
                          also=self._calls if self._calls.probe is not None else None)
        if self._calls.probe is not None:  # and whether the gates' nodes can be found with no mode
            self._probe = FeedProbe(modules)
        return watch

    def _closed(self, sited: bool, exc: tuple) -> None:
        ingraph.WATCHERS.remove(self._watcher)
        with unseen():  # an outer mode (a DeadZoneMonitor around this block, say) must not see the counting
            changed = self._later.flush(self._count, self._backward_counted)  # inputs changed in place: not counted
        self._learn(sited, raised=exc[0] is not None)
        probe, self._calls.probe = self._calls.probe, None
        fed, graph, self._probe, self._graph = self._probe, self._graph, None, None
        self._calls.unwatch()
        for hooks in (fed, graph):
            if hooks is not None:
                hooks.close()
        if probe is not None and self._learnt is not None and exc[0] is None:
            self._calls_ok = all(site in probe for site, s in self._block.items() if s.count)
            self._feeds = fed.feeds(site for site, s in self._block.items() if s.count) if fed else None
        if self._learnt is None:
            self._calls_ok = self._feeds = None
        elif graph is not None and graph.missed + changed:
            self.unfound, self._feeds = self.unfound + graph.missed + changed, None
        if not self.held:
            self.end_step()
        self._by_output.clear()
        self._own_input.clear()
        self._scaled.clear()
        self._softmax.clear()

    def _learn(self, sited: bool, raised: bool) -> None:
        """After a block over every op: watch only its gate modules' own code from the next block on (the
        backward through the gates' autograd nodes), unless it raised or ran a gate outside a module; a block of
        compiled code with no eager gate leaves nothing to watch, and eager gates beside compiled code keep the mode
        over every op (hooks must not sit in code dynamo traces)."""
        compiled = self._compiled.entered > self._regions_before
        if sited:
            if compiled and self._learnt:  # modules hooked, and compiled code ran: hooks must not sit in traced code
                self._learnt = None
        elif self.learn and not raised and self._seen is not None and (self._seen if not compiled else not self._seen):
            self._learnt = list(self._seen.values())  # compiled code and no eager gate: nothing to watch (the
            # compiled regions are still named in one line)
        self._seen = None

    @property
    def sites_only(self) -> bool:
        """Whether the next watched step watches only the modules where an earlier one found every gate."""
        return self._learnt is not None

    def end_step(self) -> None:
        """Close the watched step: its sums become one entry of each site's history."""
        self.watched += self.held
        for site, s in self._block.items():
            if s.count or s.backward:
                self._history.setdefault(site, []).append(
                    (s.count, s.closed, s.saturated, s.backward, s.zero, s.total / s.count if s.count else 0.0, s.zero_cast))
                r = self._ranges.setdefault(site, [s.low, s.high])
                r[0], r[1] = min(r[0], s.low), max(r[1], s.high)
                self._per_head[site] = merge(self._per_head.get(site), s.heads)
                self._upstream.setdefault(site, []).extend(s.upstream)
        self._block = {}

    def step(self):
        """One training step: watched when it is one of every ``every`` (the first, then each N-th)."""
        return one_step(self)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        role = _ROLE.get(id(func))
        x = args[0] if role is not None and role[0] == "forward" else None
        before = (x.data_ptr(), x.clone() if func is aten.sigmoid_.default else x) if x is not None else None
        out = func(*args, **(kwargs or {}))
        if role is None:
            return out
        kind, fn = role
        if kind == "forward":
            self._forward(fn, before[1], out, before[0])
        elif kind == "backward":
            self._backward(fn, args, out)
        elif kind == "choose":
            self._choose(args[0])
        else:
            self._mul(args, out)
        return out

    # -- recording

    def _site(self, fn: str, x: torch.Tensor) -> tuple[GateSite, torch.nn.Module | None]:
        inner, outer, where = call_site(sys._getframe(3))
        model, module = self._owners.owner(inner, outer)
        return GateSite(model, module, where, fn, str(x.dtype).removeprefix("torch."), x.device.type), inner

    def _saw(self, inner: torch.nn.Module | None) -> None:
        if self._seen is not None:
            if inner is None:
                self._seen = None  # a gate outside any module: only the mode over every op sees it
            else:
                self._seen.setdefault(id(inner), weakref.ref(inner))

    def _after(self, site: GateSite, y: torch.Tensor, x: torch.Tensor) -> None:
        """Pair the backward of the gate whose output is ``y`` with its site: by storage, or (sited) by its node."""
        if self._sited is not None:
            self._sited.backward_of(y, site, x)
        else:
            self._by_output[x.data_ptr() if site.fn == "softplus" else y.data_ptr()] = site

    def _forward(self, fn: str, x: torch.Tensor, y: torch.Tensor, x_ptr: int) -> None:
        site, inner = self._site(fn, x)
        if (site.module, site.site) in self.activations or (self.only is not None and not self.only(site.module, fn)):
            return
        if recomputing():  # a forward replayed inside the backward (checkpointing): counted when it first ran; the
            if fn != "softmax" or site in self.routers:  # backward reads this output, so it is paired with this one
                self._after(site, y, x)
            return
        if fn == "softmax":  # a router only once a top-k reads it: counted then
            if site in self.routers:
                self._saw(inner)
                self._count(site, x, y)
                self._after(site, y, x)
            else:
                self._softmax[y.data_ptr()] = (site, tuple(y.shape), x, inner)
            return
        self._saw(inner)
        self._after(site, y, x)
        if self._probe is not None:
            self._probe.saw(site, inner, x, y)
        if site not in self._casts and x.grad_fn is not None:
            self._casts[site] = casts_back(x)
        if fn == "sigmoid" and not self._calls.watching:  # activations are told apart while the ops are watched
            self._own_input[y.data_ptr()] = (site, {x_ptr, self._scaled.get(x_ptr, x_ptr)}, x)
        self._count(site, x, y)

    def _count(self, site: GateSite, x: torch.Tensor, y: torch.Tensor) -> None:
        if site not in self._heads:  # once per site: whether its gate is per head (gateheads.py)
            self._heads[site] = head_count(module_named(self._owners, site.model, site.module), site.fn, y.shape[-1])
        count_forward(step_of(self._block, site), site.fn, x, y, self._heads[site])  # which detaches what it reduces

    def _count_soon(self, site: GateSite, x: torch.Tensor, output: Callable) -> int | None:
        """Count y = output(x) now, or (a small gate) when the block closes: then a token for its backward."""
        if small(x):
            return self._later.forward(site, x, output(x))
        self._count(site, x, output(x))
        return None

    def _backward_soon(self, site: GateSite, grad_output: torch.Tensor, grad_input: torch.Tensor,
                       token: int | None) -> None:
        if small(grad_input):
            self._later.backward(site, grad_output, grad_input, token)
        else:
            self._backward_counted(site, grad_output, grad_input)

    def _compiled_gate(self, a: torch.Tensor, fn: str, below: str, where: str, cap: float) -> None:
        """A gate inside compiled code, counted from its input ``a`` (x·σ(αx) arrives as "sigmoid·x": left out)."""
        if not (fn in ("sigmoid", "softplus") or fn.startswith("router:")) or recomputing():
            return
        router = fn.split(":") if fn.startswith("router:") else None
        fn = "softmax" if router else fn
        model, module, where = compiled_site(sys._getframe(2), self._owners, below, where)
        site = GateSite(model, module, where, fn, str(a.dtype).removeprefix("torch."), a.device.type)
        if self.only is not None and not self.only(site.module, fn):
            return
        x = a.detach()
        self.compiled_sites.add(site)
        if router:  # the router's softmax as the graph asked for it: its dimension and dtype
            self.routers.add(site)
            dtype = getattr(torch, router[2]) if router[2] else None
            self._count(site, x, torch.softmax(x, int(router[1]), dtype=dtype))
            return
        self._count(site, x, compiled_output(fn, x.dtype)(x))

    def _choose(self, t) -> None:
        if not isinstance(t, torch.Tensor):
            return
        found = self._softmax.pop(t.data_ptr(), None)
        if found is not None and found[1] == tuple(t.shape):
            site = found[0]
            self.routers.add(site)
            self._saw(found[3])
            self._count(site, found[2], t)
            self._after(site, t, found[2])

    def _mul(self, args, out) -> None:
        a, b = (args + (None,))[:2]
        if not isinstance(a, torch.Tensor) or not isinstance(out, torch.Tensor):
            return
        if torch._C._current_graph_task_id() != -1:
            return  # the backward's products: an activation is told apart in the forward
        if not isinstance(b, torch.Tensor) or b.dim() == 0:  # a product with a number: remember its factor
            self._scaled[out.data_ptr()] = a.data_ptr()
            return
        for gate, other in ((a, b), (b, a)):
            found = self._own_input.pop(gate.data_ptr(), None)  # its first product decides
            if found is not None and other.data_ptr() in found[1]:  # x·σ(αx): an activation
                site = found[0]
                self.activations.add((site.module, site.site))
                self._block.pop(site, None)
                self._history.pop(site, None)
                self._upstream.pop(site, None)

    def _backward(self, fn: str, args, grad_input: torch.Tensor) -> None:
        site = self._by_output.get(args[1].data_ptr())
        if site is None or (fn == "softmax" and site not in self.routers):
            return
        self._backward_counted(site, args[0], grad_input)

    def _backward_counted(self, site: GateSite, grad_output: torch.Tensor, grad_input: torch.Tensor, x=None) -> None:
        if (site.module, site.site) in self.activations:
            return
        count_backward(step_of(self._block, site), site.fn, grad_output, grad_input, self._casts.get(site, ()))

    # -- results

    def hidden(self) -> str | None:
        unfound = self.unfound and (f"{self.unfound} gate call{'s' if self.unfound != 1 else ''} of a watched step "
                                    "went uncounted (another code path than the one learnt ran, or the gate's input "
                                    "changed in place before the step ended); later steps watch the calls")
        compiled = compiled_note(self._compiled.entered, bool(self.compiled_sites))
        return "; ".join(s for s in (compiled, unfound) if s) or None

    def _zone(self, fn: str, dtype: str, device: str, upstream: float = 1.0) -> GateZero:
        key = (fn, dtype, device, upstream)
        if key not in self._zones:
            self._zones[key] = looked_up(self.first_zero, *key)
        return self._zones[key]

    def trend(self, history: list[tuple]) -> str:
        return trend(history, self.window)

    def rows(self) -> list[GateRow]:
        rows = []
        for site, history in self._history.items():
            count, closed, saturated, backward, zero, _, zero_cast = (sum(h[i] for h in history) for i in range(7))
            mean = sum(h[0] * h[5] for h in history) / count if count else 0.0
            upstream = lower_median(self._upstream.get(site, ()))
            zone = self._zone(site.fn, site.dtype, site.device, 1.0 if upstream is None else upstream)
            qualifier = self._owners.qualifier(site.model)
            low, high = self._ranges[site]
            rows.append(GateRow(
                module=f"{qualifier}/{site.module}" if qualifier else site.module, site=site.site, fn=site.fn,
                dtype=site.dtype, steps=len(history), count=count, closed_share=closed / count if count else 0.0,
                saturated_share=saturated / count if count else 0.0,
                zero_grad_share=zero / backward if backward else None, mean_gate=mean, trend=self.trend(history),
                zero_grad_cast_share=zero_cast / backward if backward and self._casts.get(site) else None,
                stuck_open_from=zone.open_from, stuck_shut_from=zone.shut_from, upstream=upstream, min_input=low,
                max_input=high,
                source=zone.source, per_step=tuple(history), per_head=per_head(self._per_head.get(site), count)))
        return rows

    def report(self) -> Report:
        return gate_report([asdict(r) for r in self.rows()], self.hidden(), {"steps_watched": self.watched,
                                                                             "window": self.window})

    def table(self, width: int = 100, wide: bool = False) -> str:
        from rich.console import Console

        buffer = io.StringIO()
        render_table(self.report(), Console(file=buffer, width=width), wide=wide)
        return buffer.getvalue()
