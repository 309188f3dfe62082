"""``DeadZoneCallback``: the dead-zone monitor in a transformers ``Trainer``, logged like the loss.

Every ``every`` optimizer steps (the first, then each N-th) the callback watches one step (all of its
micro-batches) with ``softcapgrad.DeadZoneMonitor`` (from the second watched step on, only in the
modules where the first one found caps) and asks the Trainer to log right after it. The
figures go into the Trainer's own log (``state.log_history`` and whatever ``report_to`` reports to:
TensorBoard, W&B, ...): one per cap site, ``dead_zone/<module>/<fn>`` (``<module>:<line>`` when a
module has several sites), the fraction of the site's elements past its path's first zero-gradient
input, and ``dead_zone/total`` over all sites. Under torch.distributed the counts are summed over
the ranks first (``monitor.all_reduce()``, a collective every rank reaches at the same step).

The monitor is active only inside the Trainer's ``training_step`` of a watched step (the callback wraps
that method of the Trainer it runs in, from train begin to train end), in a with-block: a step that
raises leaves no monitor behind, and a forward run outside the training step is never counted.

The values are added to the Trainer's log in this callback's ``on_log``, which it puts first among
the Trainer's callbacks at train begin (the reporting integrations come before user callbacks
otherwise, and would log without them). ``patch=True`` runs the model's tanh and sigmoid with the
fp32 backward (``softcapgrad.patch``) from train begin to train end; the fractions then still count
elements past the eager path's first zero, which the patch's gradient no longer drops.

``gates=True`` also watches the same steps with ``softcapgrad.GateMonitor`` (one for the whole run, so
that its windows see the drift): per gate site ``gates/<module>/<fn>/closed``, ``…/zero_grad`` and
``…/mean`` of the watched step, and ``gates/closing``, the number of sites closing (first window to last)
(``gate_window`` watched steps each).
"""

from __future__ import annotations

import contextlib
import functools
import sys

from transformers import TrainerCallback
from transformers.trainer_callback import CallbackHandler

from softcapgrad.stacks.watch import DeadZoneMonitor, GateMonitor

PREFIX = "dead_zone/"
GATES = "gates/"


def gate_figures(monitor: GateMonitor) -> dict[str, float]:
    """``gates/<module>/<fn>/closed|zero_grad|mean`` of the last watched step, and ``gates/closing``."""
    out = {}
    rows = monitor.rows()
    for r in rows:
        if r.steps != monitor.watched:
            continue  # the site did not run in the last watched step
        count, closed, _, backward, zero, mean, zero_cast = r.per_step[-1]
        name = f"{GATES}{r.module}/{r.fn}"
        out[f"{name}/closed"] = closed / count if count else 0.0
        if backward:
            out[f"{name}/zero_grad"] = zero / backward
            if r.zero_grad_cast_share is not None:  # the gradient cast back to the layer's format
                out[f"{name}/zero_grad_cast"] = zero_cast / backward
        out[f"{name}/mean"] = mean
    if rows:
        out[GATES + "closing"] = float(sum(r.trend == "closing" for r in rows))
    return out


def fractions(rows) -> dict[str, float]:
    """``dead_zone/<site>`` → the fraction of its elements past the first zero, and ``dead_zone/total``."""
    rows = [r for r in rows if r.dead is not None and r.count]
    per_module: dict[str, int] = {}
    for r in rows:
        per_module[(r.module, r.fn)] = per_module.get((r.module, r.fn), 0) + 1
    out = {}
    for r in rows:
        name = f"{r.module}/{r.fn}"
        if per_module[(r.module, r.fn)] > 1:  # several sites in one module: each by its line
            name += f":{r.site.rsplit(':', 1)[-1]}"
        out[PREFIX + name] = r.dead / r.count
    count = sum(r.count for r in rows)
    if count:
        out[PREFIX + "total"] = sum(r.dead for r in rows) / count
    return out


class DeadZoneCallback(TrainerCallback):
    """Watch one optimizer step in ``every`` and log its dead-zone fractions through the Trainer."""

    def __init__(self, every: int = 100, patch: bool = False, gates: bool = False, gate_window: int = 1,
                 **monitor_options) -> None:
        if not (isinstance(every, int) and every >= 1):
            raise ValueError(f"every must be a whole number ≥ 1, got {every!r}")
        self.every = every
        self.patch = patch
        self.options = monitor_options
        self.gates = GateMonitor(window=gate_window) if gates else None  # one for the run: it keeps the history
        if self.gates is not None:
            self.gates.held = True  # a step's micro-batches are one watched step
        self.monitor: DeadZoneMonitor | None = None  # the monitor of the step being watched (or last watched)
        self.pending: dict[str, float] = {}
        self._patched = None
        self.last: DeadZoneMonitor | None = None  # the last watched step's monitor, for its table
        self._trainer = None  # the Trainer whose training_step this callback wraps (None: enter at step begin)
        self._entered = False  # the fallback without a Trainer: the monitor entered at step begin

    # -- order: first among the Trainer's callbacks, so that the integrations log what this one adds

    def _first(self):
        """Put this callback first in the handler running it; the Trainer that runs the handler, if found."""
        frame = sys._getframe(1)
        while frame is not None:
            handler = frame.f_locals.get("self")
            if isinstance(handler, CallbackHandler) and self in handler.callbacks:
                handler.callbacks = [self] + [c for c in handler.callbacks if c is not self]  # a new list: the
                break  # loop running this event goes on over the old one
            frame = frame.f_back
        while frame is not None:
            trainer = frame.f_locals.get("self")
            if getattr(trainer, "callback_handler", None) is handler and callable(getattr(trainer, "training_step", 0)):
                return trainer
            frame = frame.f_back
        return None

    def _watched_step(self, training_step):
        while getattr(training_step, "watched_by", None) is self:  # left by a run that raised
            training_step = training_step.__wrapped__

        @functools.wraps(training_step)
        def step(*args, **kwargs):
            if self.monitor is None:
                return training_step(*args, **kwargs)
            gates = self.gates if self.gates is not None else contextlib.nullcontext()
            with self.monitor, gates:  # exits on every path, a raising step included
                return training_step(*args, **kwargs)

        step.watched_by = self
        return step

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.monitor, self.pending = None, {}  # nothing armed by a run that raised
        self._trainer = self._first()
        if self._trainer is not None:
            self._trainer.training_step = self._watched_step(self._trainer.training_step)
        if self.patch and model is not None:
            from softcapgrad.training.fp32grad import patch

            self._patched = patch(model)

    def on_train_end(self, args, state, control, **kwargs):
        self._stop()
        if self._trainer is not None:
            wrapped = self._trainer.training_step.__wrapped__
            if getattr(wrapped, "__self__", None) is self._trainer and wrapped.__func__ is type(self._trainer).training_step:
                del self._trainer.training_step  # the class's own method again
            else:
                self._trainer.training_step = wrapped
            self._trainer = None
        if self._patched is not None:
            self._patched.remove()
            self._patched = None

    # -- one step in N

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step % self.every == 0 and self.monitor is None:
            self.monitor = DeadZoneMonitor(**self.options, learnt_from=self.last)  # the sites the last one found
            if self._trainer is None:
                self._entered = True
                self.monitor.__enter__()
                if self.gates is not None:
                    self.gates.__enter__()

    def on_step_end(self, args, state, control, **kwargs):
        if self._stop():
            control.should_log = True

    def _stop(self) -> bool:
        monitor, self.monitor = self.monitor, None
        if monitor is None:
            return False
        if self._entered:
            self._entered = False
            if self.gates is not None:
                self.gates.__exit__(None, None, None)
            monitor.__exit__(None, None, None)
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            monitor.all_reduce()
        self.pending = fractions(monitor.rows())
        if self.gates is not None:
            self.gates.end_step()
            self.pending.update(gate_figures(self.gates))
        self.last = monitor
        return True

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not self.pending:
            return
        if logs is not None:
            logs.update(self.pending)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(self.pending)  # the Trainer put a copy of the logs there
        self.pending = {}


class TetherCallback(TrainerCallback):
    """Steps the spring of ``softcapgrad.patch(model, gates="tether")`` after each optimizer step of a Trainer.

    ``TetherCallback(patch)``, the patch made before the Trainer builds its optimizer (so θ is in it): after each
    optimizer step (``on_optimizer_step``, before the scheduler moves the lr on) the spring runs with k = lr·wd, lr
    the one that step used in the optimizer's group holding the gates' θ. ``wd``, ``g_target`` and ``anchor`` are
    TetherPatch.step's (default: each gate held at its own opening on the first training batch)."""

    def __init__(self, patch, wd: float | None = None, g_target: float | None = None,
                 anchor: str | None = None) -> None:
        self.patch, self.options = patch, {"g_target": g_target, "anchor": anchor}
        if wd is not None:
            self.options["wd"] = wd

    def _lr(self, optimizer) -> float:
        theta = {id(g.theta) for g in self.patch.gates}
        for group in getattr(optimizer, "param_groups", ()):
            if any(id(p) in theta for p in group["params"]):
                return float(group["lr"])
        raise ValueError("the optimizer holds no tether gate's θ: patch the model before the Trainer builds its "
                         "optimizer")

    def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        self.patch.step(state.global_step + 1, self._lr(optimizer), **self.options)  # the step just taken
