"""The exact backward law of tanh soft-capping, and the ratchet it implies.

softcapgrad.md, "The exact gradient identity": for z = c·tanh(a/c),

    dz/da = 1 − (z/c)² = sech²(a/c)            (exact)
    sech²(x) → 4·exp(−2x)  as x → ∞            (asymptote; relative error −2e^{−2x} + O(e^{−4x}))

and "The output is bounded but the input is not": to express z = f·c the pre-activation must
reach a = c·atanh(f), where the gradient is 1 − f².
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from softcapgrad.core.report import Report, Table
from softcapgrad.laws.saturation import MAX_A_OVER_C, knee_exact, sech2


def attenuation_from_output(z: np.ndarray, c: float) -> np.ndarray:
    """dz/da read off the output: 1 − (z/c)²."""
    return 1.0 - (z / c) ** 2


def attenuation_asymptote(x: np.ndarray) -> np.ndarray:
    """4·exp(−2x), the large-x form of sech²(x)."""
    return 4.0 * np.exp(-2.0 * np.asarray(x, dtype=np.float64))


@dataclass(frozen=True)
class IdentityCheck:
    cap: float
    points: int
    lo: float  # range of a, in units of c
    hi: float
    max_abs_error_output_form: float  # |1 − (z/c)² − autograd|
    max_abs_error_sech2_form: float  # |sech²(a/c) − autograd|

    @property
    def max_abs_error(self) -> float:
        return max(self.max_abs_error_output_form, self.max_abs_error_sech2_form)


def check_identity(c: float, points: int, lo: float = -8.0, hi: float = 8.0) -> IdentityCheck:
    """Both closed forms against torch autograd of c·tanh(a/c), float64, on a uniform grid."""
    import torch

    a = torch.linspace(lo * c, hi * c, points, dtype=torch.float64, requires_grad=True)
    z = c * torch.tanh(a / c)
    (grad,) = torch.autograd.grad(z.sum(), a)
    a_np, z_np, g_np = a.detach().numpy(), z.detach().numpy(), grad.numpy()
    return IdentityCheck(
        cap=c,
        points=points,
        lo=lo,
        hi=hi,
        max_abs_error_output_form=float(np.max(np.abs(attenuation_from_output(z_np, c) - g_np))),
        max_abs_error_sech2_form=float(np.max(np.abs(sech2(a_np / c) - g_np))),
    )


@dataclass(frozen=True)
class Attenuation:
    a_over_c: float
    attenuation: float  # sech²(a/c)
    asymptote: float  # 4·exp(−2a/c)
    asymptote_rel_error: float  # (asymptote − attenuation)/attenuation
    pointwise_slowdown: float  # 1/attenuation


def attenuation_table(multiples: list[float]) -> list[Attenuation]:
    """sech²(a/c), its asymptote 4·exp(−2|a|/c) and the asymptote's relative error (1 + e^{−2|x|})² − 1.

    The relative error is formed from e^{−2|x|} directly, so it is exact in float64 where the
    subtraction of two nearly equal numbers would cancel; |a/c| ≤ MAX_A_OVER_C keeps every figure finite.
    """
    x = np.abs(np.asarray(multiples, dtype=np.float64))
    s, asym = sech2(x), attenuation_asymptote(x)
    e = np.exp(-2.0 * x)
    rel = np.expm1(2.0 * np.log1p(e))
    return [
        Attenuation(float(m), float(si), float(ai), float(ri), float(np.cosh(xi) ** 2))
        for m, xi, si, ai, ri in zip(multiples, x, s, asym, rel)
    ]


@dataclass(frozen=True)
class RatchetLevel:
    cap: float
    f: float  # z = f·c
    a: float  # c·atanh(f)
    a_over_c: float
    gradient: float  # 1 − f²
    fall: float  # gradient at a = 0 over gradient here: 1/(1 − f²)


def ratchet(c: float, levels: list[float]) -> list[RatchetLevel]:
    """Pre-activation and gradient needed to express z = f·c, per level f in [0, 1)."""
    f = np.asarray(levels, dtype=np.float64)
    a = c * np.arctanh(f)
    g = 1.0 - f * f
    return [RatchetLevel(c, float(fi), float(ai), float(ai / c), float(gi), float(1.0 / gi)) for fi, ai, gi in zip(f, a, g)]


# --- reports ---------------------------------------------------------------------------------


def attenuation_curve(stop: float = 10.0, n: int = 401) -> list[dict]:
    x = np.linspace(0.0, stop, n)
    return [{"a_over_c": float(xi), "attenuation": float(si), "asymptote": float(ai)}
            for xi, si, ai in zip(x, sech2(x), attenuation_asymptote(x))]


def format_horizons(names: tuple[str, ...] = ("bfloat16", "float16", "float32", "float8_e4m3fn", "float8_e5m2")) -> list[dict]:
    """Where each format's tanh saturates, a/c = atanh(1 − ε₋/2), for marking on the attenuation curve."""
    from softcapgrad.laws import formats

    return [{"dtype": n, "a_over_c": knee_exact(formats.facts(formats.resolve(n)).spacing_below_one)} for n in names]


def identity_answer(check: IdentityCheck, rows: list[dict]) -> tuple[str, ...]:
    ulps = check.max_abs_error / 2.0**-52
    shown = rows[:3]
    kept = ", ".join(f"{r['attenuation']:.3g} at a = {r['a_over_c']:g}c" for r in shown)
    inputs = ", ".join(f"{r['a']:g}" for r in shown)
    return (
        f"The gradient dz/da = 1 − (z/c)² = sech²(a/c) is exact: torch autograd agrees with both closed forms to within "
        f"{check.max_abs_error:.2g} ({ulps:.2g} float64 ulps of 1.0) over {check.points:,} points on "
        f"[{check.lo:g}c, {check.hi:g}c], c = {check.cap:g}.",
        f"The cap passes on this fraction of the gradient: {kept} (a = {inputs}).",
    )


def identity_report(c: float, points: int, lo: float, hi: float, multiples: list[float], curve: bool = False) -> Report:
    check = check_identity(c, points, lo, hi)
    rows = [
        {
            "a_over_c": r.a_over_c,
            "a": r.a_over_c * c,
            "attenuation": r.attenuation,
            "asymptote": r.asymptote,
            "asymptote_rel_error": r.asymptote_rel_error,
            "pointwise_slowdown": r.pointwise_slowdown,
        }
        for r in attenuation_table(multiples)
    ]
    errors = [
        {"closed_form": "1 − (z/c)²", "max_abs_error": check.max_abs_error_output_form},
        {"closed_form": "sech²(a/c)", "max_abs_error": check.max_abs_error_sech2_form},
    ]
    return Report(
        command="identity",
        params={"cap": c, "points": points, "range": [lo, hi], "at": multiples},
        tables=(
            Table("rows", "dz/da = sech²(a/c): attenuation and its asymptote 4·exp(−2a/c)", rows,
                  ("a_over_c", "a", "attenuation", "pointwise_slowdown"), wide=("asymptote", "asymptote_rel_error")),
            Table("closed_forms", f"closed forms vs torch autograd, float64, {points} points on [{lo:g}c, {hi:g}c]", errors),
            *([Table("curve", "sech²(a/c) and 4·exp(−2a/c) on a grid", attenuation_curve(), show=False),
               Table("horizons", "x_knee per format, in units of c", format_horizons(), show=False)] if curve else []),
        ),
        notes=(
            "attenuation is smallest where |a| is largest: the most confident logit learns slowest",
            "asymptote_rel_error = (4·exp(−2a/c) − sech²(a/c))/sech²(a/c) ≈ 2·exp(−2a/c), shrinking with a",
        ),
        figures={"max_abs_error": check.max_abs_error},
        answer=identity_answer(check, rows),
    )


def ratchet_answer(rows: list[dict]) -> tuple[str, ...]:
    c = rows[0]["cap"]
    first = [r for r in rows if r["cap"] == c]
    zs = ", ".join(f"{r['f']:g}c" for r in first)
    inputs = ", ".join(f"{r['a']:.4g}" for r in first)
    gradients = ", ".join(f"{r['gradient']:.3g}" for r in first)
    sentences = [
        f"To express z = {zs} at c = {c:g} the pre-cap input must reach a = {inputs}; "
        f"the gradient there is only {gradients} (1 − f²).",
    ]
    if len({r["cap"] for r in rows}) > 1:
        sentences.append("a = c·atanh(f) grows in proportion to the cap; the gradient 1 − f² does not depend on it.")
    return tuple(sentences)


def ratchet_report(caps: list[float], levels: list[float], curve: bool = False) -> Report:
    rows = [
        {"cap": r.cap, "f": r.f, "a": r.a, "a_over_c": r.a_over_c, "gradient": r.gradient, "fall": r.fall}
        for c in caps
        for r in ratchet(c, levels)
    ]
    return Report(
        command="ratchet",
        params={"caps": caps, "levels": levels},
        tables=(
            Table("rows", "to express z = f·c the input must reach a = c·atanh(f); the gradient there is 1 − f²", rows),
            *([Table("curve", "a and the gradient over f", [asdict(r) for c in caps for r in ratchet(c, list(1.0 - np.logspace(-0.3, -3.5, 400)))],
                     show=False)] if curve else []),
        ),
        notes=("fall = gradient at a = 0 divided by gradient at a: how much slower the input grows there",),
        answer=ratchet_answer(rows),
    )
