"""The claims ledger: every number the documents state, beside the function that recomputes it.

Each claim records where it is stated, the value as printed, how to compare (``approx``: within
half a unit of the last printed digit, so "0.42" means ±0.005; ``at_most``/``at_least``: a bound;
``exact``: equality), the computation, and the verdict we expect. softcapgrad.ledger.verdicts
recomputes them all; a verdict that differs from the expected one is a regression in either direction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from functools import cache
from pathlib import Path
from typing import Callable

from softcapgrad.ledger.gate_claims import gate_claims


SOFTCAP_DOC = "softcapgrad.md"
GATES_DOC = "softmax-softplus-gates.md"
TETHER_DOC = "tethergate.md"

from softcapgrad.ledger.measured import (  # noqa: E402 - the claims that rest on committed runs
    experiment_low as _experiment_low, tether_closed_low, why_experiment as _why_experiment, why_tether)


def printed_tolerance(stated: str) -> float:
    """Half a unit in the last printed digit: '0.42' -> 0.005, '1.3e-3' -> 5e-5, '104' -> 0.5."""
    exponent = Decimal(stated.replace(",", "")).as_tuple().exponent
    return 0.5 * 10.0 ** int(exponent)


def printed_value(stated: str) -> float:
    return float(stated.replace(",", ""))


@dataclass(frozen=True)
class Claim:
    id: str
    doc: str
    section: str
    statement: str
    stated: str  # as printed in the document
    kind: str  # approx | at_most | at_least | exact
    compute: Callable[[], float]
    expected: str  # reproduced | differs
    why: str | Callable[[], str] = ""  # one line: why it differs, or what the figure rests on
    tolerance: float | None = None  # overrides the printed-digit tolerance, with the reason in ``why``

    @property
    def tol(self) -> float:
        return printed_tolerance(self.stated) if self.tolerance is None else self.tolerance

    def explanation(self) -> str:
        return self.why() if callable(self.why) else self.why

    def verdict(self, computed: float) -> str:
        value, tol = printed_value(self.stated), self.tol
        holds = {
            "approx": abs(computed - value) <= tol,
            "at_most": computed <= value + tol,
            "at_least": computed > value,
            "exact": computed == value,
        }[self.kind]
        return "reproduced" if holds and math.isfinite(computed) else "differs"


# --- computations, imported lazily so the ledger loads fast ----------------------------------


@cache
def _identity():
    from softcapgrad.laws.attenuation import check_identity

    return check_identity(30.0, 2_000_000)


def _attenuation(multiple: float) -> float:
    from softcapgrad.laws.attenuation import attenuation_table

    return attenuation_table([multiple])[0].attenuation


def _asymptote_rel_error(multiple: float) -> float:
    from softcapgrad.laws.attenuation import attenuation_table

    return attenuation_table([multiple])[0].asymptote_rel_error


def _ratchet(f: float, c: float = 30.0) -> float:
    from softcapgrad.laws.attenuation import ratchet

    return ratchet(c, [f])[0].a


def _facts(name: str):
    from softcapgrad.laws import formats

    return formats.facts(formats.resolve(name))


def _knee_exact(name: str) -> float:
    from softcapgrad.laws.saturation import knee_exact

    return knee_exact(_facts(name).spacing_below_one)


def _knee_doc(name: str) -> float:
    from softcapgrad.laws.saturation import knee_doc_formula

    return knee_doc_formula(_facts(name).mantissa_bits)


@cache
def _backend_first_saturating(name: str, backend: str) -> float:
    from softcapgrad.laws import formats
    from softcapgrad.laws.knee import backend_knee
    from softcapgrad.stacks.knees import stack_knee

    return backend_knee(formats.resolve(name), backend, [], "tanh", stack_knee).first_saturating_input


@cache
def _horizon(c: float, name: str = "bf16"):
    from softcapgrad.laws import formats
    from softcapgrad.laws.horizon import horizon

    return horizon(c, formats.resolve(name), [4.0 * c])


# the real stacks whose fp32 tanh is their own (stacks.py): live where they run here, else recorded. Only
# stacks every install has (torch) or that are recorded: jax-jit-cpu needs the optional jax extra, and
# the committed ledger must read the same with or without it (`knee --dtype fp32 --backend all` shows it)
_FP32_STACKS = ("torch-compile-cpu", "torch-compile-cpu-scalar",
                "torch-eager-cuda", "torch-compile-cuda", "tanh-approx-cuda", "jax-jit-cuda")


LEDGER_SIMD = 256  # torch-compile-cpu compiled for AVX2 vectors, which every x86 class the ledger covers has


class NotMeasuredHere(Exception):
    """A claim this machine cannot compute (its message says what is missing): reported, not judged."""


@cache
def _fp32_stack_knees() -> dict:
    """The stacks' fp32 knees. torch-compile-cpu at a fixed vector width, not this process's: under
    ATEN_CPU_CAPABILITY=default inductor would emit scalar code, and the ledger is the same on any CPU
    (SLEEF's tanhf saturates at the same input at 256 and 512 bits). Without a C++ compiler the
    compiled stacks cannot run: the claims resting on them are not measured here."""
    from softcapgrad.stacks.registry import knee
    from softcapgrad.stacks.runners import cxx_compiler_missing

    if missing := cxx_compiler_missing():
        raise NotMeasuredHere(missing)

    return {path: knee(path, "float32", "tanh", LEDGER_SIMD if path == "torch-compile-cpu" else None)
            for path in _FP32_STACKS}


def _fp32_searches() -> dict[str, float]:
    found = {b: _backend_first_saturating("fp32", b) for b in ("exact", "numpy", "torch")}
    found.update({p: r.value for p, r in _fp32_stack_knees().items() if r.value is not None})
    return found


def _fp32_search_nearest(stated: float) -> float:
    """Of every fp32 direct search (exact rounding, numpy, torch eager, the real stacks), the one nearest the claim."""
    return min(_fp32_searches().values(), key=lambda x: abs(x - stated))


def _why_fp32_search() -> str:
    import numpy as np

    plain = ", ".join(f"{_backend_first_saturating('fp32', b):.6g} ({b})" for b in ("exact", "numpy", "torch"))
    knees = _fp32_stack_knees()
    by_source: dict[str, list[str]] = {}
    for path, r in knees.items():
        if r.value is not None:
            odd = ", not monotone" if r.monotone is False else ""
            by_source.setdefault(r.source, []).append(f"{r.value:.6g} ({path}{odd})")
    stacks = "; ".join(f"{source}: {', '.join(items)}" for source, items in by_source.items())
    stated = printed_value("8.665")
    path, value = min(((p, r.value) for p, r in knees.items() if r.value is not None), key=lambda pv: abs(pv[1] - stated))
    formula = _knee_doc("fp32")
    past_formula = float(np.nextafter(np.float32(formula), np.float32(np.inf)))
    where = ("the first fp32 value past" if value == past_formula else "against")
    return (f"first fp32 input whose tanh is stored as 1.0: {plain}; on the real stacks, {stacks}. None saturates at "
            f"the stated figure; the nearest, {path}, saturates at {value:.6g}, {where} the formula's (ln2/2)(p+2) = "
            f"{formula:.6g}: the stated figure repeats the formula's criterion (half the spacing above 1.0), not fp32 "
            "arithmetic")


def _why_formula_bf16() -> str:
    return (f"the formula gives {_knee_doc('bf16'):.4g} for bf16; the stated knee is the exact one, "
            f"atanh(1 − 2^−9) = {_knee_exact('bf16'):.5g} ≈ (ln2/2)(p+3): half the spacing below 1.0")


def _why_horizon(c: float) -> Callable[[], str]:
    def why() -> str:
        h = _horizon(c)
        return (f"{c:g}·{_knee_exact('bf16'):.5g} = {h.horizon:.5g}; autograd over bf16 inputs first returns "
                f"0.0 at a = {h.first_zero_grad_input:g}")

    return why


@cache
def _dynamics_default():
    from softcapgrad.laws.dynamics import Setting, headline

    return headline(40.0, Setting(cap=30.0))[0]


def _why_dynamics() -> str:
    h = _dynamics_default()
    return (f"K = 2, correct logit 0, threshold 1e-3, lr = 1, c = 30, a0 = 40: {h.steps_capped} vs {h.steps_uncapped} steps "
            f"(the flow integral gives {h.integral_ratio:.4g}); the ratio grows with a0, see dynamics --sweep")


@cache
def _gates(section: str):
    from softcapgrad.demos import gates

    if section == "competition":
        return gates.competition([1.0, 2.0, 3.0], 2, 1.0)
    if section == "backward":
        return {r["identity"]: r for r in gates.backward_laws(seed=0)}
    if section == "laguna":
        return gates.laguna_check(gates.Shape(), seed=0)
    if section == "cost":
        return gates.layer_cost(gates.Config(D=3072, H_kv=8, d_h=128), 48)
    if section == "softplus-0":
        return gates.softplus_at(0.0)
    raise KeyError(section)


# float64 identities between O(1) quantities: a handful of roundings, so 16 ulps of 1.0
_F64_IDENTITY = 16 * 2.0**-52
_IDENTITY_WHY = "float64 against torch autograd; tolerance 16 ulps of 1.0 (a handful of roundings of O(1) values)"


def _identity_claim(key: str, label: str) -> Claim:
    return Claim(f"law-{key}", GATES_DOC, "5-8. Backward passes", label, "0", "at_most",
                 lambda: _gates("backward")[label]["max_abs_error"], "reproduced", _IDENTITY_WHY, _F64_IDENTITY)


@cache
def _push() -> dict[tuple[float, float], dict]:
    from softcapgrad.demos import tether_demo

    return {(r["lr"], r["wd"]): r for r in tether_demo.steady_push(tether_demo.PUSH_LRS, tether_demo.PUSH_WDS)}


def _shift(wd: float) -> float:
    """The measured gate-argument shift at the smallest lr of the sweep."""
    from softcapgrad.demos import tether_demo

    return _push()[(min(tether_demo.PUSH_LRS), wd)]["shift"]


def _lr_spread(wd: float) -> float:
    """Worst |offset·wd − 1| over the 150× LR range."""
    return max(abs(r["offset"] * wd - 1) for (lr, w), r in _push().items() if w == wd)


def _stability_boundary() -> float:
    from softcapgrad.demos.tether_demo import stability_boundary

    return stability_boundary()


CLAIMS: tuple[Claim, ...] = (
    Claim("identity-autograd", SOFTCAP_DOC, "The exact gradient identity",
          "1 − (z/c)² agrees with autograd over two million points to", "3.3e-16", "at_most",
          lambda: _identity().max_abs_error_output_form, "reproduced",
          "float64, c = 30, a on [−8c, 8c]; the sech²(a/c) form is also within a few ulps (see identity)"),
    Claim("attenuation-c", SOFTCAP_DOC, "The exact gradient identity", "sech² at a = c", "0.42", "approx",
          lambda: _attenuation(1.0), "reproduced"),
    Claim("attenuation-2c", SOFTCAP_DOC, "The exact gradient identity", "sech² at a = 2c", "0.07", "approx",
          lambda: _attenuation(2.0), "reproduced"),
    Claim("attenuation-4c", SOFTCAP_DOC, "The exact gradient identity", "sech² at a = 4c", "1.3e-3", "approx",
          lambda: _attenuation(4.0), "reproduced"),
    Claim("asymptote", SOFTCAP_DOC, "The exact gradient identity",
          "sech²(a/c) decays as 4·exp(−2a/c): relative error at a = 8c", "0", "approx",
          lambda: _asymptote_rel_error(8.0), "reproduced",
          "the relative error is (1 + exp(−2a/c))² − 1 ≈ 2·exp(−2a/c), shrinking to 0"),
    Claim("ratchet-0.9", SOFTCAP_DOC, "The exact gradient identity", "a for z = 0.9c, c = 30", "44", "approx",
          lambda: _ratchet(0.9), "reproduced"),
    Claim("ratchet-0.99", SOFTCAP_DOC, "The exact gradient identity", "a for z = 0.99c, c = 30", "79", "approx",
          lambda: _ratchet(0.99), "reproduced"),
    Claim("ratchet-0.999", SOFTCAP_DOC, "The exact gradient identity", "a for z = 0.999c, c = 30", "114", "approx",
          lambda: _ratchet(0.999), "reproduced"),
    Claim("knee-formula-fp32", SOFTCAP_DOC, "The bf16 dead-zone", "(ln2/2)(p+2) for fp32, p = 23", "8.664", "approx",
          lambda: _knee_doc("fp32"), "reproduced",
          lambda: f"arithmetic of the formula only; fp32's real knee is atanh(1 − 2^−25) = {_knee_exact('fp32'):.5g}"),
    Claim("knee-search-fp32", SOFTCAP_DOC, "The bf16 dead-zone", "fp32 knee by direct search", "8.665", "approx",
          lambda: _fp32_search_nearest(8.665), "differs", _why_fp32_search),
    Claim("knee-formula-bf16", SOFTCAP_DOC, "The bf16 dead-zone", "(ln2/2)(p+2) gives the bf16 knee 3.47, p = 7",
          "3.47", "approx", lambda: _knee_doc("bf16"), "differs", _why_formula_bf16),
    Claim("knee-bf16", SOFTCAP_DOC, "The bf16 dead-zone", "bf16 knee", "3.47", "approx",
          lambda: _knee_exact("bf16"), "reproduced",
          lambda: f"atanh(1 − 2^−9); first bf16 input whose tanh rounds to 1.0: {_backend_first_saturating('bf16', 'exact'):g}"),
    Claim("horizon-30", SOFTCAP_DOC, "The bf16 dead-zone", "bf16 pre-cap horizon, c = 30", "104", "approx",
          lambda: _horizon(30.0).horizon, "reproduced", _why_horizon(30.0)),
    Claim("horizon-50", SOFTCAP_DOC, "The bf16 dead-zone", "bf16 pre-cap horizon, c = 50", "173", "approx",
          lambda: _horizon(50.0).horizon, "reproduced", _why_horizon(50.0)),
    Claim("zero-grad-120", SOFTCAP_DOC, "The bf16 dead-zone", "bf16 autograd gradient at a = 120, c = 30", "0", "exact",
          lambda: _horizon(30.0).probes[0]["grad_autograd"], "reproduced"),
    Claim("zero-grad-200", SOFTCAP_DOC, "The bf16 dead-zone", "bf16 autograd gradient at a = 200, c = 50", "0", "exact",
          lambda: _horizon(50.0).probes[0]["grad_autograd"], "reproduced"),
    Claim("confident-in-deadzone", SOFTCAP_DOC, "The bf16 dead-zone",
          "a = c·atanh(0.999) lies past the bf16 horizon at c = 30 (114 > 104): margin", "0", "at_least",
          lambda: _ratchet(0.999) - _horizon(30.0).horizon, "reproduced"),
    Claim("pointwise-factor-40", SOFTCAP_DOC, "What the attenuation does not do",
          "pointwise factor 1/(1 − (z/c)²) at pre-cap 40 (c = 30) is over", "4", "at_least",
          lambda: _dynamics_default().pointwise_factor, "reproduced"),
    Claim("end-to-end-slowdown", SOFTCAP_DOC, "What the attenuation does not do",
          "steps to push a wrong class below 1e-3 grow with the cap by about", "1.1", "approx",
          lambda: _dynamics_default().ratio, "reproduced", _why_dynamics),
    Claim("softmax-1", GATES_DOC, "3. Softmax Creates Competing Shares", "softmax([1,2,3])₁", "0.090", "approx",
          lambda: _gates("competition")[0]["softmax"], "reproduced"),
    Claim("softmax-2", GATES_DOC, "3. Softmax Creates Competing Shares", "softmax([1,2,3])₂", "0.245", "approx",
          lambda: _gates("competition")[1]["softmax"], "reproduced"),
    Claim("softmax-3", GATES_DOC, "3. Softmax Creates Competing Shares", "softmax([1,2,3])₃", "0.665", "approx",
          lambda: _gates("competition")[2]["softmax"], "reproduced"),
    Claim("softplus-0", GATES_DOC, "2. Softplus Creates A Positive Strength", "s(0) = log 2", "0.693", "approx",
          lambda: _gates("softplus-0"), "reproduced"),
    Claim("laguna-gate-values", GATES_DOC, "4. What Computational Delta Does Softplus Add?",
          "per-head gate values per token at D = 3072, H_q = 48", "48", "exact",
          lambda: _gates("cost")["gate_values_per_token"], "reproduced"),
    Claim("laguna-channels", GATES_DOC, "4. What Computational Delta Does Softplus Add?",
          "concatenated attention channels per token (H_q·d_h)", "6,144", "exact",
          lambda: _gates("cost")["attention_channels_per_token"], "reproduced"),
    _identity_claim("softplus-prime", "softplus' = σ"),
    _identity_claim("softplus-second", "softplus'' = σ(1 − σ)"),
    _identity_claim("softmax-jacobian", "J = diag(p) − ppᵀ"),
    _identity_claim("softmax-vjp", "z̄ = p ⊙ (u − ⟨u,p⟩)"),
    _identity_claim("softmax-ce", "softmax + CE: ∂L/∂z = p − y"),
    Claim("laguna-backward", GATES_DOC, "8. Backpropagating Through Laguna's Gated Attention",
          "hand-written ∂L/∂A, ∂L/∂G, ∂L/∂Z_g, ∂L/∂W_g, ∂L/∂H agree with autograd (largest error)", "0", "at_most",
          lambda: max(r["max_abs_error"] / max(1.0, r["max_abs_value"]) for r in _gates("laguna")), "reproduced",
          "float64, B=2 T=6 D=32 H_q=4 H_kv=2 d_h=8; error relative to the gradient's size, 16 ulps", _F64_IDENTITY),
    Claim("shift-wd-20", TETHER_DOC, "Choosing wd", "gate-argument shift at wd = 20, β = 6", "0.3", "approx",
          lambda: _shift(20.0), "reproduced",
          "measured under a constant closing push with Adam at lr = 1e-3; the fixed point is β(1 − lr·wd)/wd"),
    Claim("shift-wd-0.5", TETHER_DOC, "Choosing wd", "gate-argument shift at wd = 0.5, β = 6", "12", "approx",
          lambda: _shift(0.5), "reproduced",
          "a constant push on θ; through the gate itself a shift of 12 passes the clamp at arg_min = −8, where the "
          "loss gradient is exactly 0 and the push stops (tether-demo --section clamp)"),
    Claim("equilibrium-lr-independent", TETHER_DOC, "Choosing wd",
          "θ − θ* ≈ 1/wd whatever the LR: worst |offset·wd − 1| over a 150× LR range at wd = 0.5", "0", "at_most",
          lambda: _lr_spread(0.5), "reproduced",
          lambda: (f"'about' read as within 10%; offset·wd = 1 − lr·wd exactly, so at wd = 20 the same LR range "
                   f"gives {_lr_spread(20.0):.3g} (lr·wd up to 3, unstable)"), 0.1),
    Claim("stability-lr-wd", TETHER_DOC, "Choosing wd", "stability requires lr·wd ≪ 1: the largest stable lr·wd",
          "1", "at_most", _stability_boundary, "differs",
          "the spring recurrence d ← (d + lr)(1 − lr·wd) is stable for lr·wd < 2 and monotone below 1; ≪ 1 is "
          "what keeps the offset at 1/wd, not what keeps it stable", 0.0),
    *gate_claims(Claim, TETHER_DOC),
    Claim("experiment-dead-zone-cost", SOFTCAP_DOC, "Note: the end-to-end measurement left open",
          "end to end, the bf16 dead zone costs no steps: paired per-seed bf16-eager ÷ patched steps-to-recover, "
          "largest lower end of its 95% interval over depths and shifts, at most", "1", "at_most", _experiment_low,
          "differs", _why_experiment, 0.0),
    Claim("tether-experiment-collapse", TETHER_DOC, "The problem",
          "end to end, the TetherGate patch leaves fewer gates shut than plain gates: paired plain − tether share of "
          "gates closed when the branch becomes needed, lower end of its 95% interval, above", "0", "at_least",
          tether_closed_low, "differs", why_tether, 0.0),
    Claim("tether-collapse-gates-only", TETHER_DOC, "The problem",
          "end to end, where plain gates do close (phase A trains only the gates), the TetherGate patch leaves fewer "
          "gates shut than plain gates: paired plain − tether share of gates closed when the branch becomes needed, "
          "lower end of its 95% interval, above", "0", "at_least", lambda: tether_closed_low("tether-collapse"),
          "reproduced", lambda: why_tether("tether-collapse"), 0.0),
)
