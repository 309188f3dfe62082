"""Where a monitored op ran: the module that called it, its model, its call site, whether autograd is
replaying it (gradient checkpointing), and which compiled regions ran; and the shape of the first-zero
lookup the monitor is handed (softcapgrad.stacks.watch gives the real-stack table's).

Attribution walks the Python stack at the op: the innermost ``nn.Module`` being called and the first
frame outside torch (file:line). A forward op that runs while autograd runs a backward is a replay.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import weakref
from dataclasses import dataclass
from typing import Callable

import torch

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
# the monitor's own frames (another monitor's dispatch, the in-graph counter's) are never a call site
_OWN = {os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py") for name in ("monitor", "attribution", "gatehealth", "gatecalls")}
_CALL = torch.nn.Module._call_impl.__code__
WRAPPERS = ("OptimizedModule", "DistributedDataParallel")


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


@contextlib.contextmanager
def one_step(monitor):
    """A monitor's ``step()``: the step watched (the monitor entered) when it is one of every ``monitor.every``
    (the first, then each N-th), else untouched; ``monitor.steps`` counts the steps offered."""
    watch = monitor.steps % monitor.every == 0
    monitor.steps += 1
    if not watch:
        yield False
        return
    with monitor:
        yield True


# --- where an op was called from ---------------------------------------------------------------


def short_file(filename: str) -> str:
    """A file relative to the import path entry holding it (site-packages, the project), else its name."""
    where = (os.getcwd(), sys.path)
    if _SHORT_FOR[0] != where[0] or _SHORT_FOR[1] != where[1]:  # a relative entry or the path changed: learn again
        _SHORT.clear()
        _SHORT_FOR[:] = [where[0], list(where[1])]
    short = _SHORT.get(filename)
    if short is None:
        best = ""
        for entry in sys.path:
            entry = os.path.join(os.path.abspath(entry or "."), "")
            if filename.startswith(entry) and len(entry) > len(best):
                best = entry
        short = _SHORT[filename] = filename[len(best):] if best else os.path.basename(filename)
    return short


_SHORT: dict[str, str] = {}  # file -> its short name, for the working directory and import path in _SHORT_FOR
_SHORT_FOR: list = [None, None]


def compiled_site(frame, owners, below: str, where: str) -> tuple[str, str, str]:
    """(model, module, file:line) of a site inside compiled code, from the in-graph counter's module path ``below``
    and traced ``where``, the region run by the module whose call is below ``frame``."""
    inner, outer, _ = call_site(frame, line=False)
    model, module = owners.owner(inner, outer, below=below)
    shown = owners.traced.get(where)
    if shown is None:  # the monitor names a traced site once: the same name all its life, at no cost per call
        file, _, line = where.rpartition(":")
        shown = owners.traced[where] = f"{short_file(file)}:{line}" if file else where
    return model, module, shown


def call_site(frame, line: bool = True) -> tuple[torch.nn.Module | None, torch.nn.Module | None, str]:
    """(innermost module, outermost module, file:line) of the op whose dispatch runs below ``frame`` (wrappers such
    as OptimizedModule skipped); ``line=False``: no file:line ("")."""
    calls = []
    site = None if line else ""
    while frame is not None:
        code = frame.f_code
        if code is _CALL:
            calls.append(frame)
        elif site is None and not code.co_filename.startswith(_TORCH_DIR) and code.co_filename not in _OWN:
            site = f"{short_file(code.co_filename)}:{frame.f_lineno}"
        frame = frame.f_back
    # only the module calls that decide are read: a frame's locals cost a copy each
    inner = next((m for m in map(_self, calls) if _module(m)), None)
    outer = next((m for m in map(_self, reversed(calls)) if _module(m)), None)
    return inner, outer, "(torch)" if site is None else site


def _self(frame) -> torch.nn.Module | None:
    return frame.f_locals.get("self")


def _module(m) -> bool:
    return m is not None and type(m).__name__ not in WRAPPERS


def recomputing() -> bool:
    """Whether a forward op runs while autograd runs a backward: a replayed forward (gradient checkpointing,
    either mode, recomputes the forward inside the backward) whose elements were counted when it first ran."""
    return torch._C._current_graph_task_id() != -1


def class_name(module: torch.nn.Module) -> str:
    """The module's class, through FSDP2's ``FSDP<Class>`` subclass."""
    cls = type(module)
    if cls.__name__.startswith("FSDP") and len(cls.__bases__) > 1 and cls.__bases__[1].__name__ == cls.__name__[4:]:
        cls = cls.__bases__[1]
    return cls.__name__


def _shape(value) -> str:
    """What a value given in place of a dict of modules is, in words: its type, or the dict's wrong entry's."""
    if not isinstance(value, dict):
        return type(value).__name__
    k, m = next((k, m) for k, m in value.items() if not (isinstance(k, str) and isinstance(m, torch.nn.Module)))
    return f"{k!r}: {type(m).__name__}"


class Owners:
    """Each module's model and qualified name, learnt from the outermost module called around an op.

    A model is registered the first time one of its ops runs, with every module under it; a forward
    replayed inside the backward (transformers' checkpointing calls the layer's ``forward``, outside
    the model) then finds its modules already owned. Two models (or two instances of one class) get
    separate owners; ``qualifier`` names them only when more than one model ran.
    """

    def __init__(self, names: dict[str, torch.nn.Module] | None = None) -> None:
        if names is not None and not (isinstance(names, dict) and all(
                isinstance(k, str) and isinstance(m, torch.nn.Module) for k, m in names.items())):
            raise TypeError(f"models must be a dict of name -> torch.nn.Module, such as {{'teacher': model}}, got "
                            f"{_shape(names)}")
        self._given = {id(m): name for name, m in (names or {}).items()}
        self._of: dict[int, tuple[weakref.ref, int, str]] = {}  # id(module) -> (module, model index, name)
        self.models: list[tuple[str, str | None]] = []  # (class name, given name)
        self.traced: dict[str, str] = {}  # a compiled site's traced file:line -> its short name

    def _register(self, root: torch.nn.Module) -> None:
        """Learn the modules under ``root``: a new model, or (root already known) the modules added to it since."""
        known = self._of.get(id(root))
        if known is not None and known[0]() is root:
            index, prefix = known[1], known[2]
        else:
            index, prefix = len(self.models), ""
            self.models.append((class_name(root), self._given.get(id(root))))
        for name, m in root.named_modules(remove_duplicate=False):
            known = self._of.get(id(m))
            if known is None or known[0]() is not m:
                name = ".".join(part for part in (prefix, *name.split(".")) if part and part != "_orig_mod")
                self._of[id(m)] = (weakref.ref(m), index, name)  # (_orig_mod: a compiled submodule)

    def owner(self, inner: torch.nn.Module | None, outer: torch.nn.Module | None, below: str = "") -> tuple[int, str]:
        """(model index, name under the model) of ``inner`` (of its submodule ``below``, a dotted path inside a
        compiled region); (-1, "Global") outside any module."""
        if inner is None:
            return -1, below or "Global"
        known = self._of.get(id(inner))
        if known is None or known[0]() is not inner:
            self._register(outer)
            known = self._of.get(id(inner))
        if known is None or known[0]() is not inner:  # a module outside the model's tree (a fresh nn.Sigmoid()(x),
            return self._of[id(outer)][1], class_name(inner)  # as transformers' ACT2FN["sigmoid"] builds): its class
        return known[1], ".".join(p for p in (known[2], below) if p) or class_name(inner)

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


@functools.cache
def _dynamo_hooks() -> tuple | None:
    """(set_guard_complete_hook, callback_handler), imported once (importing dynamo is slow); None: no dynamo."""
    try:
        from torch._C._dynamo.eval_frame import set_guard_complete_hook
        from torch._dynamo.callback import callback_handler
    except ImportError:
        return None
    return set_guard_complete_hook, callback_handler


class CompiledRegions:
    """Counts compiled regions entered (dynamo cache hits and new compilations) while active.

    One process-wide guard hook and start callback serve every active counter: entering a counter twice,
    or two monitors' counters at once in any order, never makes the hook call itself, and the hook that
    was there before the first counter is put back when the last one leaves.
    """

    _active: list["CompiledRegions"] = []
    _previous = None

    def __init__(self) -> None:
        self.entered = 0
        self.supported = True

    @classmethod
    def _hit(cls, cache_hit: bool) -> bool:
        if cache_hit:
            for regions in cls._active:
                regions.entered += 1
        return cls._previous(cache_hit) if cls._previous is not None else cache_hit

    @classmethod
    def _compile(cls, args) -> None:
        if args.callback_trigger.name == "DYNAMO":
            for regions in cls._active:
                regions.entered += 1

    def __enter__(self):
        hooks = _dynamo_hooks()
        if hooks is None:
            self.supported = False
            return self
        if not CompiledRegions._active:
            set_guard_complete_hook, callback_handler = hooks
            CompiledRegions._previous = set_guard_complete_hook(CompiledRegions._hit)
            callback_handler.register_start_callback(CompiledRegions._compile)
        CompiledRegions._active.append(self)
        return self

    def __exit__(self, *exc) -> None:
        if not self.supported or self not in CompiledRegions._active:
            return
        CompiledRegions._active.remove(self)
        if CompiledRegions._active:
            return
        set_guard_complete_hook, callback_handler = _dynamo_hooks()
        set_guard_complete_hook(CompiledRegions._previous)
        CompiledRegions._previous = None
        callback_handler.remove_start_callback(CompiledRegions._compile)
