"""Softmax versus softplus, and the Laguna per-head softplus attention gate, forward and backward.

softmax-softplus-gates.md. The laws checked here against torch autograd:

    softplus(x) = log(1 + eˣ),  softplus' = σ(x),  softplus'' = σ(x)(1 − σ(x)) > 0        (§2, §5)
    ∂p_i/∂z_j = p_i(δ_ij − p_j),  J = diag(p) − ppᵀ,  z̄ = p ⊙ (u − ⟨u, p⟩)                  (§6)
    softmax + cross-entropy:  ∂L/∂z = p − y                                                 (§7)
    gated attention  A' = A·G,  G = softplus(H W_g):                                          (§8)
        ∂L/∂A = U·G,  ∂L/∂G_h = Σ_d U_{h,d} A_{h,d},  Z̄_g = Ḡ ⊙ σ(Z_g),
        ∂L/∂W_g = Hᵀ Z̄_g,  ∂L/∂H = ∂L/∂H|attention + Z̄_g W_gᵀ
    softplus(x) = max(x, 0) + log1p(e^{−|x|})  (stable form, §9)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F

from softcapgrad.laws import formats
from softcapgrad.core.report import Report, Table
from softcapgrad.core.names import GATE_SECTIONS as SECTIONS


def softplus(x: torch.Tensor) -> torch.Tensor:
    """log(1 + eˣ) in the stable form max(x, 0) + log1p(e^{−|x|})."""
    return torch.clamp(x, min=0) + torch.log1p(torch.exp(-torch.abs(x)))


def softplus_at(x: float) -> float:
    return float(softplus(torch.tensor([x], dtype=torch.float64))[0])


def softplus_naive(x: torch.Tensor) -> torch.Tensor:
    return torch.log1p(torch.exp(x))


def sigmoid_two_branch(x: torch.Tensor) -> torch.Tensor:
    """σ(x) as 1/(1 + e^{−x}) for x ≥ 0 and eˣ/(1 + eˣ) for x < 0: no exp of a positive number."""
    e = torch.exp(-torch.abs(x))
    return torch.where(x >= 0, 1 / (1 + e), e / (1 + e))


def softmax_vjp(p: torch.Tensor, u: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """z̄ = p ⊙ (u − ⟨u, p⟩) along ``dim``: the Jacobian-vector product without the Jacobian."""
    return p * (u - (u * p).sum(dim=dim, keepdim=True))


# --- §1 competition versus independence ------------------------------------------------------


def competition(logits: list[float], raise_index: int, delta: float) -> list[dict]:
    z = torch.tensor(logits, dtype=torch.float64)
    raised = z.clone()
    raised[raise_index] += delta
    p, p2 = torch.softmax(z, 0), torch.softmax(raised, 0)
    s, s2 = softplus(z), softplus(raised)
    return [
        {"i": i, "logit": float(z[i]), "logit_after": float(raised[i]), "softmax": float(p[i]),
         "softmax_after": float(p2[i]), "softplus": float(s[i]), "softplus_after": float(s2[i])}
        for i in range(len(logits))
    ]


def asymptotes(xs: list[float]) -> list[dict]:
    """softplus against eˣ (x ≪ 0) and against x (x ≫ 0)."""
    x = torch.tensor(xs, dtype=torch.float64)
    s = softplus(x)
    return [
        {"x": float(xi), "softplus": float(si), "exp_x": float(math.exp(xi)), "rel_error_vs_exp": float(si / math.exp(xi) - 1),
         "abs_error_vs_x": float(si - xi)}
        for xi, si in zip(x, s)
    ]


# --- §2 backward laws against autograd -------------------------------------------------------


def backward_laws(seed: int, n: int = 4096, k: int = 7) -> list[dict]:
    gen = torch.Generator().manual_seed(seed)
    x = (5 * torch.randn(n, dtype=torch.float64, generator=gen)).requires_grad_(True)
    (d1,) = torch.autograd.grad(F.softplus(x, threshold=1e9).sum(), x, create_graph=True)
    (d2,) = torch.autograd.grad(d1.sum(), x)
    sig = torch.sigmoid(x.detach())
    rows = [
        ("softplus' = σ", (d1.detach() - sig).abs().max(), n),
        ("softplus'' = σ(1 − σ)", (d2 - sig * (1 - sig)).abs().max(), n),
    ]
    min_curvature = float(d2.min())

    z = torch.randn(k, dtype=torch.float64, generator=gen)
    u = torch.randn(k, dtype=torch.float64, generator=gen)
    p = torch.softmax(z, 0)
    # the Jacobian row by row and the VJP through scalar outputs: autograd then needs no grad_outputs,
    # whose shape check imports sympy (half a second) on first use
    zr = z.clone().requires_grad_(True)
    jac = torch.stack([torch.autograd.grad(torch.softmax(zr, 0)[i], zr)[0] for i in range(k)])
    rows.append(("J = diag(p) − ppᵀ", (jac - (torch.diag(p) - torch.outer(p, p))).abs().max(), k * k))
    (vjp,) = torch.autograd.grad((torch.softmax(zr, 0) * u).sum(), zr)
    rows.append(("z̄ = p ⊙ (u − ⟨u,p⟩)", (vjp - softmax_vjp(p, u)).abs().max(), k))

    y = torch.softmax(torch.randn(k, dtype=torch.float64, generator=gen), 0)  # a soft target
    (ce,) = torch.autograd.grad(-(y * torch.log_softmax(zr, 0)).sum(), zr)
    rows.append(("softmax + CE: ∂L/∂z = p − y", (ce - (p - y)).abs().max(), k))
    out = [{"identity": name, "max_abs_error": float(err), "points": count} for name, err, count in rows]
    out[1]["min_value"] = min_curvature
    return out


# --- §3 the Laguna gated attention block -----------------------------------------------------


@dataclass(frozen=True)
class Shape:
    B: int = 2
    T: int = 6
    D: int = 32
    H_q: int = 4
    H_kv: int = 2
    d_h: int = 8


def _weights(shape: Shape, seed: int, dtype=torch.float64) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    D, Hq, Hkv, dh = shape.D, shape.H_q, shape.H_kv, shape.d_h

    def w(*size: int) -> torch.Tensor:
        return torch.randn(*size, dtype=dtype, generator=gen) / math.sqrt(size[0])

    return {
        "H": torch.randn(shape.B, shape.T, D, dtype=dtype, generator=gen),
        "W_Q": w(D, Hq * dh), "W_K": w(D, Hkv * dh), "W_V": w(D, Hkv * dh),
        "W_g": w(D, Hq), "W_O": w(Hq * dh, D),
        "R": torch.randn(shape.B, shape.T, D, dtype=dtype, generator=gen),  # L = Σ Y ⊙ R
    }


def gated_attention(p: dict[str, torch.Tensor], shape: Shape) -> dict[str, torch.Tensor]:
    """Causal grouped-query attention, then the per-head softplus gate, then W_O (§4 and §8)."""
    B, T, Hq, Hkv, dh = shape.B, shape.T, shape.H_q, shape.H_kv, shape.d_h
    H = p["H"]
    Q = (H @ p["W_Q"]).view(B, T, Hq, dh).transpose(1, 2)  # B,Hq,T,dh
    K = (H @ p["W_K"]).view(B, T, Hkv, dh).transpose(1, 2)
    V = (H @ p["W_V"]).view(B, T, Hkv, dh).transpose(1, 2)
    Kr, Vr = K.repeat_interleave(Hq // Hkv, 1), V.repeat_interleave(Hq // Hkv, 1)
    mask = torch.full((T, T), float("-inf"), dtype=H.dtype).triu(1)
    P = torch.softmax(Q @ Kr.transpose(-1, -2) / math.sqrt(dh) + mask, -1)
    A = (P @ Vr).transpose(1, 2)  # B,T,Hq,dh
    Z_g = H @ p["W_g"]  # B,T,Hq
    G = F.softplus(Z_g)
    A_gated = A * G.unsqueeze(-1)
    Y = A_gated.reshape(B, T, Hq * dh) @ p["W_O"]
    return {"Q": Q, "K": K, "V": V, "Kr": Kr, "Vr": Vr, "P": P, "A": A, "Z_g": Z_g, "G": G, "Y": Y}


def gate_backward_by_hand(p: dict[str, torch.Tensor], f: dict[str, torch.Tensor], shape: Shape) -> dict[str, torch.Tensor]:
    """Every gradient of L = Σ Y ⊙ R written out, attention branch included."""
    B, T, Hq, Hkv, dh = shape.B, shape.T, shape.H_q, shape.H_kv, shape.d_h
    group = Hq // Hkv
    U = (p["R"] @ p["W_O"].T).view(B, T, Hq, dh)  # ∂L/∂A'
    dA = U * f["G"].unsqueeze(-1)  # ∂L/∂A = U·G
    dG = (U * f["A"]).sum(-1)  # ∂L/∂G_h = Σ_d U·A
    dZ = dG * torch.sigmoid(f["Z_g"])  # through softplus
    H2 = p["H"].reshape(B * T, -1)
    dW_g = H2.T @ dZ.reshape(B * T, Hq)  # Hᵀ Z̄_g
    dH_gate = dZ @ p["W_g"].T  # Z̄_g W_gᵀ
    # attention branch: A = P V, P = softmax(S), S = Q Kᵀ/√d_h
    dAh = dA.transpose(1, 2)  # B,Hq,T,dh
    dP = dAh @ f["Vr"].transpose(-1, -2)
    dVr = f["P"].transpose(-1, -2) @ dAh
    dS = softmax_vjp(f["P"], dP) / math.sqrt(dh)
    dQ = dS @ f["Kr"]
    dKr = dS.transpose(-1, -2) @ f["Q"]
    dK = dKr.view(B, Hkv, group, T, dh).sum(2)  # each K/V head serves `group` query heads
    dV = dVr.view(B, Hkv, group, T, dh).sum(2)

    def flat(t: torch.Tensor, heads: int) -> torch.Tensor:
        return t.transpose(1, 2).reshape(B, T, heads * dh)

    dH_attn = flat(dQ, Hq) @ p["W_Q"].T + flat(dK, Hkv) @ p["W_K"].T + flat(dV, Hkv) @ p["W_V"].T
    return {"A": dA, "G": dG, "Z_g": dZ, "W_g": dW_g, "H|gate": dH_gate, "H|attention": dH_attn, "H": dH_attn + dH_gate}


def gate_backward_by_autograd(p: dict[str, torch.Tensor], shape: Shape) -> dict[str, torch.Tensor]:
    leaves = {k: v.clone().requires_grad_(k != "R") for k, v in p.items()}
    f = gated_attention(leaves, shape)
    for name in ("A", "G", "Z_g"):
        f[name].retain_grad()
    (f["Y"] * leaves["R"]).sum().backward()
    # the two branches into H separately: the gate branch alone, the attention branch alone
    H = leaves["H"].detach().requires_grad_(True)
    gate_only = (F.softplus(H @ p["W_g"]).unsqueeze(-1) * f["A"].detach()).reshape(shape.B, shape.T, -1) @ p["W_O"]
    (dH_gate,) = torch.autograd.grad((gate_only * p["R"]).sum(), H)
    return {"A": f["A"].grad, "G": f["G"].grad, "Z_g": f["Z_g"].grad, "W_g": leaves["W_g"].grad,
            "H|gate": dH_gate, "H|attention": leaves["H"].grad - dH_gate, "H": leaves["H"].grad}


def laguna_check(shape: Shape, seed: int) -> list[dict]:
    p = _weights(shape, seed)
    hand = gate_backward_by_hand(p, gated_attention(p, shape), shape)
    auto = gate_backward_by_autograd(p, shape)
    return [
        {"gradient": f"∂L/∂{name}", "shape": list(hand[name].shape), "max_abs_error": float((hand[name] - auto[name]).abs().max()),
         "max_abs_value": float(auto[name].abs().max())}
        for name in hand
    ]


def per_element_contrast(shape: Shape) -> list[dict]:
    D, Hq, dh = shape.D, shape.H_q, shape.d_h
    return [
        {"gate": "per-head (Laguna)", "W_g_shape": [D, Hq], "gate_values_per_token": Hq, "W_g_params": D * Hq,
         "backward_reduction": f"Σ over d_h = {dh} channels"},
        {"gate": "per-element", "W_g_shape": [D, Hq * dh], "gate_values_per_token": Hq * dh, "W_g_params": D * Hq * dh,
         "backward_reduction": "none: one gate per channel"},
    ]


def gate_rounding(shape: Shape, seed: int, dtype: torch.dtype = torch.bfloat16) -> dict:
    """Laguna's mixed precision: softplus in fp32, cast to the attention dtype; the cast's error."""
    p = _weights(shape, seed, torch.float32)
    g32 = F.softplus(p["H"] @ p["W_g"])
    g_low = g32.to(dtype)
    rel = ((g_low.float() - g32) / g32).abs().max()
    unit = torch.finfo(dtype).eps / 2  # round-to-nearest: relative error at most half the spacing above 1
    return {"dtype": str(dtype).replace("torch.", ""), "gates": g32.numel(), "max_rel_rounding_error": float(rel),
            "unit_roundoff": float(unit)}


# --- §4 the cost of the gate -----------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    D: int = 3072
    H_kv: int = 8
    d_h: int = 128


def layer_cost(cfg: Config, H_q: int) -> dict:
    q = cfg.D * H_q * cfg.d_h
    kv = 2 * cfg.D * cfg.H_kv * cfg.d_h
    o = H_q * cfg.d_h * cfg.D
    gate = cfg.D * H_q
    return {"H_q": H_q, "gate_values_per_token": H_q, "attention_channels_per_token": H_q * cfg.d_h,
            "gate_params": gate, "qkvo_params": q + kv + o, "gate_share_of_params": gate / (q + kv + o + gate)}


def flops(cfg: Config, heads: list[int], T: int) -> dict:
    """Prefill FLOPs summed over layers (a multiply-add counts 2). Causal: T(T+1)/2 query-key pairs."""
    gate = sum(2 * T * cfg.D * h + T * h + T * h * cfg.d_h for h in heads)  # projection, softplus, broadcast multiply
    pairs = T * (T + 1) // 2
    attention = sum(2 * 2 * pairs * cfg.d_h * h for h in heads)  # QKᵀ and PV
    return {"T": T, "gate_flops": gate, "attention_core_flops": attention, "gate_over_attention": gate / attention,
            "gate_flops_per_token": gate / T, "attention_flops_per_token": attention / T}


# --- §5 stable versus naive softplus, in each format -----------------------------------------


def _nan_as_text(value: float) -> float | str:
    """The naive sigmoid's ∞/∞ is the finding itself: shown in words, so no table carries a bare not-a-number."""
    return "∞/∞, undefined" if math.isnan(value) else value


def overflow_point(dtype: np.dtype) -> dict:
    """The first value of the format where log1p(exp(x)), computed in the format, is inf."""
    tdtype = formats.torch_dtype(dtype)

    def naive_overflows(v: np.ndarray) -> np.ndarray:
        return torch.isinf(softplus_naive(formats.to_torch(v, dtype))).numpy()

    switch = formats.find_switch(dtype, naive_overflows)
    x = torch.tensor([switch.first_true], dtype=torch.float64).to(tdtype)
    info = formats.facts(dtype)
    below_max = formats.neighbours_below(dtype, info.max, 1).astype(np.float64)
    ulp_max = float(below_max[1] - below_max[0])  # values from max + ulp/2 up round to inf
    return {
        "dtype": dtype.name,
        "ln_max": info.ln_max,
        "ln_overflow_threshold": math.log(info.max) + math.log1p(ulp_max / 2 / info.max),
        "last_finite_input": switch.last_false,
        "first_overflow_input": switch.first_true,
        "naive": float(softplus_naive(x)),
        "stable": float(softplus(x)),
        "torch_softplus": float(F.softplus(x)),
        "naive_sigmoid_exp_ratio": _nan_as_text(float(torch.exp(x) / (1 + torch.exp(x)))),
        "sigmoid_two_branch": float(sigmoid_two_branch(x)),
        "sigmoid_two_branch_at_minus_x": float(sigmoid_two_branch(-x)),
    }


# --- the report ------------------------------------------------------------------------------


def gate_demo_answer(tables: dict[str, list[dict]], cfg: Config, heads: list[int]) -> tuple[str, ...]:
    """One sentence per finding, at most three: competition; the backward laws; cost and overflow."""
    sentences = []
    if "competition" in tables:
        r = tables["competition"]
        sentences.append(
            f"Raising z₃ by 1 moves every softmax share (z₁: {r[0]['softmax']:.4f} → {r[0]['softmax_after']:.4f}, "
            f"z₂: {r[1]['softmax']:.4f} → {r[1]['softmax_after']:.4f}) while softplus leaves the other gates where "
            f"they were; softplus(0) = ln 2 = {softplus_at(0.0):.4f}.")
    checks = []
    if "backward" in tables:
        worst = max(r["max_abs_error"] for r in tables["backward"])
        checks.append(f"every softmax and softplus backward law matches torch autograd to {worst:.2g}")
    if "laguna" in tables:
        worst = max(r["max_abs_error"] / max(1.0, r["max_abs_value"]) for r in tables["laguna"])
        checks.append(f"the hand-written Laguna gated-attention backward matches it to {worst:.2g} relative to each "
                      "gradient's size")
    if checks:
        sentences.append("In float64, " + " and ".join(checks) + ".")
    tail = []
    if "cost_layers" in tables:
        layer = tables["cost_layers"][0]
        tokens = tables["cost_tokens"]
        tail.append(
            f"at D = {cfg.D:,} with {heads[0]} query heads the per-head gate adds {layer['gate_values_per_token']:,} "
            f"values per token against {layer['attention_channels_per_token']:,} attention channels, and "
            f"{tokens[0]['gate_over_attention']:.2%} of the core attention FLOPs at T = {tokens[0]['T']:,}"
            + (f" ({tokens[-1]['gate_over_attention']:.2%} at T = {tokens[-1]['T']:,})" if len(tokens) > 1 else ""))
    if "stability" in tables:
        points = ", ".join(f"{r['first_overflow_input']:.6g} in {r['dtype']}" for r in tables["stability"])
        tail.append(f"naive log1p(exp(x)) first overflows at x = {points}, where the stable form stays finite")
    if tail:
        sentences.append("; ".join(tail)[0].upper() + "; ".join(tail)[1:] + ".")
    return tuple(sentences)


def gate_demo_report(sections: list[str], seed: int, shape: Shape, cfg: Config, heads: list[int], tokens: list[int]) -> Report:
    tables: list[Table] = []
    figures: dict = {}
    if "competition" in sections:
        rows = competition([1.0, 2.0, 3.0], 2, 1.0)
        tables.append(Table("competition", "raise z₃ by 1: every other softmax share falls; softplus of the others does not move", rows))
        tables.append(Table("asymptotes", "softplus ≈ eˣ for x ≪ 0 and ≈ x for x ≫ 0", asymptotes([-20, -10, -5, 0, 5, 10, 20])))
        figures["softplus_at_0"] = softplus_at(0.0)
    if "backward" in sections:
        tables.append(Table("backward", f"backward laws vs torch autograd (float64, seed {seed})", backward_laws(seed)))
    if "laguna" in sections:
        size = ", ".join(f"{k} = {v}" for k, v in asdict(shape).items())
        tables.append(Table("laguna", f"hand-written gated-attention gradients vs autograd (float64, {size})", laguna_check(shape, seed)))
        tables.append(Table("per_element", "what a per-element gate would change", per_element_contrast(shape)))
        tables.append(Table("gate_rounding", "gate in fp32, cast to bf16 as Laguna runs it", [gate_rounding(shape, seed)]))
    if "cost" in sections:
        tables.append(Table("cost_layers", f"per layer at D = {cfg.D}, H_kv = {cfg.H_kv}, d_h = {cfg.d_h}", [layer_cost(cfg, h) for h in heads]))
        tables.append(Table("cost_tokens", f"prefill FLOPs over {len(heads)} layer(s): gate linear in T, attention quadratic",
                            [flops(cfg, heads, t) for t in tokens],
                            ("T", "gate_flops", "attention_core_flops", "gate_over_attention"),
                            wide=("gate_flops_per_token", "attention_flops_per_token")))
    if "stability" in sections:
        dts = [formats.resolve(n) for n in ("fp16", "bf16", "fp32", "fp64")]
        tables.append(Table("stability", "where naive log1p(exp(x)) overflows, evaluated in each format (torch); naive eˣ/(1 + eˣ) there is ∞/∞",
                            [overflow_point(d) for d in dts],
                            ("dtype", "last_finite_input", "first_overflow_input", "ln_overflow_threshold", "naive", "stable"),
                            wide=("ln_max", "torch_softplus", "naive_sigmoid_exp_ratio", "sigmoid_two_branch",
                                  "sigmoid_two_branch_at_minus_x")))
    answer = gate_demo_answer({t.key: t.rows for t in tables}, cfg, heads)
    first = tables[0]
    tables[0] = Table("rows", first.title, first.rows, first.columns, first.show, first.wide)
    return Report(
        command="gate-demo",
        params={"sections": sections, "seed": seed, "shape": asdict(shape), "config": asdict(cfg), "heads": heads, "tokens": tokens},
        tables=tuple(tables),
        notes=(
            "softmax: one denominator shared by all outputs (competition); softplus: elementwise (independence)",
            "the gate's backward needs a reduction over the d_h channels of each head; softplus' backward is elementwise σ",
        ),
        figures=figures,
        answer=answer,
    )
