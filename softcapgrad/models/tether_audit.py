"""audit-model --patch tether: which head gates of a model the TetherGate patch holds, which it refuses, and
whether the patched model is the unpatched one at step 0 (outputs and every parameter's gradient, bit for bit)."""

from __future__ import annotations

from softcapgrad.core.report import Report, Table
from softcapgrad.models import audit
from softcapgrad.models.source import Source


def _grads(model) -> dict:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def patch_report(src: Source, ids, dtype_name: str, autocast: str | None, seed: int, scale_logits: float,
                 device: str, given: dict) -> Report:
    import torch

    from softcapgrad.training.tether_patch import patch_gates

    model = audit.build(src, src.config, "eager", getattr(torch, dtype_name), device=device)
    model.train()
    batch = audit.Batch(ids, scale_logits, autocast, seed, device)
    before = audit.forward(model, batch, grad=True)
    want = _grads(model)
    model.zero_grad(set_to_none=True)
    patched = patch_gates(model)
    after = audit.forward(model, batch, grad=True)
    got = {n: g for n, g in _grads(model).items() if "tether_gate" not in n}
    same_out = torch.equal(before, after)
    same_grad = want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    rows = [{"module": h.module, "class": h.cls, "status": "held", "link": h.link, "gates": h.gates, "why": h.what}
            for h in patched.held]
    rows += [{"module": r.module, "class": r.cls, "status": f"refused ({r.kind})", "link": "", "gates": None,
              "why": r.why} for r in patched.refused]
    kind = type(model).__name__
    gates = sum(h.gates for h in patched.held)
    answer = [f"The TetherGate patch holds {len(patched.held)} head-gate site(s) of {kind} ({gates} gates); at step 0 "
              f"the patched model's outputs {'are' if same_out else 'are NOT'} the unpatched one's bit for bit, and "
              f"its parameters' gradients {'are' if same_grad else 'are NOT'}."]
    if patched.refused:
        kinds = sorted({r.kind for r in patched.refused})
        answer.append(f"It refuses {len(patched.refused)} gate-like site(s) it cannot hold ({', '.join(kinds)}), "
                      "listed below.")
    params = {**given, "dtype": dtype_name, "autocast": autocast, "shape": list(ids.shape), "seed": seed,
              "patch": "tether", "bit_identical_outputs": same_out, "bit_identical_gradients": same_grad}
    return Report(command="audit-model", params=params,
                  tables=(Table("rows", "head-gate sites: held by the patch or refused", rows,
                                ("module", "status", "link", "gates"), wide=("class", "why")),),
                  answer=tuple(answer), ok=same_out and same_grad)
