"""audit-model DIR --gates: how open each gate of a saved model is on a text, and how many of its inputs lie past the
first zero of its format's gradient.

The model is read as audit-model reads it (config.json and safetensors; no remote code, no pickle) and runs one
forward, in eval mode, with no gradient, inside GateMonitor, which finds the gates as it does in training (sigmoid and
softplus gates, softmax routers, not x·σ(αx)) and here also keeps each gate call's input x and output y. The text is
TEXT below, shipped with softcapgrad: tokenized by the directory's tokenizer.json where it has one (the tokenizers
library reads it as data), else its UTF-8 bytes taken as ids (below the vocabulary's special ids: a stand-in that is
said); ``--inputs`` gives token ids instead.

Per gate site: the opening y's quantiles (0, 1, 10, 50, 90, 99, 100 %, computed in float64 from the stored values), its
mean, the closed share (y < 1e-3, gaterows.closed_below), and the share of inputs past the first zero of the gate's
format (stacks.watch.gate_first_zero, measured over every value of the format): x ≥ stuck_open_from (σ stored as
1.0: the gradient is 0 with the gate open) and x ≤ stuck_shut_from (stored as 0).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from softcapgrad.core.checks import InputError
from softcapgrad.core.report import Report, Table

TEXT = (
    "The river was low that autumn, and the boats that had carried grain to the city all summer lay on their sides in "
    "the mud. Children walked out to them at dusk, counting the ribs of the hulls and daring each other to climb in. "
    "Upstream, the engineers argued about whether to open the old sluice: opened too early, it would drain the "
    "reservoir before the frost; opened too late, the mills would stand idle for a month. In the end they opened it "
    "by a quarter, measured the flow every hour for three days, and wrote the numbers in a ledger that nobody read "
    "until the spring floods came and the question was asked again. 1, 2, 3: 42% of 17.5 is 7.35."
)
QUANTILES = (0.0, 0.01, 0.1, 0.5, 0.9, 0.99, 1.0)


@dataclass(frozen=True)
class GateOpening:
    module: str
    fn: str
    dtype: str
    count: int  # elements through the gate on the text
    quantiles: tuple  # of the opening y, at QUANTILES
    mean_gate: float
    closed_share: float
    past_open_share: float | None  # x ≥ stuck_open_from (None: the format's gradient never dies open)
    past_shut_share: float | None  # x ≤ stuck_shut_from
    stuck_open_from: float | None
    stuck_shut_from: float | None
    min_input: float
    max_input: float


def text_ids(config, directory: Path | None):
    """TEXT as one row of token ids, and how: by the directory's tokenizer.json, else its bytes (a stand-in)."""
    import torch

    from softcapgrad.models.inputs import text_tokens

    path = directory / "tokenizer.json" if directory is not None else None
    if path is not None and path.is_file():
        from tokenizers import Tokenizer

        try:
            ids = Tokenizer.from_file(str(path)).encode(TEXT).ids
        except Exception as err:  # the tokenizers library raises its own exception type for a malformed file
            raise InputError(f"{path}: cannot load the tokenizer: {str(err).splitlines()[0]}") from None
        return torch.tensor([ids], dtype=torch.long), f"the shipped text, tokenized by {path.name} ({len(ids)} tokens)"
    n = text_tokens(config)
    ids = [b % n for b in TEXT.encode("utf-8")]
    return torch.tensor([ids], dtype=torch.long), (
        f"the shipped text's {len(ids)} UTF-8 bytes as token ids (modulo {n}; no tokenizer.json: a stand-in for text, "
        "not what the model reads)")


def _monitor():
    from softcapgrad.stacks.watch import GateMonitor

    class Kept(GateMonitor):
        """GateMonitor that also keeps every gate call's x and y, in float64 on the CPU."""

        def __init__(self) -> None:
            super().__init__(learn=False)
            self.kept: dict = {}

        def _count(self, site, x, y) -> None:
            super()._count(site, x, y)
            self.kept.setdefault(site, []).append((x.detach().double().cpu().reshape(-1),
                                                   y.detach().double().cpu().reshape(-1)))

    return Kept()


def gate_openings(model, ids) -> list[GateOpening]:
    """One forward of ``ids`` (eval, no gradient) in the monitor; per gate site, its opening and inputs past the
    first zero."""
    import numpy as np
    import torch

    from softcapgrad.training.gaterows import CLOSED

    model.eval()
    monitor = _monitor()
    with torch.no_grad(), monitor:
        model(input_ids=ids.to(model.device))
    rows = []
    for site, calls in monitor.kept.items():
        x, y = torch.cat([c[0] for c in calls]), torch.cat([c[1] for c in calls])
        zone = monitor._zone(site.fn, site.dtype, site.device)
        q = np.quantile(y.numpy(), QUANTILES)  # linear between order statistics, as torch.quantile
        n = y.numel()
        rows.append(GateOpening(
            module=site.module, fn=site.fn, dtype=site.dtype, count=n, quantiles=tuple(q.tolist()),
            mean_gate=float(y.mean()), closed_share=int((y < CLOSED).sum()) / n,
            past_open_share=int((x >= zone.open_from).sum()) / n if zone.open_from is not None else None,
            past_shut_share=int((x <= zone.shut_from).sum()) / n if zone.shut_from is not None else None,
            stuck_open_from=zone.open_from, stuck_shut_from=zone.shut_from, min_input=float(x.min()),
            max_input=float(x.max())))
    return rows


def audit_gates(src, ids, dtype: str, device: str, seed: int, given: dict) -> Report:
    """Build the saved (or tiny) model in ``dtype`` (random weights drawn with ``seed`` where the directory has none)
    and report its gates on ``ids`` (None: the shipped text)."""
    import torch

    from softcapgrad.models import audit

    how = "the given token ids"
    if ids is None:
        ids, how = text_ids(src.config, src.directory)
        audit.check_ids(ids, src.config, "the shipped text's ids")
    torch.manual_seed(seed)
    with audit.quiet():
        model = audit.build(src, src.config, "eager", getattr(torch, dtype), device=device)
        rows = gate_openings(model, ids)
    params = {**given, "dtype": dtype, "device": device, "seed": seed, "shape": list(ids.shape), "text": how,
              "random_weights": not src.weights}
    return gates_report(rows, params, how)


def gates_report(rows: list[GateOpening], params: dict, how: str) -> Report:
    table = [{**{k: v for k, v in asdict(r).items() if k != "quantiles"},
              **{f"q{round(p * 100)}": v for p, v in zip(QUANTILES, r.quantiles)}} for r in rows]
    if not rows:
        answer = (f"No gate ran on {how}: the model has no sigmoid or softplus gate and no softmax router.",)
    else:
        past = [r for r in rows if (r.past_open_share or 0) + (r.past_shut_share or 0) > 0]
        worst = max(rows, key=lambda r: (r.past_open_share or 0) + (r.past_shut_share or 0))
        answer = (f"{len(rows)} gate site{'s' if len(rows) != 1 else ''} ran on {how}; median openings from "
                  f"{min(r.quantiles[3] for r in rows):.3g} to {max(r.quantiles[3] for r in rows):.3g}, at most "
                  f"{max(r.closed_share for r in rows):.3g} of a site's elements closed (below 1e-3).",
                  (f"{len(past)} site{'s' if len(past) != 1 else ''} had inputs past the first zero of the format's "
                   f"gradient; most, {worst.module}'s {worst.fn} ({worst.dtype}): "
                   f"{worst.past_open_share or 0:.3g} stuck open, {worst.past_shut_share or 0:.3g} stuck shut.")
                  if past else "No gate input lay past the first zero of its format's gradient.")
    return Report(
        command="audit-model", params=params,
        tables=(Table("gates", "each gate's opening on the text: quantiles of y, and inputs past the first zero",
                      table, ("module", "fn", "dtype", "q1", "q50", "q99", "closed_share", "past_open_share",
                              "past_shut_share"),
                      wide=("count", "q0", "q10", "q90", "q100", "mean_gate", "stuck_open_from", "stuck_shut_from",
                            "min_input", "max_input")),),
        notes=("q0 … q100: quantiles of the gate's output y over every element on the text (float64); closed: y < 1e-3 "
               "as real numbers; past open / shut: share of the gate's inputs x at or past the input from which "
               "autograd's gradient through that format's gate is exactly 0 with the gate open (σ stored as 1.0) or "
               "shut (stored as 0), measured over every value of the format",),
        answer=answer)
