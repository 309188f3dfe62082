"""softcapgrad experiment's phase-2 step against a plain transformers step."""

from __future__ import annotations

from benchmarks.timing import Figure, interleaved


def experiment() -> list[Figure]:
    """softcapgrad experiment's phase-2 steps (the bf16-eager arm, its monitor sampled as the design says, the
    hooks at the shift) against a plain transformers training step on the same model and data, without the tool."""
    import torch

    from softcapgrad.experiments import arms, loop, task as tasks
    from softcapgrad.experiments.design import DESIGN

    threads = torch.get_num_threads()
    torch.set_num_threads(DESIGN.threads)
    n = 2 * DESIGN.window  # steps per timed call: the shift, then two windows of sampled steps
    design = DESIGN.with_(phase2_steps=n, recover_probability=2.0)  # never recovers: every call runs n steps
    m = tasks.mapping(design.task, 0)
    arm = arms.build(arms.SPECS["bf16-eager"], design)
    state = {k: v.clone() for k, v in arm.model.state_dict().items()}
    after = torch.from_numpy(m.after)

    def tool() -> object:
        return loop.run_arm(arm, state, design, 0, 1.0, m, 104.0)

    def plain() -> object:
        arm.model.load_state_dict(state)
        opt = torch.optim.AdamW(arm.model.parameters(), lr=design.lr, weight_decay=design.weight_decay)
        for t in range(n):
            x = torch.from_numpy(tasks.batch(design.task, 0, 1, t))
            with torch.autocast("cpu", dtype=torch.bfloat16):
                z = arm.model(input_ids=x).logits
            loss = torch.nn.functional.cross_entropy(z.float().reshape(-1, z.shape[-1]), after[x].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

    tool(), plain()
    t = interleaved({"plain": plain, "tool": tool}, repeat=5)
    torch.set_num_threads(threads)
    return [
        Figure(f"plain transformers step, tiny Gemma 2, bf16 autocast, AdamW ({n} steps / {n})", t["plain"] / n),
        Figure(f"  experiment step: monitor at the shift, then 1 in {DESIGN.monitor_every}, hooks, metrics",
               t["tool"] / n, t["plain"] / n, "<= 1.1x", 1.1),
    ]
