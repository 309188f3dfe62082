"""Is a parity model numerically healthy? Three figures per model, each against the bound it must keep.

- **Norms**: every normalisation module (any module holding a float ``eps``, ``variance_epsilon`` or
  ``epsilon``) sees, at each position, an input whose mean square is at least ``NORM_MIN`` times its
  epsilon. Where x² averages near ε, the output depends on ε itself: an engine that adds ε elsewhere, or
  holds it in another format, moves the logits for reasons that have nothing to do with the caps.
- **Caps**: each cap moves the log-probabilities by at least ``CAP_MIN`` times the fp32 tolerance the
  verdict judges that cap with (verdict.py), so an fp32 engine that drops or alters a cap lands far
  outside it. The attention cap is compared as the verdict compares it: the model without its final cap,
  with and without the attention cap (where transformers never applies it, with it forced on); the final
  cap: the model with and without it, against the final cap's own tolerance K·u·c.
- **fp32 noise**: the same weights run in fp64 (a copy, ``model.double()``) against fp32, the largest
  log-probability difference over the whole-model tolerance (the γ_n bound of verdict.py), for the two
  runs the whole-model comparisons judge: the model as it is, and without its final cap. It must stay
  within ``NOISE_MAX`` = 0.5 of it: a correct fp32 engine's own rounding is another draw of the same
  noise, so its distance from the reference is at most the sum of two such draws, which then stays
  inside the tolerance. A tighter bound (0.1) is not kept by any spread of the weights tried
  (initializer_range 0.02 to 0.125): with the attention cap bound, scores reach 4c, and the pre-cap
  logits reach 4c while the capped comparison's tolerance is scaled by the capped logits (at most c).
  The modeling code's own fp32 steps (an attention softmax asked for in float32) stay fp32 in the
  copy, so the figure is a lower bound on the noise; MoE experts run their plain loop there (torch's
  grouped matmul takes no float64), and routers stay fp32 (Inkling 2's casts its input to fp32
  whatever the model's format).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from softcapgrad.engines import reference as ref
from softcapgrad.engines import verdict

NORM_MIN = 100.0  # smallest mean(x²)/ε allowed at any norm's input
CAP_MIN = 1000.0  # smallest cap effect allowed, in units of that cap's fp32 tolerance
NOISE_MAX = 0.5  # largest fp32-against-fp64 difference allowed, in units of the whole-model fp32 tolerance
NOISE_VARIANTS = ("capped", "final off")  # the runs whole-model comparisons judge (final cap by reference; attention)
EPS_FIELDS = ("variance_epsilon", "eps", "epsilon")


@dataclass(frozen=True)
class Conditioning:
    model: str
    norm: str  # the module with the smallest ratio
    norm_ratio: float  # its smallest mean(x²)/ε over positions
    attention: float | None  # the attention cap's effect / its tolerance (None: no attention cap judged)
    final: float | None  # the final cap's effect / its tolerance (None: no final cap)
    noise: float  # fp32 against fp64, over the whole-model tolerance
    norms: int  # how many norm modules were hooked

    @property
    def healthy(self) -> dict[str, bool]:
        return {"norms": self.norm_ratio >= NORM_MIN,
                "attention cap": self.attention is None or self.attention >= CAP_MIN,
                "final cap": self.final is None or self.final >= CAP_MIN,
                "fp32 noise": self.noise <= NOISE_MAX}

    def as_dict(self) -> dict:
        return {"norm": self.norm, "norm_ratio": self.norm_ratio, "attention": self.attention, "final": self.final,
                "noise": self.noise, "norms": self.norms, "healthy": self.healthy}


def _epsilon(module) -> float | None:
    for name in EPS_FIELDS:
        value = getattr(module, name, None)
        if isinstance(value, float) and not isinstance(value, bool) and value > 0:
            return value
    return None


def norm_modules(model) -> dict:
    """name -> (module, ε) for every module that holds a float epsilon, outermost only where they nest."""
    found = {name: (m, _epsilon(m)) for name, m in model.named_modules() if _epsilon(m) is not None}
    return {n: v for n, v in found.items() if not any(n.startswith(o + ".") for o in found if o != n)}


def norm_ratios(model, ids: np.ndarray) -> dict[str, float]:
    """Each norm's smallest mean(x²)/ε over the positions of one capped forward."""
    norms = norm_modules(model)
    worst: dict[str, float] = {}

    def hook(name, eps):
        def record(module, args):
            if args and hasattr(args[0], "detach"):
                x = args[0].detach().double()
                ms = float((x * x).mean(dim=-1).min())
                worst[name] = min(worst.get(name, np.inf), ms / eps)
        return record

    handles = [m.register_forward_pre_hook(hook(n, eps)) for n, (m, eps) in norms.items()]
    try:
        ref.logits(model, ids)
    finally:
        for h in handles:
            h.remove()
    return worst


def _effect(a: np.ndarray, b: np.ndarray) -> float:
    return verdict.error(verdict.log_probs(a), verdict.log_probs(b)).value


def cap_effects(reference) -> dict[str, float | None]:
    """Each cap's largest log-probability effect over the fp32 tolerance the verdict judges it with."""
    lg, caps = reference.logits, reference.caps
    out: dict[str, float | None] = {"attention": None, "final": None}
    if caps["final"] is not None:
        out["final"] = _effect(lg["capped"], lg["final off"]) / verdict.tolerance(verdict.FP32, caps["final"])
    if caps["attention"] is not None:
        with_cap = lg["final off"] if reference.applied["attention"] else lg.get("attention forced")
        if with_cap is not None:
            tol = verdict.tolerance(verdict.FP32, float(np.abs(with_cap).max()), reference.width)
            out["attention"] = _effect(with_cap, lg["uncapped"]) / tol
    return out


def fp64_noise(model, ids: np.ndarray, reference) -> float:
    """fp32 against a float64 copy of the same weights (capped), over the whole-model fp32 tolerance."""
    wide = copy.deepcopy(model).double()
    for m in wide.modules():  # torch's grouped matmul of MoE experts takes no float64: their plain loop does
        config = getattr(m, "config", None)
        if getattr(config, "_experts_implementation", None) not in (None, "eager"):
            config._experts_implementation = "eager"
        if type(m).__name__.endswith("Router"):  # routers that cast their input to fp32 (Inkling 2) stay fp32
            m.float()
    try:
        exact = {v: ref.logits(wide, ids, off=ref.VARIANTS[v]) for v in NOISE_VARIANTS}
    finally:
        del wide
    worst = 0.0
    for v, e in exact.items():
        fp32 = reference.logits[v]
        tol = verdict.tolerance(verdict.FP32, float(np.abs(fp32).max()), reference.width)
        worst = max(worst, _effect(fp32, e) / tol)
    return worst


def measure(model, ids: np.ndarray, reference, label: str) -> Conditioning:
    ratios = norm_ratios(model, ids)
    name = min(ratios, key=ratios.get) if ratios else "none found"
    effects = cap_effects(reference)
    return Conditioning(label, name, float(ratios.get(name, np.inf)), effects["attention"], effects["final"],
                        fp64_noise(model, ids, reference), len(ratios))
