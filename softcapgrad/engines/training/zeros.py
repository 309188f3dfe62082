"""Where a route's cap gradient is first exactly 0: the folders that push the caps' inputs past the horizons
(``sweep-T`` for the final cap, ``rows`` for routes that hide a, ``attention-T`` for the attention cap), the
brackets read from a route's steps, and their comparison with ``stacks``.

The first zero, as ``stacks`` defines it: the smallest positive a (in the format the route computes the cap in)
whose gradient dL/da is exactly 0 while dL/dz is not; beside it the largest positive a below it whose gradient is
not 0, over every step of the route. Where the route computes the cap as torch eager does on the CPU
(transformers' c·tanh(a/c), op by op), the stack torch-eager-cpu's first zero in that format lies between the two.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from softcapgrad.engines.forward import reference as ref
from softcapgrad.engines.training import reference as tr, verdict as tv
from softcapgrad.engines.training.routes import ADAPTER, EASYDEL_ROUTES, MLX_ROUTES

SWEEP = (12.0, 24.0, 48.0)  # largest |a/c| of the sweep folders: past fp32's and bf16's horizons (softcapgrad
# horizon), and past 45.05, where MLX's tanh backward (computed from the input, not the output) first gives 0 in fp32
STACK = "torch-eager-cpu"
FORMATS = {"fp32": "float32", "bf16": "bfloat16"}


def sweep_folders(model, ids, work: Path) -> list[str]:
    """The capped model with its final site scaled so that the largest |a/c| reaches each of ``SWEEP``."""
    c = ref.caps_of(model.config)["final"]
    if c is None:
        return []
    seen: dict = {}
    ref.logits(model, ids, seen=seen)
    names = []
    for target in SWEEP:
        pushed = copy.deepcopy(model)
        ref._scale_final(pushed, target / seen["final"])
        name = f"sweep-{target:g}"
        tr.save_folder(pushed, work / name)
        names.append(name)
    return names


ATTENTION_SWEEP = 24.0  # the attention cap's largest |a/c| in its sweep folder: past fp32's and bf16's horizons
ATTENTION_FOLDER = f"attention-{ATTENTION_SWEEP:g}"
# the adapters that read the attention cap's calls (adapter_train_transformers.attention_watch)
ATTENTION_ADAPTERS = (ADAPTER, "train_axolotl", "train_unsloth", "train_torch_tune", "train_lit_gpt")


def attention_folder(model, ids, work: Path) -> list[str]:
    """The capped model with each layer's queries scaled (parity's binding, to another target) so that the
    attention cap's largest |a/c| in every layer is ATTENTION_SWEEP, and the final cap's too; none where the model
    has no attention cap or its attention cannot be bound."""
    if ref.caps_of(model.config)["attention"] is None:
        return []
    pushed = copy.deepcopy(model)
    if not any(name.startswith("queries") for name in ref.bind(pushed, ids, target=ATTENTION_SWEEP)):
        return []
    tr.save_folder(pushed, work / ATTENTION_FOLDER)
    return [ATTENTION_FOLDER]


def first_zero_attention(steps: list, c: float) -> dict:
    """Over the steps' attention-cap calls: the first positive a whose dL/da is exactly 0 while dL/dz is not (a
    masked score gets no dL/dz), the last positive a below it whose dL/da is not 0, and how many zeros."""
    rows = [s.attention for s in steps if s.attention is not None and s.attention.size]
    if not rows:
        return dict(NO_ZERO)
    a, da, dz, _ = np.concatenate(rows).T
    keep = (a > 0) & (dz != 0)
    if not keep.any():
        return dict(NO_ZERO)
    return _bracket(a[keep], da[keep] == 0, float(a[keep].max()), c)


def attention_caps_used(steps: list) -> list[float]:
    """The values of c the route's attention-cap calls divided by (its own code's choice, whatever the config says)."""
    used = [s.attention[:, 3] for s in steps if s.attention is not None and s.attention.size]
    return sorted({float(v) for v in np.concatenate(used)}) if used else []


HIDDEN_NOTE = ("the route exposes no a: read from the gradients of head rows set so that every position's a is a "
               "chosen value (the designed a, float64)")
ROWS = 160  # head rows the ``rows`` folder sets, each to one designed input a
ROW_SPAN = (1.0, 64.0)  # those inputs, geometric from c to 64c: past every horizon a route has shown (MLX: 45c)
ROWS_FOLDER = "rows"


@dataclass(frozen=True)
class HeadRows:
    """The ``rows`` folder's design: head rows ``rows`` (tokens the batch never holds) set to s_k·u, with u solving
    H·u = 1 for the batch's head inputs H, so that every position's a for row k is s_k; ``least`` holds, per row,
    the smallest a over the positions as float64 computes it (s_k itself where the solve is exact)."""

    head: str  # the head weight's parameter name (the embedding's, where tied)
    rows: tuple[int, ...]
    least: tuple[float, ...]


def row_folder(model, ids, work: Path) -> HeadRows | None:
    """The capped model with ROWS unused head rows set so that their final cap inputs are c·geomspace(ROW_SPAN) at
    every position: a route whose step exposes no a (a fused loss, a fused head) still shows where its cap's
    gradient dies, in the gradient of those rows: dL/dW_k = Σ_t dL/da_tk · h_t is exactly 0 only when every
    position's gradient is."""
    import torch

    c = ref.caps_of(model.config)["final"]
    head = model.get_output_embeddings()
    free = sorted(set(range(head.weight.shape[0])) - {int(i) for i in np.asarray(ids).reshape(-1)})
    if c is None or head is None or len(free) < ROWS:
        return None
    seen = []
    hook = head.register_forward_pre_hook(lambda module, args: seen.append(args[0].detach()))
    try:
        with torch.no_grad():
            model(input_ids=torch.as_tensor(np.asarray(ids).reshape(1, -1)), use_cache=False)
    finally:
        hook.remove()
    h = seen[0][0].double().numpy()  # [tokens, hidden]
    u = np.linalg.lstsq(h, np.ones(h.shape[0]), rcond=None)[0]
    rows = free[-ROWS:]
    inputs = c * np.geomspace(*ROW_SPAN, ROWS)
    pushed = copy.deepcopy(model)
    weight = pushed.get_output_embeddings().weight
    with torch.no_grad():
        weight[rows] = torch.as_tensor(np.outer(inputs, u), dtype=weight.dtype)
    least = (h @ weight[rows].detach().double().numpy().T).min(axis=0)  # [rows]: each row's smallest a
    tr.save_folder(pushed, work / ROWS_FOLDER)
    name = next(n for n, p in model.named_parameters() if p is head.weight)
    return HeadRows(name, tuple(rows), tuple(float(a) for a in least))


def rows_first_zero(step, design: HeadRows, c: float) -> dict:
    """The first zero as the head rows' gradients show it: the smallest designed a of a row whose gradient is
    exactly 0 (every position's dL/da is, as far as the row's sum can tell), and the largest a of a live row below
    it; None where the step holds no gradient of the head weight."""
    grad = None if step is None else step.grads.get(design.head)
    if grad is None or grad.ndim != 2:
        return dict(NO_ZERO)
    least = np.asarray(design.least)
    return _bracket(least, ~np.any(grad[list(design.rows)] != 0, axis=1), float(least.max()), c)


NO_ZERO = {"first_dead": None, "last_alive": None, "zeros": 0, "largest": None}


def _bracket(a: np.ndarray, dead: np.ndarray, largest: float, c: float) -> dict:
    """The smallest input ``a`` whose gradient is ``dead`` (exactly 0), the largest live one below it, how many are
    dead, and the largest input seen."""
    first = float(a[dead].min()) if dead.any() else None
    below = ~dead & (a < first if first is not None else True)
    return {"first_dead": first, "last_alive": float(a[below].max()) if below.any() else None,
            "zeros": int(dead.sum()), "largest": largest, "first_dead_over_c": None if first is None else first / c}


def _rows_readable(row: dict, engine: str, other_model: set) -> bool:
    """Whether the head rows' design holds for the route: it computes the reference's model (applied, or not bound
    in its precision with its forward nearest the capped model) and no route of its engine computes another model
    (a bf16 route cannot show that by itself)."""
    return (row["verdict"] == tv.APPLIED or (row["verdict"] == tv.NOT_BOUND and row.get("forward_cell") == "capped")) \
        and engine not in other_model


def _exposed(steps: list, ids) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Every position of the steps where the route exposed the final cap's input a and dL/da, and dL/dz is not 0:
    (a, dL/dz, dL/da), flat; None where no step exposes them."""
    a, g, da = [], [], []
    for s in steps:
        up, _ = tr.upstream(s, ids)
        if s.precap is None or s.precap_grad is None or up is None or s.precap.shape != up.shape:
            continue
        live = up != 0
        a.append(s.precap[live])
        g.append(up[live])
        da.append(s.precap_grad[live])
    return (np.concatenate(a), np.concatenate(g), np.concatenate(da)) if a else None


def first_zero(steps: list, c: float, ids) -> dict:
    """Over the steps' final cap inputs: the first positive a whose gradient is exactly 0 while the upstream one
    is not, the last positive a below it whose gradient is not 0, and how many zeros were seen."""
    exposed = _exposed(steps, ids)
    if exposed is None:
        return dict(NO_ZERO)
    a, _, da = exposed
    positive = a > 0
    return _bracket(a[positive], da[positive] == 0, float(a.max()), c)


_TRL_HEAD = ("trl's fused head computes the cap's gradient in float32 from the upcast logits, whatever the training "
             "precision (trl 1.16.0, kernels/chunked_logprob.py lines 276–295: tile.float(), torch.tanh, 1 − t·t)")
_EASYDEL_STEP = ("EasyDeL's Trainer step is jitted: XLA compiles the cap (Gemma2ForCausalLM.compute_lm_logits, "
                 "cap·tanh(logits/cap)) and its backward, as the jax-jit-cpu stack does")
_MLX_STEP = ("mlx-lm's Gemma caps the head's output as mx.tanh(out / cap) · cap (mlx_lm 0.32.2, models/gemma2.py "
             "lines 199–200), and MLX's own autodiff takes its gradient, op by op as the mlx-cpu stack does")
# Routes whose cap's backward is not torch eager's in the route's own format, as read in their source: the stack and
# format their first zero is compared with, and why.
CAP_STACK = {("fused-loss", "cce"): ("torch-compile-cpu", "fp32", "Cut Cross-Entropy's impl='torch_compile' caps "
                                     "inside a torch.compile'd function (cut_cross_entropy 25.1.1, torch_compile.py "
                                     "lines 14–27; utils.py line 7: tanh(logits / softcap) · softcap)"),
             **{("peft-trl", r): (STACK, "fp32", _TRL_HEAD) for r in ("sft", "sft-eager", "sft-fp32")},
             **{("easydel", r.id): ("jax-jit-cpu", r.precision, _EASYDEL_STEP) for r in EASYDEL_ROUTES},
             **{("mlx-lm", r.id): ("mlx-cpu", r.precision, _MLX_STEP) for r in MLX_ROUTES}}


def stacks_within(zero: dict, c: float) -> list[str]:
    """Every CPU stack of ``stacks`` (tanh, each of its formats) whose first zero lies in the route's bracket (last
    alive, first dead]: the arithmetic that could be the route's, whatever the route says it computes in."""
    from softcapgrad.stacks import registry

    if zero.get("first_dead") is None:
        return []
    low = zero.get("last_alive") if zero.get("last_alive") is not None else 0.0
    found = []
    for name, stack in registry.STACKS.items():
        if stack.device != "cpu" or stack.fn != "tanh":
            continue
        for scores in stack.formats:
            value = registry.first_zero(name, scores, float(c)).value
            if value is not None and low < value <= zero["first_dead"]:
                found.append(f"{name} ({scores})")
    return found


def stack_agreement(zero: dict, precision: str, c: float, path: str = STACK) -> dict:
    """The stack ``path``'s first zero in the cap's format (the route's precision unless a format is given as
    ``precision``), and whether it lies in (last alive, first dead]."""
    from softcapgrad.stacks import registry

    scores = FORMATS.get(precision)
    if scores is None:
        return {"stack": None, "stack_first_zero": None, "agrees": None}
    found = registry.first_zero(path, scores, float(c))
    value = found.value
    if value is None or zero["first_dead"] is None:
        agrees = None if value is None or zero["largest"] is None or zero["largest"] >= value else True
    else:
        agrees = (zero["last_alive"] is None or zero["last_alive"] < value) and value <= zero["first_dead"]
    return {"stack": f"{path} ({scores})", "stack_first_zero": value, "agrees": agrees}


def upstream_agreement(steps: list, c: float, ids, path: str, precision: str) -> dict:
    """For a stack whose zeros depend on the gradient arriving at the cap (``upstream_sets_zero``): the stack's
    gradient at each positive a the route exposed, given the route's own dL/dz there, and whether it is 0 exactly
    where the route's dL/da is. ``stack_first_zero`` stays the stack's own (at dL/dz = 1)."""
    from softcapgrad.laws import formats
    from softcapgrad.stacks import registry

    scores = FORMATS.get(precision)
    if scores is None:
        return {"stack": None, "stack_first_zero": None, "agrees": None}
    stack = registry.STACKS[path]
    out = {"stack": f"{path} ({scores})", "stack_first_zero": registry.first_zero(path, scores, float(c)).value,
           "agrees": None}
    exposed = _exposed(steps, ids)
    a, g, da = (x[exposed[0] > 0] for x in exposed) if exposed is not None else (np.zeros(0),) * 3
    why = registry.runs_here(stack) or ("" if a.size else "the route exposed no positive a with a non-zero dL/dz")
    if why:
        return {**out, "pointwise": {"positions": 0, "same": 0, "zeros": 0, "why": why}}
    dead = registry.gradient(stack, a, formats.resolve(scores), float(c), upstream=g) == 0
    same = dead == (da == 0)
    return {**out, "agrees": bool(same.all()), "pointwise": {"positions": int(a.size), "same": int(same.sum()),
                                                             "zeros": int(dead.sum())}}


def _attention_zero(row: dict, steps: list, c: float, precision: str) -> None:
    """The attention row's first zero, where the route's adapter reads the attention cap's calls, beside stacks'
    torch-eager-cpu in the route's format (transformers' eager attention caps op by op, as that stack does)."""
    used = attention_caps_used(steps)
    if len(used) == 1 and used[0] != c:  # the route caps the scores with another value: judged at its own
        row["first_dead_note"] = f"the route's attention-cap calls divide by c = {used[0]:g}, not the model's {c:g}"
        c = row["c_used"] = used[0]
    zero = first_zero_attention(steps, c)
    if zero["largest"] is None:
        read = any(s.attention is not None for s in steps)
        row["first_dead_note"] = ("the step ran no attention-cap call with a live dL/dz (its attention calls no "
                                  "cap)" if read else
                                  "the route does not expose the attention scores or their gradient")
        return
    row["stacks_within"] = stacks_within(zero, c)
    row.update(zero, **stack_agreement(zero, precision, c))
    if zero["first_dead"] is None:
        row["first_dead_note"] = f"no exactly-0 gradient at any score the route exposed (up to {zero['largest']:.6g})"


def _no_zero(zero: dict, info: dict, row: dict, other: bool, readable: bool | None) -> str:
    """Why a route that ran shows no first zero of the final cap's gradient (``readable`` None: no rows folder)."""
    if info.get("variants_failed"):
        return "; ".join(f"{name} did not run ({why})" for name, why in info["variants_failed"].items())
    if zero["largest"] is not None:
        return f"no exactly-0 gradient at any a the route exposed (up to {zero['largest']:.6g})"
    if readable is None:
        return f"the route exposes no a, and the batch leaves fewer than {ROWS} head rows free for the rows folder"
    if readable:
        return "the route exposes no a, and its step holds no gradient of the head weight to read the head rows from"
    cell = row.get("forward_cell")
    whose = ("another route of its engine computes another model" if other else
             f"its verdict is {row['verdict']}" if row["verdict"] != tv.NOT_BOUND else
             f"its forward lies nearest {cell}, not the capped model" if cell else
             "its precision cannot tell which model it computes (not bound)")
    return f"the route exposes no a, and the head rows are read only where it computes the reference's model: {whose}"
