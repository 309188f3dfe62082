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
  inside the tolerance. Both runs are held to the tolerance at the pre-cap scale M (verdict.model_scale):
  scaled by the capped logits (at most c, while the pre-cap logits reach 4c), the capped run's own
  rounding reached the whole tolerance on some seeds (Gemma 3n and Gemma 2 with query_pre_attn_scalar 64:
  up to 1.06 of it over seeds 0 to 5; at the pre-cap M, at most 0.39).
  The modeling code's own fp32 steps (an attention softmax asked for in float32) stay fp32 in the
  copy, so the figure is a lower bound on the noise; MoE experts run their plain loop there (torch's
  grouped matmul takes no float64), and routers stay fp32 (Inkling 2's casts its input to fp32
  whatever the model's format).
- **Norm exchange**: every two norms of one module with gains of the same shape (a layer's input, post-attention,
  pre- and post-feed-forward norms; an attention's query and key norms), their gains exchanged, move the capped
  log-probabilities by at least ``EXCHANGE_MIN`` = 100 times the whole-model fp32 tolerance: two decades above
  it, where an fp32 engine's own rounding stays within ``NOISE_MAX`` of it. (A query and a key norm under rotary
  positions differ only where a rotated pair of channels holds unequal gain ratios, so their exchange moves less
  than the layer norms': 925 tolerances in Beam at seed 0.) Where two norms hold the same
  gains (the classes' init: every gain 1, or 0 where the norm multiplies by 1 + w) exchanging them changes
  nothing, so a converter that exchanges them passes: such pairs are counted as identical, and none may be (the
  builder draws each norm's gains apart, modeltypes.NORM_SPREAD). A pair with distinct gains whose exchange moves the log-probs by less than the tolerance is
  a symmetry of the model (a query and a key norm without rotary positions: q·k sums g_q g_k q̂ k̂ channel by
  channel), so an engine that exchanged them computes the same model: counted, not judged.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from softcapgrad.engines.forward import reference as ref
from softcapgrad.engines.forward import norms, verdict

NORM_MIN = 100.0  # smallest mean(x²)/ε allowed at any norm's input
CAP_MIN = 1000.0  # smallest cap effect allowed, in units of that cap's fp32 tolerance
EXCHANGE_MIN = 100.0  # smallest effect of exchanging two sibling norms' gains, in whole-model fp32 tolerances
NOISE_MAX = 0.5  # largest fp32-against-fp64 difference allowed, in units of the whole-model fp32 tolerance
NOISE_VARIANTS = ("capped", "final off")  # the runs whole-model comparisons judge (final cap by reference; attention)


@dataclass(frozen=True)
class Conditioning:
    model: str
    norm: str  # the module with the smallest ratio
    norm_ratio: float  # its smallest mean(x²)/ε over positions
    attention: float | None  # the attention cap's effect / its tolerance (None: no attention cap judged)
    final: float | None  # the final cap's effect / its tolerance (None: no final cap)
    noise: float  # fp32 against fp64, over the whole-model tolerance
    norms: int  # how many norm modules were hooked
    exchange: float | None = None  # the smallest effect of exchanging two sibling norms' gains / the tolerance
    exchanged: str = ""  # that pair (None above: no two siblings share a gain shape, or every pair is symmetric)
    symmetric: int = 0  # pairs with distinct gains whose exchange moved the log-probs by less than the tolerance
    identical: int = 0  # pairs whose gains are equal bit for bit: their exchange changes nothing
    pairs: int = 0  # sibling pairs of norms with gains of one shape

    @property
    def healthy(self) -> dict[str, bool]:
        return {"norms": self.norm_ratio >= NORM_MIN,
                "attention cap": self.attention is None or self.attention >= CAP_MIN,
                "final cap": self.final is None or self.final >= CAP_MIN,
                "fp32 noise": self.noise <= NOISE_MAX,
                "norm exchange": self.identical == 0 and (self.exchange is None or self.exchange >= EXCHANGE_MIN)}

    def as_dict(self) -> dict:
        return {"norm": self.norm, "norm_ratio": self.norm_ratio, "attention": self.attention, "final": self.final,
                "noise": self.noise, "norms": self.norms, "exchange": self.exchange, "exchanged": self.exchanged,
                "symmetric": self.symmetric, "identical": self.identical, "pairs": self.pairs, "healthy": self.healthy}


def norm_ratios(model, ids: np.ndarray) -> dict[str, float]:
    """Each norm's smallest mean(x²)/ε over the positions of one capped forward."""
    found = norms.norm_modules(model)
    worst: dict[str, float] = {}

    def hook(name, eps):
        def record(module, args):
            if args and hasattr(args[0], "detach"):
                x = args[0].detach().double()
                ms = float((x * x).mean(dim=-1).min())
                worst[name] = min(worst.get(name, np.inf), ms / eps)
        return record

    handles = [m.register_forward_pre_hook(hook(n, eps)) for n, (m, eps) in found.items()]
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
            tol = verdict.tolerance(verdict.FP32, verdict.model_scale(reference, with_cap), reference.width)
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
    tol = verdict.tolerance(verdict.FP32, verdict.model_scale(reference), reference.width)
    return max(_effect(reference.logits[v], e) / tol for v, e in exact.items())
    return worst


def sibling_pairs(model) -> list[tuple[str, str]]:
    """Pairs of norms under one parent module whose gains have the same shape."""
    gains = {n: m.weight for n, (m, _) in norms.norm_modules(model).items()
             if getattr(m, "weight", None) is not None and m.weight.dim() == 1}
    names = sorted(gains)
    return [(a, b) for i, a in enumerate(names) for b in names[i + 1:]
            if a.rpartition(".")[0] == b.rpartition(".")[0] and gains[a].shape == gains[b].shape]


def norm_exchanges(model, ids: np.ndarray, reference) -> tuple[float | None, str, int, int, int]:
    """The smallest capped log-probability effect of exchanging two sibling norms' gains, over the whole-model fp32
    tolerance, and that pair, among the pairs whose exchange moves them by the tolerance or more; and how many
    moved them by less (symmetries), and how many hold equal gains (not run: their exchange is no change), of how many pairs."""
    import torch

    capped = reference.logits["capped"]
    tol = verdict.tolerance(verdict.FP32, verdict.model_scale(reference), reference.width)
    modules = dict(model.named_modules())
    worst: tuple[float | None, str] = (None, "")
    symmetric = identical = 0
    pairs = sibling_pairs(model)
    for a, b in pairs:
        wa, wb = modules[a].weight, modules[b].weight
        if torch.equal(wa, wb):
            identical += 1
            continue
        saved = wa.detach().clone()
        with torch.no_grad():
            wa.copy_(wb)
            wb.copy_(saved)
        try:
            effect = _effect(ref.logits(model, ids), capped) / tol
        finally:
            with torch.no_grad():
                wb.copy_(wa)
                wa.copy_(saved)
        if effect < 1:
            symmetric += 1
        elif worst[0] is None or effect < worst[0]:
            worst = (effect, f"{a} ↔ {b.rpartition('.')[2]}")
    return (*worst, symmetric, identical, len(pairs))


def measure(model, ids: np.ndarray, reference, label: str) -> Conditioning:
    ratios = norm_ratios(model, ids)
    name = min(ratios, key=ratios.get) if ratios else "none found"
    effects = cap_effects(reference)
    return Conditioning(label, name, float(ratios.get(name, np.inf)), effects["attention"], effects["final"],
                        fp64_noise(model, ids, reference), len(ratios), *norm_exchanges(model, ids, reference))


def table(models: list[dict], generation) -> list[str]:
    """The Markdown lines of each model's conditioning as parity.json holds it, with the bound each must keep
    (``generation``: the builder generation of a model entry)."""
    lines = ["## Conditioning of the models", "",
             f"Each model as built: the smallest mean square entering any norm over its epsilon (at least "
             f"{NORM_MIN:g}), each cap's largest log-prob effect over the fp32 tolerance its verdict uses "
             f"(at least {CAP_MIN:g}), and fp32 against the same weights in fp64 over the whole-model "
             f"tolerance (at most {NOISE_MAX:g}). A figure that misses its bound is marked (!). The last "
             f"column: the smallest effect of exchanging two norms of one module (their gains of one shape) over the "
             f"whole-model tolerance (at least {EXCHANGE_MIN:g}; norms with equal gains, whose exchange "
             f"nothing here can see, count as 0).", "",
             "| model type | worst norm | its ms/eps | attention cap Δ/tol | final cap Δ/tol | fp32 noise/tol "
             "| norm exchange Δ/tol |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for m in models:
        c = m.get("conditioning")
        if not isinstance(c, dict):
            lines.append(f"| {m['model']} | not measured (generation {generation(m)}) | | | | | |")
            continue
        ok = c.get("healthy", {})
        names = (("norm_ratio", "norms"), ("attention", "attention cap"), ("final", "final cap"),
                 ("noise", "fp32 noise"), ("exchange", "norm exchange"))
        mark = {key: "" if ok.get(name, True) else " (!)" for key, name in names}
        lines.append(f"| {m['model']} | {c['norm']} | {_g(c['norm_ratio'])}{mark['norm_ratio']} | "
                     f"{_g(c['attention']) or 'not set'}{mark['attention']} | {_g(c['final']) or 'not set'}"
                     f"{mark['final']} | {_g(c['noise'])}{mark['noise']} | {_exchange(c)}{mark['exchange']} |")
    return lines + [""]


def _exchange(c: dict) -> str:
    """The exchange figure: 0 where two norms hold equal gains; the symmetric pairs (no change) said apart."""
    if "pairs" not in c:
        return "not measured"
    if not c["pairs"]:
        return "no pairs"
    same = f" ({c['symmetric']} symmetric)" if c["symmetric"] else ""
    return ("0 (equal gains)" if c["identical"] else _g(c["exchange"]) or "none judged") + same


def _g(value) -> str:
    return "" if value is None else f"{value:.3g}"
