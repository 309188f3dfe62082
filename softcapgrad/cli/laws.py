"""The documents' laws: identity, ratchet, knee, horizon and dynamics."""

import math
from typing import Annotated, Optional

import typer

from softcapgrad.core.checks import increasing_range, positives
from softcapgrad.core.names import DYNAMICS_BACKWARDS, HORIZON_FUNCTIONS, KNEE_FUNCTIONS, KNEE_STACKS, STACK_PATHS
from softcapgrad.cli.common import (
    Caps, cap_in_format, choice, Dtypes, emit, InputError, Json, not_with, one_of, pick, Plot, Report, Wide
)
from softcapgrad.core.checks import fp32_cap, in_range
from softcapgrad.cli.limits import Bound, CAP, FINITE, FP32_MAX, FP64_MAX
from softcapgrad.laws.saturation import MAX_A_OVER_C


MAX_POINTS = 50_000_000  # the autograd check holds about 10 float64 arrays of this length: 4 GB
MAX_STEPS = 1_000_000  # a step takes about 3 µs in float64 (numpy), 50 µs in bf16/fp16/fp32 (torch): a minute at most
AT = Bound(-MAX_A_OVER_C, MAX_A_OVER_C, "past it sech²(a/c) underflows float64")
SIGMOID = Bound(0.0, FP32_MAX, "the stacks compute the sigmoid cap in float32", lo_open=True)


def identity(
    cap: Annotated[float, typer.Option(callback=CAP, help="Cap c > 0.")] = 30.0,
    points: Annotated[int, typer.Option(
        callback=Bound(2, MAX_POINTS, "memory grows with the grid: about 10 float64 arrays of it"),
        help=f"Grid points for the autograd check (2 to {MAX_POINTS:,}).")] = 2_000_000,
    range_: Annotated[
        tuple[float, float], typer.Option("--range", callback=FINITE, help="Range of a for the autograd check, in "
                                                                           "units of c (finite).")
    ] = (-8.0, 8.0),
    at: Annotated[Optional[list[float]], typer.Option("--at", callback=AT, help=f"Extra a/c multiples for the table "
                                                                               f"(|a/c| at most {MAX_A_OVER_C:g}).")] = None,
    json_out: Json = False,
    wide: Wide = False,
    plot: Plot = None,
) -> None:
    """Is dz/da = 1 − (z/c)² = sech²(a/c) exact against autograd; how strong is the attenuation at a = c, 2c, 4c."""

    def build() -> Report:
        from softcapgrad.laws.attenuation import identity_report

        import numpy as np

        c = cap_in_format("--cap", cap, np.dtype(np.float64), "a/c and the closed forms are computed")
        lo, hi = increasing_range("--range", *range_)
        if not (math.isfinite(lo * c) and math.isfinite(hi * c)):
            raise InputError(f"--range {lo:g} {hi:g}: times the cap {c:g} it overflows float64")
        multiples = list(dict.fromkeys([1.0, 2.0, 4.0, *(at or [])]))
        return identity_report(c, points, lo, hi, multiples, curve=plot is not None)

    emit(build, json_out, wide, plot, "identity")


def ratchet(
    cap: Caps = None,
    level: Annotated[Optional[list[float]], typer.Option(
        "--level", callback=Bound(0.0, 1.0, "a = c·atanh(f) is infinite at f = 1", hi_open=True),
        help="Confidence f in [0, 1) (repeatable).")] = None,
    json_out: Json = False,
    wide: Wide = False,
    plot: Plot = None,
) -> None:
    """How large must a be to express z = f·c, and how small is the gradient there."""

    def build() -> Report:
        from softcapgrad.laws.attenuation import ratchet_report

        import numpy as np

        levels = level or [0.9, 0.99, 0.999]
        top = math.atanh(max(levels))
        caps = [cap_in_format("--cap", c, np.dtype(np.float64), "a = c·atanh(f) is computed") for c in cap or [30.0]]
        for c in caps:  # the largest level's input must stay finite too
            if top > 0:
                in_range("--cap", c, 0.0, float(np.finfo(np.float64).max) / top,
                         f"a = c·atanh({max(levels):g}) = {top:.4g}·c must stay a finite float64")
        return ratchet_report(caps, levels, curve=plot is not None)

    emit(build, json_out, wide, plot, "ratchet")


KNEE_BACKENDS = ("exact", "numpy", "torch", *KNEE_STACKS)


def knee(
    dtype: Dtypes = None,
    cap: Caps = None,
    backend: Annotated[
        Optional[list[str]],
        typer.Option("--backend", help=f"{one_of(KNEE_BACKENDS)}, or all (repeatable; torch is imported only when "
                                       "asked). The stacks are measured live where they run, else recorded."),
    ] = None,
    fn: Annotated[Optional[list[str]], typer.Option("--fn", help=f"{one_of(KNEE_FUNCTIONS)} (repeatable; default tanh).")] = None,
    json_out: Json = False,
    wide: Wide = False,
    plot: Plot = None,
) -> None:
    """Where tanh(x) or a sigmoid is stored as exactly 1.0 per format; where a sigmoid or softplus gate saturates."""

    def build() -> Report:
        from softcapgrad.laws import formats
        from softcapgrad.laws.horizon import cap_range
        from softcapgrad.laws.knee import BACKENDS, knee_report

        dtypes = formats.resolve_many(dtype or ["bf16"])
        caps = positives("--cap", cap or [])
        named = [] if any(d.strip().lower() == "all" for d in dtype or []) else dtypes
        for fmt in named:  # under 'all' the cap is not stored in each format, only divided by in its arithmetic
            caps = [cap_in_format("--cap", c, fmt, "the horizon's a/c is computed") for c in caps]
        for fmt in dtypes:
            bounds = cap_range(fmt, in_format=fmt in named)
            caps = [in_range("--cap", c, bounds.lo, bounds.hi, bounds.why) for c in caps]
        backends = pick("--backend", backend, KNEE_BACKENDS, ["exact"])
        fns = pick("--fn", fn, KNEE_FUNCTIONS, ["tanh"])
        if "tanh" not in fns:
            not_with({"--cap": caps}, "to a gate alone: a sigmoid cap's pre-cap horizon depends on its scale (see "
                                      "horizon --path)")
        if fns == ["softplus"]:
            not_with({"--backend": backend, "--plot": plot}, "to softplus alone: it is never stored as 1.0 (its "
                                                             "points are searched exactly; the figure is the knee's)")
        stack_knee = None
        if any(b not in BACKENDS for b in backends):
            from softcapgrad.stacks.knees import stack_knee
        if fns == ["tanh"]:  # the gate laws' module only where a gate is asked for: knee alone starts faster
            return knee_report(dtypes, caps, backends, fns, stack_knee)
        from softcapgrad.laws.gates import knee_with_gates

        return knee_with_gates(dtypes, caps, backends, fns, stack_knee)

    emit(build, json_out, wide, plot, "knee")


# a gate's upstream gradient (horizon --fn, stacks' gate rows)
Upstream = Annotated[Optional[float], typer.Option(
    "--upstream", callback=Bound(0.0, FP64_MAX, "a gradient's size: a positive float64", lo_open=True),
    help="A gate's upstream gradient G (horizon: with --fn; default 1; times --loss-scale, rounded once to the gate's "
         "format).")]
LossScale = Annotated[Optional[float], typer.Option(
    "--loss-scale", callback=Bound(0.0, FP64_MAX, "a positive float64", lo_open=True),
    help="The loss scale S a gate's upstream gradient carries (default 1: no loss scaling).")]


def horizon(
    cap: Caps = None,
    dtype: Annotated[Optional[str], typer.Option(help="Float format of the scores and the cap: bf16 (default), fp16, fp32 or fp64.")] = None,
    at: Annotated[Optional[list[float]], typer.Option(
        "--at", callback=Bound(0.0, FP64_MAX, "a probe is a positive float64", lo_open=True),
        help="Probe inputs a > 0 (default 4c per cap; at most the format's largest value).")] = None,
    sweep: Annotated[Optional[int], typer.Option(
        callback=Bound(0, 1000, "a row each"),
        help="How many inputs before the first zero gradient to show (0 to 1000; default 6).")] = None,
    path: Annotated[
        Optional[list[str]],
        typer.Option("--path", help=f"A real stack (repeatable, or all; replaces --dtype): {one_of(STACK_PATHS)}. "
                                    "The old recipe names eager-bf16, eager-fp16, fp32-upcast, sigmoid-bf16 and "
                                    "remedy name the stack and scores format they ran."),
    ] = None,
    scores: Annotated[
        Optional[list[str]],
        typer.Option("--scores", help="With --path: the scores formats (repeatable; default bf16 and fp32; each "
                                      "stack shows those it applies to)."),
    ] = None,
    sigmoid_max: Annotated[Optional[float], typer.Option(
        callback=SIGMOID, help="Sigmoid cap m > 0 in m·σ((l + b)/s) (default 2c; a float32).")] = None,
    sigmoid_scale: Annotated[Optional[float], typer.Option(
        callback=SIGMOID, help="Sigmoid cap s > 0 (default c/2; a float32).")] = None,
    sigmoid_shift: Annotated[Optional[float], typer.Option(
        callback=Bound(-FP32_MAX, FP32_MAX, "the stacks compute in float32"),
        help="Sigmoid cap b (default 0; a float32).")] = None,
    fn: Annotated[Optional[str], typer.Option("--fn", help=f"{one_of(HORIZON_FUNCTIONS)}: the soft-cap c·tanh(a/c) "
                                                           "(default), or a sigmoid or softplus gate on its own, "
                                                           "eager and compiled.")] = None,
    upstream: Upstream = None,
    loss_scale: LossScale = None,
    json_out: Json = False,
    wide: Wide = False,
    plot: Plot = None,
) -> None:
    """From which pre-cap input is the autograd gradient through the cap exactly 0."""

    def build() -> Report:
        from softcapgrad.laws import formats
        from softcapgrad.laws.horizon import cap_range, horizon_report

        gate = choice("--fn", fn, HORIZON_FUNCTIONS) if fn is not None else "tanh"
        if gate != "tanh":
            not_with({"--cap": cap, "--at": at, "--sweep": sweep, "--path": path, "--scores": scores,
                      "--sigmoid-max": sigmoid_max, "--sigmoid-scale": sigmoid_scale, "--sigmoid-shift": sigmoid_shift,
                      "--plot": plot}, f"with --fn {gate}: a gate on its own has no cap; --dtype gives its format")
        if gate == "tanh":
            not_with({"--upstream": upstream, "--loss-scale": loss_scale}, "without --fn sigmoid|softplus (the cap's "
                                                                            "horizon is for an upstream of 1)")
        caps = positives("--cap", cap or [30.0, 50.0])
        probes = [float(a) for a in at] if at else None
        if path:
            caps = [fp32_cap("--cap", c) for c in caps]
            from softcapgrad.stacks.reports import horizon_paths_report
            from softcapgrad.stacks.registry import STACKS, Sigmoid, resolve_path

            not_with({"--dtype": dtype, "--sweep": sweep, "--plot": plot, "--at": at},
                     "with --path: each row is a stack's first zero-gradient input in its scores formats (--scores)")
            every = any(p.strip().lower() == "all" for p in path)
            names = list(STACKS) if every else list(dict.fromkeys(path))
            for name in names:
                resolve_path(name)  # a bad or dropped name fails before any computation
            wanted = [formats.canonical_name(s) for s in scores or []]
            sig = Sigmoid(
                m=sigmoid_max, s=sigmoid_scale, b=sigmoid_shift or 0.0,
            )
            return horizon_paths_report(names, wanted or None, caps, sig, every)
        not_with({"--sigmoid-max": sigmoid_max, "--sigmoid-scale": sigmoid_scale, "--sigmoid-shift": sigmoid_shift,
                  "--scores": scores}, "without --path (--dtype gives the single format)")
        fmt = formats.resolve(dtype or "bf16")
        if formats.torch_dtype(fmt) is None or fmt.itemsize < 2:
            raise InputError(f"--dtype {dtype}: autograd needs a format torch computes in (bf16, fp16, fp32, fp64)")
        if gate != "tanh":
            from softcapgrad.stacks.gates import gate_horizon_report, upstream_checked

            G, S = (1.0 if upstream is None else upstream), (1.0 if loss_scale is None else loss_scale)
            upstream_checked(fmt, G, S)
            return gate_horizon_report(gate, fmt, G, S)
        caps = [cap_in_format("--cap", c, fmt, "a/c and the tanh are computed") for c in caps]
        bounds = cap_range(fmt)
        caps = [in_range("--cap", c, bounds.lo, bounds.hi, bounds.why) for c in caps]
        if fmt.itemsize < 4:  # the fp32 column divides by the same cap in fp32
            caps = [fp32_cap("--cap", c) for c in caps]
        largest = float(formats.finfo(fmt).max)
        for a in probes or []:
            if a > largest:
                raise InputError(f"--at {a:g}: larger than the largest {fmt.name} value {largest:g}")
        return horizon_report(caps, fmt, probes, 6 if sweep is None else sweep, curve=plot is not None)

    emit(build, json_out, wide, plot, "horizon")


def _countable(option: str, a0: float, s) -> None:
    """The continuous-time count ∫ da / (lr·p·sech²(a/c)) from the end point to ``a0`` stays a float64: its smallest
    step lr·threshold·sech² (p falls to the threshold at the end; sech² is least at the largest |a|) times the
    largest float64 must exceed the distance, else one line before anything runs."""
    from softcapgrad.laws.dynamics import end_point

    for capped in (True, False):
        end = end_point(s, capped)
        if end is None or not math.isfinite(end) or a0 <= end:
            continue
        farthest = max(abs(a0), abs(end)) / s.cap
        step = s.lr * s.threshold * (1.0 / math.cosh(farthest) ** 2 if capped else 1.0)
        if not a0 - end <= step * FP64_MAX / 2:
            raise InputError(f"{option} {a0:g} with --lr {s.lr:g} and --threshold {s.threshold:g}: the smallest step "
                             f"on the way, lr·threshold{'·sech²(a/c)' if capped else ''} = {step:.3g}, leaves the "
                             "step count past float64's range; raise --lr or --threshold")


def dynamics(
    a0: Annotated[float, typer.Option("--a0", callback=FINITE, help=f"Starting pre-cap logit of the wrong class "
                                                                     f"(|a0| at most {MAX_A_OVER_C:g}c).")] = 40.0,
    cap: Annotated[float, typer.Option(callback=CAP, help="Cap c > 0.")] = 30.0,
    lr: Annotated[float, typer.Option(callback=Bound(0.0, FP64_MAX, "a finite float64", lo_open=True),
                                      help="Gradient-descent learning rate > 0.")] = 1.0,
    threshold: Annotated[float, typer.Option(
        callback=Bound(0.0, 1.0, "a probability", lo_open=True, hi_open=True),
        help="Stop when the wrong class's probability falls below this, in (0, 1).")] = 1e-3,
    classes: Annotated[int, typer.Option(callback=Bound(2, 2**53, "K − 2 is counted in float64, exact to 2^53"),
                                         help="Number of classes K ≥ 2 (the others sit at logit 0; at most 2^53).")] = 2,
    correct: Annotated[float, typer.Option(callback=FINITE, help="The correct class's fixed logit.")] = 0.0,
    max_steps: Annotated[int, typer.Option(callback=Bound(1, MAX_STEPS, "up to a minute a start in bf16 here"),
                                           help=f"Give up after this many steps (1 to {MAX_STEPS:,}).")] = 100_000,
    dtype: Annotated[str, typer.Option(help="fp64 (numpy), or bf16, fp16, fp32: the cap in that format by torch autograd.")] = "fp64",
    sweep: Annotated[bool, typer.Option("--sweep", help="Also sweep the starting point.")] = False,
    sweep_a0: Annotated[
        Optional[list[float]], typer.Option("--sweep-a0", callback=FINITE,
                                            help="Starting points of the sweep (repeatable; implies --sweep).")
    ] = None,
    backward: Annotated[
        str, typer.Option(help=f"{one_of(DYNAMICS_BACKWARDS)} (remedy: softcapgrad.softcap; bf16, fp16, fp32 only).")
    ] = "eager",
    json_out: Json = False,
    wide: Wide = False,
    plot: Plot = None,
) -> None:
    """How many more gradient-descent steps does the cap cost to correct a confidently wrong logit."""

    def build() -> Report:
        from softcapgrad.laws import formats
        from softcapgrad.laws.dynamics import EAGER, Backward, Setting, dynamics_report

        fmt = formats.resolve(dtype)
        if fmt.name not in ("bfloat16", "float16", "float32", "float64"):
            raise InputError(f"--dtype {dtype}: dynamics runs in bf16, fp16, fp32 or fp64")
        setting = Setting(
            cap=cap_in_format("--cap", cap, fmt, "the cap is computed"),
            lr=lr, threshold=threshold, classes=classes, correct=correct, max_steps=max_steps,
        )
        starts = sweep_a0 or None
        if (sweep or plot is not None) and not starts:
            starts = [float(x) for x in range(10, 131, 10)]
        mode = choice("--backward", backward, DYNAMICS_BACKWARDS)
        if mode == "remedy" and fmt.name == "float64":
            raise InputError("--backward remedy needs --dtype bf16, fp16 or fp32 (the float64 run is numpy, without autograd)")
        for option, start in [("--a0", a0), *(("--sweep-a0", x) for x in starts or [])]:
            if not abs(start) <= MAX_A_OVER_C * setting.cap:
                raise InputError(f"{option} {start:g}: |a0| must be at most {MAX_A_OVER_C:g}·c = "
                                 f"{MAX_A_OVER_C * setting.cap:g}; past it sech²(a0/c) underflows float64")
            _countable(option, start, setting)
        backward_fn = EAGER
        if mode == "remedy":
            from softcapgrad.training.remedy import softcap

            backward_fn = Backward("remedy", softcap)
        return dynamics_report(a0, setting, fmt if fmt.name != "float64" else None, starts, backward_fn)

    emit(build, json_out, wide, plot, "dynamics")
