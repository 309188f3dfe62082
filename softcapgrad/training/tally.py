"""What the monitor counts per site: the site's key, its running sums (tensors on the op's device, no
host sync per op; plain numbers on the CPU, where reading one costs no sync), the row a report shows,
and the report from its rows."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from softcapgrad.core.report import Report, Table


@dataclass(frozen=True)
class Site:
    model: int  # the owner's index (-1: no module, or already qualified); rows qualify ``module`` by it
    module: str
    site: str
    fn: str
    dtype: str
    device: str
    cap: float | None
    compiled: bool = False  # counted in-graph (softcapgrad.training.ingraph) on the cap's input


class _Tally:
    """Running sums of one site, kept as tensors on the op's device (no host sync per op), or as numbers on the CPU."""

    __slots__ = ("calls", "recomputed", "count", "saturated", "dead", "max_abs", "backward_calls", "backward_count",
                 "zero_grad", "lost", "mass", "inputs")

    def __init__(self) -> None:
        self.calls = self.recomputed = self.count = self.backward_calls = self.backward_count = 0
        self.saturated = self.dead = self.max_abs = self.zero_grad = self.lost = self.mass = None
        self.inputs: list[torch.Tensor] = []

    def totals(self) -> list:
        """The sums as plain numbers (one host sync per tensor), in ``__slots__`` order without the inputs."""
        return [None if v is None else v.item() if isinstance(v, torch.Tensor) else v
                for v in (getattr(self, k) for k in self.__slots__[:-1])]


def _add(total, value):
    return value if total is None else total + value


def _largest(total, x: torch.Tensor):
    """The running largest |x| (one pass: the min and max of x). On the CPU, where reading a number costs no device
    sync, a float of at most 32 bits is kept as a Python number (exact: such a value is a float32, as the tensor
    path's ``.float()`` makes it), which spares the few tensor ops that combine the min and max."""
    low, high = torch.aminmax(x.detach())
    if x.device.type == "cpu" and x.dtype in _SMALL_FLOATS:
        big = _fmax(-low.item(), high.item())
        return big if total is None else _fmax(total.item() if isinstance(total, torch.Tensor) else total, big)
    big = torch.maximum(-low, high).float()
    return big if total is None else torch.maximum(total, big)


_SMALL_FLOATS = (torch.bfloat16, torch.float16, torch.float32)


def _fmax(a: float, b: float) -> float:
    """torch.maximum on two numbers: NaN if either is one, else ``a`` unless ``b`` is larger (so -0.0 against 0.0
    keeps the first, as torch does)."""
    return a if a != a or (not b > a and b == b) else b


_BITS = {2: torch.int16, 4: torch.int32, 8: torch.int64}
_SMALL = 4096  # elements: below, _zero_grads counts with fewer ops rather than cheaper passes


def _nonzero(x: torch.Tensor):
    """count_nonzero(x), read as integers with the sign bit shifted out (±0 → 0; NaN and subnormals stay nonzero):
    torch's float count_nonzero branches per element and costs about 15× more on the CPU where zeros are many."""
    if x.is_floating_point() and x.element_size() in _BITS:
        return torch.count_nonzero(x.view(_BITS[x.element_size()]) << 1)
    return torch.count_nonzero(x)


def _stuck(fn: str, y: torch.Tensor):
    """Elements of a tanh output stored as exactly ±1 (of a sigmoid's as 0 or 1).

    |y| ≤ 1, so 1 − |y| is exact from |y| = 0.5 up (Sterbenz) and above 0.5 below it: it is 0 exactly where
    |y| = 1 (NaN stays NaN, not stuck). For the sigmoid y·(1 − y) is 0 exactly where y is 0 or 1 (a subnormal y
    times about 1 is y). On the CPU, where reading a number costs no device sync, an output whose range stays
    inside (-1, 1) ((0, 1)) needs no count at all."""
    if y.device.type == "cpu":
        low, high = (v.item() for v in torch.aminmax(y))
        if high < 1 and low > (-1 if fn == "tanh" else 0):
            return 0
        return y.numel() - int(_nonzero(1 - y.abs() if fn == "tanh" else y * (1 - y)))
    return y.numel() - _nonzero(1 - y.abs() if fn == "tanh" else y * (1 - y))


def _past(a: torch.Tensor, edge: float):
    """Elements with |a| ≥ edge (none to count on the CPU when the range of a stays inside (-edge, edge))."""
    if a.device.type == "cpu":
        low, high = (v.item() for v in torch.aminmax(a))
        if high < edge and low > -edge:
            return 0
        return int(torch.count_nonzero(a.abs() >= edge))
    return torch.count_nonzero(a.abs() >= edge)


def _zero_grads(grad_output: torch.Tensor, grad_input: torch.Tensor):
    """Elements whose backward is exactly 0 while the upstream gradient is not.

    grad_input = grad_output·(1 − y²) (·y(1 − y) for the sigmoid) with y finite: a zero upstream gives a zero
    grad_input unless something is NaN (then grad_input is NaN). So when no grad_input is NaN the count is
    nonzero(grad_output) − nonzero(grad_input); none at all when no grad_input is 0. On the CPU, where reading a
    count costs no device sync, that takes the passes of the two counts and one min/max (NaN there: some element
    is NaN), in place of the two comparisons, their conjunction and its count. Below ``_SMALL`` elements, where
    each op's fixed cost outweighs its passes (a gate of a tiny model), one plain count says whether any element is
    0; if some is, a finite sum of grad_input says none is NaN, and the two counts give the answer (a sum that is
    not finite, NaN or an overflow, leaves it to the definition)."""
    n = grad_input.numel()
    if grad_input.device.type == "cpu" and 0 < n <= _SMALL:
        nonzero = int(torch.count_nonzero(grad_input))
        if nonzero == n:
            return 0
        if grad_input.is_floating_point() and math.isfinite(grad_input.sum().item()):  # finite sum: no NaN
            return int(torch.count_nonzero(grad_output)) - nonzero
    elif grad_input.device.type == "cpu" and n and grad_input.is_floating_point():
        nonzero = int(_nonzero(grad_input))
        if nonzero == n:
            return 0
        low, high = (v.item() for v in torch.aminmax(grad_input))
        if low == low and high == high:  # no NaN
            return int(_nonzero(grad_output)) - nonzero
    return torch.count_nonzero((grad_input == 0) & (grad_output != 0))


def _lost_mass(fn: str, x: torch.Tensor, grad_output: torch.Tensor, grad_input: torch.Tensor):
    """(L1 mass of the exact gradient that the backward set to exactly 0, the exact gradient's whole L1 mass).

    The exact gradient is the upstream gradient times the exact derivative at the op's saved input x, in fp64:
    sech²(x) for the tanh (so for c·tanh(a/c) the share is that of a's gradient: the factors c and 1/c cancel),
    σ(x)·σ(−x) for the sigmoid, each from e = exp(−2|x|) or exp(−|x|) so nothing overflows."""
    from softcapgrad.training.fp32grad import WIDE

    exact = WIDE[fn](x.detach()).mul_(grad_output.detach().double()).abs_()
    lost, mass = exact[grad_input == 0].sum(), exact.sum()
    if x.device.type == "cpu":
        return lost.item(), mass.item()
    return lost, mass


def _merge(a: list, b: list) -> list:
    """Two ranks' totals of one site: sums, and the larger ``max_abs`` (slot 5)."""
    out = []
    for i, (x, y) in enumerate(zip(a, b)):
        out.append(x if y is None else y if x is None else max(x, y) if i == 5 else x + y)
    return out


@dataclass(frozen=True)
class SiteRow:
    module: str
    site: str
    fn: str
    dtype: str
    path: str  # torch-eager-<device>, or torch-compile-<device> for a site counted inside compiled code
    cap: float | None  # the divisor feeding the tanh (None: none seen, the tanh's own input)
    calls: int
    recomputed: int  # forward calls replayed inside the backward (checkpointing): paired with it, not counted again
    count: int  # elements through the forward
    saturated: int | None  # stored output exactly ±1 (0 or 1 for the sigmoid); None: compiled (not stored)
    dead: int | None  # elements past the path's first zero-gradient input (None: the path's is not known)
    backward_count: int  # elements through the backward
    zero_grad: int | None  # backward exactly 0 with a non-zero upstream gradient (None: no backward seen)
    max_abs: float  # largest |a|: c·(largest |a/c| as stored) with a cap, else max_abs_input
    max_abs_input: float  # largest |input| of the tanh / sigmoid (compiled: of a)
    first_zero_grad_input: float | None  # the path's, in units of a (c·tanh(a/c)) or of the sigmoid's input
    source: str
    saturated_fraction: float | None
    dead_fraction: float | None
    mass_lost: float | None = None  # share of the exact gradient's L1 mass (fp64) the backward set to 0 (None: not seen)


def rows_report(rows: list[dict], hidden: str | None, params: dict) -> Report:
    """The monitor's report from its rows: the answer in plain sentences, where each cap ran, what it did."""
    eager = [r for r in rows if not r["path"].startswith("torch-compile")]
    compiled = [r for r in rows if r["path"].startswith("torch-compile")]
    answer = []
    if eager:
        low = [r for r in eager if r["dtype"] in ("bfloat16", "float16")]
        answer.append(
            f"{len(eager)} tanh/sigmoid call site{'s' if len(eager) != 1 else ''} ran outside compiled code "
            f"({sum(r['count'] for r in eager):,} elements, {len(low)} in bf16/fp16); "
            f"{sum(r['saturated'] for r in eager):,} elements were stored as exactly ±1 (0 or 1) and "
            f"{sum(r['zero_grad'] or 0 for r in eager):,} received an exactly-zero gradient from a non-zero upstream.")
    if compiled:
        unknown = [r for r in compiled if r["dead"] is None]
        answer.append(
            f"{len(compiled)} call site{'s' if len(compiled) != 1 else ''} inside compiled code "
            f"{'were' if len(compiled) != 1 else 'was'} counted in the "
            f"graph ({sum(r['count'] for r in compiled):,} elements); {sum(r['dead'] or 0 for r in compiled):,} "
            "had an input past their compiled path's first zero-gradient input" +
            (f" ({len(unknown)} site{'s' if len(unknown) != 1 else ''} on a path with no measured first zero)"
             if unknown else "") + ".")
    if not rows:
        answer.append("No tanh or sigmoid ran" + (": nothing was counted." if hidden else "."))
    if hidden:
        answer.append(hidden[0].upper() + hidden[1:] + ".")
    return Report(
        command="monitor",
        params=params,
        tables=(
            Table("rows", "tanh and sigmoid per module and call site", rows, show=False),
            Table("where", "where each tanh / sigmoid ran", rows,
                  ("module", "fn", "dtype", "path", "cap", "first_zero_grad_input"), wide=("site", "source"),
                  json=False),
            Table("counts", "what it did", rows, ("module", "count", "saturated", "dead", "zero_grad", "mass_lost",
                                                  "max_abs"),
                  wide=("calls", "recomputed", "backward_count", "max_abs_input", "dead_fraction"), json=False),
        ),
        notes=(
            "saturated: stored output exactly ±1 (0 or 1 for the sigmoid); zero_grad: backward exactly 0 where the "
            "upstream gradient was not; dead: elements past the path's first zero-gradient input (eager: the "
            "saturated ones; compiled: counted on the cap's input inside the graph); mass_lost: the share of the "
            "exact gradient's L1 mass (upstream × the exact derivative at the saved input, fp64) that the backward "
            "set to 0, on the watched steps (— where no backward was seen: compiled code)",
            "cap: the number the tanh's input was divided by; first_zero_grad_input is in units of the pre-cap a (of "
            "the tanh input when no cap was seen)",
        ),
        answer=tuple(answer),
    )
