"""The real stacks: where the gradient of z = c·tanh(a/c) dies on the backends that training runs.

A stack is a library on a device (``torch-compile-cpu``), the score formats it applies to, and one
line on what it really computes: which tanh, how a/c is formed, what the backward reads. Each line
comes from the generated code or the library's source, and each figure from running the library:
compiled code does not compute what eager code does. :func:`first_zero` answers for one stack,
scores format and cap: measured live where the backend runs here (the CPU stacks; the CUDA ones
when CUDA is present), taken from the packaged recording where it does not, and "not measured",
with the reason, where neither has it.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass

import numpy as np

from softcapgrad.laws import formats
from softcapgrad.stacks import cache, recording as recorded
from softcapgrad.core.checks import InputError, suggestion
from softcapgrad.stacks.availability import _no_compiler, _simd, _where, runs_here, torch_build  # noqa: F401


@dataclass(frozen=True)
class Sigmoid:
    """z = m·σ((l + b)/s); defaults m = 2c, s = c/2, b = 0 make it c + c·tanh(l/c) exactly in real arithmetic."""

    m: float | None = None
    s: float | None = None
    b: float = 0.0

    def resolved(self, c: float) -> tuple[float, float, float]:
        return (2.0 * c if self.m is None else self.m, c / 2.0 if self.s is None else self.s, self.b)


@dataclass(frozen=True)
class Stack:
    name: str
    library: str  # torch | jax | mlx
    device: str  # cpu | cuda
    engine: str  # torch-eager | torch-compile | torch-compile-scalar | jax-jit | jax-eager | mlx-eager | mlx-compile |
    # flex | tanh-approx
    formats: tuple[str, ...]  # canonical names of the score formats it applies to
    computes: str  # one line: which tanh, how a/c is formed, what the backward reads
    fn: str = "tanh"  # tanh | sigmoid | remedy | patch
    upcast: bool = False  # the scores are cast to fp32 before the cap
    upstream_sets_zero: bool = False  # the backward is 0 where g·(its derivative) underflows: where depends on g

    @property
    def has_knee(self) -> bool:
        """Whether 'the first x whose tanh comes back as 1.0' is a property of this stack."""
        return self.fn == "tanh" and not self.upcast and self.engine != "flex"


ALL3, LOW = ("bfloat16", "float16", "float32"), ("bfloat16", "float16")
_EAGER_CPU = "eager op by op in the scores format: a/c and c·t rounded to it"
_COMPILE = "a upcast to fp32, a/c a true division (no reciprocal), one rounding of c·t; the backward recomputes tanh " \
           "from the saved input in fp32, (g·c)(1 − t²)/c"

_MLX_BACKWARD = ("the backward divides g by cosh²(a/c) computed from the input in the scores format "
                 "(mlx/primitives.cpp lines 5760–5767 at the v0.32.1 tag, Tanh::jvp; the 0.32.4 wheel ships no "
                 "C++ source, its behaviour measured the same): 0 where that square overflows or the quotient "
                 "underflows, not where tanh reaches 1, so its first zero here (g = 1) moves down with a smaller g")

STACKS: dict[str, Stack] = {s.name: s for s in (
    Stack("torch-eager-cpu", "torch", "cpu", "torch-eager", ALL3,
          f"c·torch.tanh(a/c) {_EAGER_CPU}; tanh by ATen's CPU kernel (bf16/fp16 evaluated in fp32 and rounded; fp32 "
          "by its vector-math routine); backward 1 − y² from the stored, rounded output"),
    Stack("torch-eager-cpu-upcast", "torch", "cpu", "torch-eager", LOW,
          "the scores cast to fp32 (a.float()) before c·torch.tanh(a/c), as when logits are capped inside an fp32 "
          "loss: torch-eager-cpu's fp32 arithmetic, the gradient rounded back to the scores format", upcast=True),
    Stack("torch-eager-cpu-sigmoid", "torch", "cpu", "torch-eager", ALL3,
          f"m·torch.sigmoid((a + b)/s) {_EAGER_CPU} (default m = 2c, s = c/2, b = 0: c + c·tanh(a/c) in real "
          "arithmetic); backward σ(1 − σ) from the stored output, so only the top side dies before σ underflows",
          fn="sigmoid"),
    Stack("torch-eager-cpu-remedy", "torch", "cpu", "torch-eager", ALL3,
          "softcapgrad.softcap: the eager forward; the backward sech²(a/c) in fp32 from the saved input, rounded "
          "once: zero only where that underflows the format", fn="remedy"),
    Stack("torch-eager-cpu-patch", "torch", "cpu", "torch-eager", ALL3,
          f"c·torch.tanh(a/c) {_EAGER_CPU}, run under softcapgrad.patch: the eager forward; the tanh backward "
          "sech²(a/c) from the saved input (bf16/fp16: in fp32; fp32: in fp64), rounded once", fn="patch"),
    Stack("torch-compile-cpu", "torch", "cpu", "torch-compile", ALL3,
          f"torch.compile (inductor C++ vector code at the ISA it picks in this process: the CPU's widest, or the one "
          f"ATEN_CPU_CAPABILITY names): {_COMPILE}; tanh is SLEEF's tanhf_u10, "
          "which returns exactly 1.0 past a fixed threshold below fp32's own knee"),
    Stack("torch-compile-cpu-scalar", "torch", "cpu", "torch-compile-scalar", ALL3,
          "the same graph in inductor's scalar C++ (cpp.simdlen = 1; what ATEN_CPU_CAPABILITY=default and a tensor of "
          f"one element get): {_COMPILE}; tanh is the C library's tanhf"),
    Stack("torch-eager-cuda", "torch", "cuda", "torch-eager", ALL3,
          "c·torch.tanh(a/c) eager on CUDA: a/c, tanh and c·t in the scores format, one op at a time; backward "
          "1 − y² from the stored output"),
    Stack("torch-compile-cuda", "torch", "cuda", "torch-compile", ALL3,
          "torch.compile (inductor, Triton) of the same formula on CUDA, forward and backward; bf16 scores "
          "computed in fp32 with one rounding"),
    Stack("flex-attention-cuda", "torch", "cuda", "flex", ALL3,
          "torch FlexAttention with score_mod c·tanh(s/c): scores in fp32 accumulators (q·k of the stored q and k), "
          "tanh recomputed in fp32 in the backward kernel"),
    Stack("tanh-approx-cuda", "torch", "cuda", "tanh-approx", ALL3,
          "the PTX instruction tanh.approx.f32 as flash-attn's softcap uses it: a·fl(1/c) in fp32, tanh.approx.f32, "
          "backward 1 − t² in fp32; a Triton kernel with that instruction (flash-attn itself is not run)"),
    Stack("jax-jit-cpu", "jax", "cpu", "jax-jit", ALL3,
          "jax.jit of c·jnp.tanh(a/c) and its jax.vjp on XLA CPU: a/c rewritten as a·fl(1/c), each op in fp32 and "
          "rounded to the scores format, XLA's own tanh (exactly 1.0 past a fixed input below fp32's knee); backward "
          "g·(1 + y)(1 − y) from the output y"),
    Stack("jax-jit-cpu-upcast", "jax", "cpu", "jax-jit", LOW,
          "jax-jit-cpu on the scores cast to fp32 (a.astype(float32)), the gradient cast back", upcast=True),
    Stack("jax-eager-cpu", "jax", "cpu", "jax-eager", ALL3,
          "the same jax code without jax.jit: each primitive compiled and run on its own (a/c also as a·fl(1/c))"),
    Stack("jax-jit-cuda", "jax", "cuda", "jax-jit", ALL3,
          "jax.jit of c·jnp.tanh(a/c) and its jax.vjp on XLA GPU; its fp32 tanh returns 1.0 not monotonically "
          "(some inputs past the first 1.0 come back below it)"),
    Stack("jax-jit-cuda-upcast", "jax", "cuda", "jax-jit", LOW,
          "jax-jit-cuda on the scores cast to fp32, the gradient cast back", upcast=True),
    Stack("jax-eager-cuda", "jax", "cuda", "jax-eager", ALL3,
          "jax on CUDA without jax.jit: each primitive dispatched and rounded on its own"),
    Stack("mlx-cpu", "mlx", "cpu", "mlx-eager", ALL3,
          f"c·mx.tanh(a/c) and its mx.vjp on MLX's CPU device, {_EAGER_CPU}; tanh and cosh the C library's "
          f"(std::tanh, std::cosh: the wheel's mlx/include/mlx/backend/cpu/simd/base_simd.h lines 96 and 104); "
          f"{_MLX_BACKWARD}", upstream_sets_zero=True),
    Stack("mlx-compile-cpu", "mlx", "cpu", "mlx-compile", ALL3,
          f"the same function under mx.compile (MLX fuses the ops into C++ it compiles at run time): "
          f"{_MLX_BACKWARD}", upstream_sets_zero=True),
)}

# The recipe names horizon --path took before the stacks, and the real stack each was shown to equal.
ALIASES: dict[str, tuple[str, str]] = {
    "eager-bf16": ("torch-eager-cpu", "bfloat16"),
    "eager-fp16": ("torch-eager-cpu", "float16"),
    "fp32-upcast": ("torch-eager-cpu-upcast", "bfloat16"),
    "sigmoid-bf16": ("torch-eager-cpu-sigmoid", "bfloat16"),
    "remedy": ("torch-eager-cpu-remedy", "bfloat16"),
}
DROPPED: dict[str, str] = {
    "fused-fp32": "'fused-fp32' emulated a fused fp32 kernel with the CPU's tanh and equals no fused kernel; its "
                  "successors: --path flex-attention-cuda or torch-compile-cuda with --scores fp32",
}


REMEDIES = ("remedy", "patch")  # the stack functions that are a remedy, not a cap as user code writes it


def resolve_path(name: str) -> tuple[Stack, str | None]:
    """A --path value: a stack (no format fixed) or an old recipe name (stack and scores format)."""
    key = name.strip().lower()
    if key in DROPPED:
        raise InputError(f"--path {DROPPED[key]}")
    if key in ALIASES:
        stack, scores = ALIASES[key]
        return STACKS[stack], scores
    if key in STACKS:
        return STACKS[key], None
    raise InputError(f"--path {name!r} is not a stack: use one of {', '.join(STACKS)}"
                     f"{suggestion(name, [*STACKS, *ALIASES])}")


def resolve_scores(name: str, scores: str | None, option: str) -> tuple[Stack, str | None]:
    """A --path value with the scores format asked for (None: none asked): an old recipe name fixes its format,
    and a different one asked for is refused rather than dropped."""
    stack, fixed = resolve_path(name)
    if fixed is not None and scores is not None and formats.canonical_name(scores) != fixed:
        raise InputError(f"--path {name} is {stack.name} with {fixed} scores and takes no {option} {scores}: "
                         f"use --path {stack.name} {option} {scores}")
    return stack, fixed


@dataclass(frozen=True)
class StackResult:
    path: str
    scores: str  # canonical name of the format whose values were searched
    cap: float | None  # None for a knee
    value: float | None  # first zero-gradient input (or first input whose tanh is 1.0); None: none or unknown
    monotone: bool | None  # every searched value past ``value`` is also zero (1.0)
    source: str  # "measured" | "recorded on <device>" | "not measured"
    reason: str  # how it was found, or why there is no figure
    saturated_run_start: float | None = None  # where the contiguous run of zeros (1.0s) up to the searched end begins
    last_unsaturated: float | None = None  # past ``value``, the last searched input that is not zero (1.0)


def gradient(stack: Stack, values: np.ndarray, dtype: np.dtype, c: float, sigmoid: Sigmoid = Sigmoid(),
             upstream: np.ndarray | None = None) -> np.ndarray:
    """d/da of the stack's cap over ``values`` of ``dtype``, live (the stack must run here); ``upstream``: the
    gradient arriving at the cap's output per value (None: 1), for the stacks whose zeros depend on it."""
    from softcapgrad.stacks import runners as backends

    dev, engine = stack.device, stack.engine
    if upstream is not None and not stack.upstream_sets_zero:
        raise ValueError(f"{stack.name}'s zeros do not depend on the upstream gradient: it takes none")
    if engine in ("torch-eager", "torch-compile", "torch-compile-scalar"):
        return backends.torch_gradient(values, dtype, c, stack.fn, compiled=engine != "torch-eager", simd=_simd(stack),
                                       upcast=stack.upcast, sigmoid=sigmoid.resolved(c), device=dev)
    if engine in ("jax-jit", "jax-eager"):
        return backends.jax_gradient(values, dtype, c, jit=engine == "jax-jit", upcast=stack.upcast,
                                     device="gpu" if dev == "cuda" else "cpu")
    if engine in ("mlx-eager", "mlx-compile"):
        from softcapgrad.stacks import mlx_cap

        return mlx_cap.mlx_gradient(values, dtype, c, compiled=engine == "mlx-compile", upstream=upstream)
    if engine == "flex":
        return backends.flex_gradient(values, dtype, c)
    return backends.tanh_approx(values, dtype, c, "grad")


def saturates(stack: Stack, values: np.ndarray, dtype: np.dtype, fn: str = "tanh", simd: int | None = None) -> np.ndarray:
    """Whether the stack's tanh (sigmoid) returns exactly 1.0 for each value, live (``simd``: a vector width
    for compiled CPU code other than this process's own)."""
    from softcapgrad.stacks import runners as backends

    if stack.library == "jax":
        return backends.jax_saturates(values, dtype, fn, jit=stack.engine == "jax-jit",
                                      device="gpu" if stack.device == "cuda" else "cpu")
    if stack.library == "mlx":
        from softcapgrad.stacks import mlx_cap

        return mlx_cap.mlx_saturates(values, dtype, compiled=stack.engine == "mlx-compile")
    if stack.engine == "tanh-approx":
        return backends.tanh_approx(values, dtype, 1.0, "tanh") == 1.0
    return backends.torch_saturates(values, dtype, fn, compiled=stack.engine != "torch-eager", simd=simd or _simd(stack),
                                    device=stack.device)


def _from_switch(stack: Stack, scores: str, c: float | None, switch: formats.Switch, simd: int | None = None) -> StackResult:
    searched = ("every positive value of the format" if switch.method == "enumeration"
                else f"bisection on the format's bit patterns, {switch.checked} values around the switch checked")
    return StackResult(stack.name, scores, c, switch.first_true, switch.monotone if switch.first_true is not None else None,
                       "measured", f"{_where(stack, simd)}; {searched}", switch.run_start, switch.last_false_after)


def _from_recording(stack: Stack, scores: str, c: float | None, quantity: str, why_absent: str) -> StackResult:
    rec = recorded.packaged()
    row = rec.find(stack.name, quantity, scores, c)
    if row is None:
        return StackResult(stack.name, scores, c, None, None, "not measured", why_absent)
    run, note = row.value, f"; {row.note}" if row.note else ""
    if row.last_unsaturated is not None:  # the run of zeros starts at the value after the last non-zero one
        run = float(formats.neighbours_below(formats.resolve(scores), row.last_unsaturated, 0, 1).astype(np.float64)[-1])
        note += "; saturated from: the value after the recorded last non-saturated one"
    return StackResult(stack.name, scores, c, row.value, row.monotone, rec.source,
                       f"{rec.date}, torch {rec.versions.get('torch', '?')}{note}", run, row.last_unsaturated)


def _check(stack: Stack, scores: str) -> str:
    canonical = formats.canonical_name(scores)
    if canonical not in stack.formats:
        names = ", ".join(stack.formats)
        raise InputError(f"{stack.name} takes scores in {names}; got {scores!r}")
    return canonical


def _check_cap(c: float) -> None:
    if not (math.isfinite(c) and c > 0):
        raise InputError(f"--cap must be a finite number > 0, got {c!r}")


@functools.cache
def first_zero(path: str, scores: str, c: float, sigmoid: Sigmoid = Sigmoid()) -> StackResult:
    """The first input of the scores format whose gradient through the stack's cap is exactly 0."""
    stack, fixed = resolve_path(path)
    scores = fixed or _check(stack, scores)
    _check_cap(c)
    why = runs_here(stack)
    if not why:
        dtype = formats.resolve(scores)
        switch = formats.find_switch(dtype, lambda v: gradient(stack, v, dtype, c, sigmoid) == 0.0)
        return _from_switch(stack, scores, c, switch)
    held = [r for r in recorded.packaged().rows if r.path == stack.name and r.cap is not None
            and r.quantity == "first_zero_grad_input"]
    kinds = ", ".join(dict.fromkeys(r.scores for r in held))
    caps = ", ".join(f"{x:g}" for x in sorted({r.cap for r in held}))
    absent = (f"{why}, and the recording on {recorded.packaged().device} has no {scores} scores at c = {c:g} "
              f"for this stack" + (f" (it holds {kinds} scores at c = {caps})" if held else ""))
    return _from_recording(stack, scores, c, "first_zero_grad_input", absent)


@functools.cache
def knee(path: str, scores: str = "float32", fn: str = "tanh", simd: int | None = None) -> StackResult:
    """The first input of the format whose tanh (sigmoid) the stack returns as exactly 1.0.

    ``simd``: for torch-compile-cpu, a vector width of this CPU to compile for instead of the one
    inductor picks in this process (the ledger uses one that every x86 class it covers has)."""
    stack, _ = resolve_path(path)
    scores = _check(stack, scores)
    if not stack.has_knee:
        return StackResult(stack.name, scores, None, None, None, "not measured",
                           "not a property of this stack: its tanh is another stack's (see the stack it builds on)")
    if simd is not None and not (stack.engine == "torch-compile" and stack.device == "cpu"):
        raise ValueError(f"a vector width applies to torch-compile-cpu only, not {stack.name}")
    if simd is not None:
        from softcapgrad.stacks.runners import inductor_isa

        why = _no_compiler() or ("" if inductor_isa(simd) else f"this CPU has no {simd}-bit vector ISA for inductor")
    else:
        why = runs_here(stack)
    if not why:
        if fn != "tanh" and (stack.library in ("jax", "mlx") or stack.device == "cuda"):
            return StackResult(stack.name, scores, None, None, None, "not measured", f"{fn} is not searched on {stack.name}")
        dtype = formats.resolve(scores)
        return _from_switch(stack, scores, None, formats.find_switch(dtype, lambda v: saturates(stack, v, dtype, fn, simd)),
                            simd)
    if fn != "tanh":
        return StackResult(stack.name, scores, None, None, None, "not measured", f"{why}; the recording has tanh only")
    return _from_recording(stack, scores, None, "first_saturating_input",
                           f"{why}, and the recording has no {scores} knee for this stack")


# --- the dead zone on both sides, for audits of real values ------------------------------------


@dataclass(frozen=True)
class DeadZone:
    """Where one stack's gradient through the cap is exactly 0: a ≥ above or a ≤ below, a rounded to ``scores``."""

    path: str
    scores: str
    cap: float
    above: float | None  # first positive input with a zero gradient (None: none, or not known)
    below: float | None  # first negative input with a zero gradient, a negative number (None: none, or not known)
    one_sided: bool  # the negative side does not mirror the positive one (a scaled sigmoid's does not)
    source: str
    reason: str


@functools.cache
def dead_zone(path: str, c: float, scores: str | None = None, sigmoid: Sigmoid = Sigmoid()) -> DeadZone:
    """Both sides of the dead zone. Live stacks are searched on both sides; a recording holds positive inputs only,
    so its negative side is the mirror image (tanh is odd in every implementation recorded)."""
    stack, fixed = resolve_path(path)
    scores = fixed or (_check(stack, scores) if scores else stack.formats[0])
    _check_cap(c)
    name = cache.entry(stack.name, scores, c, sigmoid.resolved(c)) if cache.cacheable(stack) else None
    if name is not None and (kept := cache.lookup(name)) is not None:
        return DeadZone(**{**kept, "cap": c})
    top = first_zero(path, scores, c, sigmoid)
    if top.source == "measured":
        dtype = formats.resolve(scores)
        low = formats.find_switch(dtype, lambda v: gradient(stack, -v, dtype, c, sigmoid) == 0.0).first_true
        below, how = (None if low is None else -low), "both sides searched"
    else:
        below, how = (None if top.value is None else -top.value), "negative side mirrored from the positive one"
    one_sided = below != (None if top.value is None else -top.value)
    reason = top.reason if top.source == "not measured" else f"{top.reason}; {how}"
    zone = DeadZone(stack.name, scores, c, top.value, below, one_sided, top.source, reason)
    if name is not None and zone.source == "measured":
        cache.store(name, {**asdict(zone), "cap": float(c)})
    return zone


def dead(zone: DeadZone, values: np.ndarray) -> np.ndarray:
    """Which values, rounded to the zone's scores format as the model stores them, lie in the dead zone."""
    a = np.asarray(values).astype(formats.resolve(zone.scores)).astype(np.float64)
    out = np.zeros(a.shape, dtype=bool)
    if zone.above is not None:
        out |= a >= zone.above
    if zone.below is not None:
        out |= a <= zone.below
    return out
