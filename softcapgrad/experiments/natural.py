"""Natural confidence: does training alone, without the scaled output layer, reach the dead zone on this task?

Phase 1's setting run long and hot in a reported arm's arithmetic (bf16 autocast, eager), AdamW with
no weight decay; every few steps the largest |pre-cap final logit| over every token as context, and
the share of those logits at or past the bf16 horizon.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Natural:
    seed: int
    steps: int
    lr: float
    arm: str
    trace: list[dict]  # {"step", "largest", "dead_share", "loss"}
    largest: float  # the largest over the trace
    dead_share: float  # the largest share over the trace


def natural(design, base=None, initial=None) -> Natural:
    import numpy as np
    import torch

    from softcapgrad.experiments import arms as armset, task as tasks
    from softcapgrad.experiments.loop import _autocast, _ids, pre_cap_logits

    seed = design.seeds[0]
    h = armset.horizon(design)
    m = tasks.mapping(design.task, seed)
    model = armset.fresh_model(design, seed, base=base)
    if initial is not None:
        model.load_state_dict(initial)
    opt = torch.optim.AdamW(model.parameters(), lr=design.natural_lr, weight_decay=0.0)
    before = torch.from_numpy(m.before)
    trace = []
    for step in range(design.natural_steps + 1):
        if step % design.natural_every == 0 or step == design.natural_steps:
            a = np.abs(pre_cap_logits(model, design))
            trace.append({"step": step, "largest": round(float(a.max()), 4),
                          "dead_share": float((a >= h).mean()), "loss": None})
        if step == design.natural_steps:
            break
        x = _ids(tasks.batch(design.task, seed, 0, step))
        with _autocast(True):
            logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), before[x].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if trace[-1]["loss"] is None:
            trace[-1]["loss"] = round(float(loss.detach()), 4)  # float() of a tensor that needs grad warns
    return Natural(seed, design.natural_steps, design.natural_lr, "bf16-eager", trace,
                   max(t["largest"] for t in trace), max(t["dead_share"] for t in trace))
