"""What GateMonitor keeps and shows: the site key, one step's sums, the row, and the report from the rows.

Closed is below 1e-3 of the gate's range (σ and softmax: y < 1e-3; softplus, which has no top: y < 1e-3);
saturated is stored as exactly the value the function only approaches (σ, softmax: 0 or 1; softplus: 0).

One definition for every format and tensor size: y < 1e-3 compared as real numbers, 1e-3 being the double
0.001000000000000000020816… (every value of fp8, bf16, fp16 and fp32 is exact in fp64, so this is the fp64
comparison). A call read out as Python floats compares so; a tensor compares in its own format against
``closed_below(dtype)``, the least value of the format not below 1e-3, which selects the same elements (a plain
``y < 1e-3`` on a bf16 tensor would compare against bf16(1e-3) = 0.00099945068359375 and leave that value open).
"""

from __future__ import annotations

import bisect
import functools
import threading
from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch

from softcapgrad.core.report import Report, Table
from softcapgrad.training.tally import _BITS, _nonzero, _stuck

_INTS = _BITS | {1: torch.int8}  # a float format's bits, as integers of its width

CLOSED = 1e-3  # of the gate's range
WINDOWS = 3  # windows a trend needs before a site is named closing
FALL = 0.2  # closing: the last window's mean gate at most 80 % of the first's (a halving is far past it; a gate's mean
# over thousands of elements moves by a few % between steps of a steady run)
RISE = 0.01  # or the closed share up by one element in a hundred from the first window to the last


@dataclass(frozen=True)
class GateZero:
    """Where a gate's autograd gradient is exactly 0 in one format: stuck open, stuck shut (None: never)."""

    open_from: float | None
    shut_from: float | None
    source: str


GateZeroLookup = Callable[[str, str, str, float], GateZero]  # (fn, dtype, device, upstream gradient)


def no_gate_lookup(fn: str, dtype: str, device: str, upstream: float = 1.0) -> GateZero:
    return GateZero(None, None, "not looked up")


def looked_up(first_zero: GateZeroLookup, fn: str, dtype: str, device: str, upstream: float) -> GateZero:
    """``first_zero``'s answer, measured by autograd in a thread of its own, which no active mode watches."""
    found: list = []
    worker = threading.Thread(target=lambda: found.append(first_zero(fn, dtype, device, upstream)))
    worker.start()
    worker.join()
    return found[0] if found else GateZero(None, None, "the lookup failed")


def lower_median(values) -> float | None:
    """The ⌈n/2⌉-th smallest of ``values`` (torch.median's choice: a value that occurred); None: none."""
    values = sorted(values)
    return values[(len(values) - 1) // 2] if values else None


def upstream_median(grad_output: torch.Tensor, listed: list[float] | None = None) -> float | None:
    """The lower median of |upstream gradient| over a call's elements that are neither 0 nor NaN (those whose zero
    gradient counts), in the gradient's format; None: no such element. ``listed``: its values as Python floats."""
    if listed is None:
        a = grad_output.detach().abs().reshape(-1)
        a = a[a > 0]  # NaN > 0 is false
        return torch.median(a).item() if a.numel() else None
    a = list(map(abs, listed))
    total = sum(a)
    if total != total:  # a NaN somewhere (|v| ≥ 0: no ∞ − ∞), which would leave the sort's order undefined
        a = [v for v in a if v == v]
    a.sort()
    k = bisect.bisect_right(a, 0.0)
    return a[k + (len(a) - k - 1) // 2] if len(a) > k else None


class GateSite(NamedTuple):  # not a dataclass: a gate call hashes its site a few times, and a tuple's hash is C's
    model: int
    module: str
    site: str
    fn: str  # sigmoid | softplus | softmax
    dtype: str
    device: str


@dataclass(frozen=True)
class GateRow:
    module: str
    site: str
    fn: str
    dtype: str
    steps: int  # watched steps the site ran in
    count: int  # elements through the forward, over the watched steps
    closed_share: float
    saturated_share: float
    zero_grad_share: float | None  # of the backward's elements (None: no backward seen)
    zero_grad_cast_share: float | None  # the same, on the gradient cast back to the tensor a layer produced (None:
    # no cast lies between it and the gate, or no backward seen)
    mean_gate: float
    trend: str  # closing | steady | "—" (fewer than WINDOWS windows)
    stuck_open_from: float | None  # the input from which the gradient is exactly 0, the gate stuck open
    stuck_shut_from: float | None
    upstream: float | None  # the upstream gradient the two columns above are for (None: no backward seen; 1 assumed)
    min_input: float
    max_input: float
    source: str
    per_step: tuple  # per watched step: (count, closed, saturated, backward count, zero_grad, mean, zero_grad cast back)
    per_head: tuple | None = None  # a per-head gate's (mean gate, closed share) per head (None: not per head)


class Step:
    """One site's sums in one watched step (numbers: every count here is read on the CPU, or once per op)."""

    __slots__ = ("count", "closed", "saturated", "total", "backward", "zero", "zero_cast", "low", "high", "heads",
                 "upstream")

    def __init__(self) -> None:
        self.count = self.closed = self.saturated = self.backward = self.zero = self.zero_cast = 0
        self.total = 0.0
        self.low, self.high = float("inf"), float("-inf")
        self.heads: list | None = None  # a per-head gate's [closed per head, Σ y per head] (gateheads.py)
        self.upstream: list[float] = []  # each call's upstream_median


def trend(history: list[tuple], window: int) -> str:
    """closing: from the first window of ``window`` watched steps to the last, the mean gate fell by FALL of itself
    or more, or the closed share rose by RISE or more; "—" before WINDOWS windows. A window comparison, not a run of
    falls: a gate that halves over the run is closing whatever upticks lie between (a fall at every transition, the
    old rule, let one uptick hide it). ``history``: a site's (count, closed, saturated, backward, zero, mean, …) per
    step."""
    windows = [history[i:i + window] for i in range(0, len(history) - len(history) % window, window)]
    if len(windows) < WINDOWS:
        return "—"
    means, closed = [], []
    for w in (windows[0], windows[-1]):
        count = sum(h[0] for h in w)
        means.append(sum(h[0] * h[5] for h in w) / count if count else 0.0)
        closed.append(sum(h[1] for h in w) / count if count else 0.0)
    falls = means[1] <= (1.0 - FALL) * means[0]
    rises = closed[1] - closed[0] >= RISE
    return "closing" if falls or rises else "steady"


def below(values: list[float]) -> int:
    """How many of ``values`` (Python floats) are below CLOSED, in C's loop: CLOSED > v (False for NaN)."""
    return sum(map(CLOSED.__gt__, values))


@functools.cache
def closed_below(dtype: torch.dtype) -> float:
    """The least value of ``dtype`` not below CLOSED, as a float (exact in the format): for every y of the format,
    y < CLOSED ⟺ y < closed_below(dtype), and torch's comparison of a tensor with this number, made in the
    tensor's format, rounds nothing. CLOSED rounded to the format, moved one step up where that fell below it."""
    t = torch.tensor(CLOSED, dtype=torch.float64).to(dtype)
    if t.item() < CLOSED:  # positive and finite: the next value up is the next bit pattern
        t = (t.view(_INTS[t.element_size()]) + 1).view(dtype)
    return t.item()


def _closed(y: torch.Tensor, low: float | None = None) -> int:
    """Elements below CLOSED (see closed_below); none to count where the smallest element ``low`` (read on the CPU,
    exact) is not."""
    if low is not None and low >= CLOSED:
        return 0
    return int(torch.count_nonzero(y < closed_below(y.dtype)))


def _saturated(fn: str, y: torch.Tensor, low: float | None = None, high: float | None = None) -> int:
    """Elements stored as exactly the value the function only approaches: softplus 0; σ and softmax 0 or 1 (none
    where the range [low, high] read on the CPU lies inside (0, 1), or above 0 for softplus)."""
    if fn == "softplus":
        return 0 if low is not None and low > 0 else y.numel() - int(_nonzero(y))
    if low is not None and low > 0 and high < 1:
        return 0
    return int(_stuck("sigmoid", y))  # σ and softmax: y·(1 − y) is 0 exactly where y is 0 or 1


def compiled_note(n: int, counted: bool) -> str | None:
    """What the rows leave out of ``n`` compiled regions; ``counted``: whether gates inside them were counted."""
    if n and counted:
        return (f"{n} compiled region{'s' if n != 1 else ''} ran: their sigmoid and softplus gates and softmax "
                "routers are counted from their inputs, with no zero-gradient share (their backward runs in "
                "generated code)")
    if n:
        return (f"{n} compiled region{'s' if n != 1 else ''} ran: no gate inside compiled code was counted "
                "(regions compiled before a GateMonitor existed carry no counters)")
    return None


def _share(rows: list[dict], key: str) -> str:
    return f"{max(r[key] or 0.0 for r in rows):.3g}"


GATE_COLUMNS = ("module", "fn", "dtype", "closed_share", "saturated_share", "zero_grad_share", "mean_gate",
                "trend")
GATE_WIDE = ("zero_grad_cast_share", "site", "steps", "count", "stuck_open_from", "stuck_shut_from", "upstream",
             "min_input", "max_input", "source")
GATE_NOTES = (
    f"closed: share below {CLOSED:g} of the gate's range (softplus: below {CLOSED:g}); saturated: stored as exactly "
    "0 or 1 (softplus: 0); zero grad: share of the backward's elements exactly 0 where the upstream gradient was "
    "not; zero grad cast: the same on the gradient cast back to the format of the layer that feeds the gate "
    "(what its weights see; — where no cast lies between); mean: the mean gate (float64 sum); all over the watched "
    "steps, per step in the JSON (per_step: count, closed, saturated, backward count, zero grad, mean, zero grad "
    "cast back); a gate per attention head has per_head in the JSON: each head's mean and closed share",
    f"trend: closing when, from the first window of watched steps to the last, the mean fell by {FALL:.0%} or more "
    f"or the closed share rose by {RISE:g} or more ({WINDOWS} windows at least; — before that); stuck open from, "
    "stuck shut from: the input from which autograd's gradient is exactly 0 with the gate open (σ stored as 1.0; a "
    "softplus gate's never dies open) and shut, under the upstream gradient the site received: upstream, the lower "
    "median of |upstream| over each backward call's non-zero elements, then over its calls (1 where no backward was "
    "seen: compiled code, a forward alone)",
)


def gate_sentences(rows: list[dict], hidden: str | None) -> tuple[str, ...]:
    if not rows:
        return ("No gate ran: the model has no sigmoid or softplus gate and no softmax router that ran eagerly"
                + (f" ({hidden})." if hidden else "."),)
    closing = [r["module"] for r in rows if r["trend"] == "closing"]
    seen = [r for r in rows if r["zero_grad_share"] is not None]  # compiled sites: their backward is not seen
    low = sorted({r["dtype"] for r in rows if r["dtype"] in ("bfloat16", "float16")})
    out = [f"{len(rows)} gate site{'s' if len(rows) != 1 else ''} ran ({', '.join(sorted({r['fn'] for r in rows}))}"
           + (f"; {sum(r['dtype'] in low for r in rows)} in {'/'.join(low)}" if low else "") + "): at most "
           f"{_share(rows, 'closed_share')} of a site's elements were closed, {_share(rows, 'saturated_share')} "
           f"stored saturated and " + (f"{_share(seen, 'zero_grad_share')} got an exactly-zero gradient." if seen else
                                       "no site's backward was seen (compiled code)."),
           (f"Closing, first window to last: {', '.join(closing[:3])}{', …' if len(closing) > 3 else ''}." if closing
            else "No site is closing.")]
    cast = [r for r in seen if r.get("zero_grad_cast_share") is not None
            and r["zero_grad_cast_share"] != r["zero_grad_share"]]
    if cast:
        r = max(cast, key=lambda r: r["zero_grad_cast_share"] - r["zero_grad_share"])
        out.append(f"Cast back to its layer's format, the gradient of {r['module']}'s {r['fn']} is exactly 0 in "
                   f"{r['zero_grad_cast_share']:.3g} of its elements ({r['zero_grad_share']:.3g} at the gate itself): "
                   "those are the zeros its weights see.")
    headed = [r for r in rows if r.get("per_head") and r["closed_share"] > 0]
    if headed:  # where a per-head site's closed elements are
        r = max(headed, key=lambda r: r["closed_share"])
        shares = [h[1] for h in r["per_head"]]
        most = sorted((i for i in range(len(shares)) if shares[i] > 0), key=lambda i: -shares[i])[:3]
        out.append(f"Per head, {r['module']}'s {r['fn']} is closed most in head{'s' if len(most) > 1 else ''} "
                   f"{', '.join(map(str, most))} of {len(shares)} (closed share "
                   f"{', '.join(f'{shares[i]:.3g}' for i in most)}).")
    if hidden:
        out.append(hidden[0].upper() + hidden[1:] + ".")
    return tuple(out)


def gate_table(rows: list[dict], key: str = "gate_rows") -> Table:
    return Table(key, "gate health per site: closed, saturated, zero gradient, mean gate, trend", rows or
                 [{"module": "(no gate ran)", "fn": "", "dtype": "", "closed_share": None,
                   "saturated_share": None, "zero_grad_share": None, "mean_gate": None, "trend": ""}],
                 GATE_COLUMNS, wide=GATE_WIDE if rows else ())


def gate_report(rows: list[dict], hidden: str | None, params: dict) -> Report:
    return Report(command="monitor", params=params, tables=(gate_table(rows, "rows"),), notes=GATE_NOTES,
                  answer=gate_sentences(rows, hidden))
