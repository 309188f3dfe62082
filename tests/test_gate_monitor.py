"""GateMonitor against a brute force on three real model types with different gates.

The brute force wraps the functions the modeling code calls (``torch.sigmoid``, ``F.softplus``,
``F.softmax``): each call's output is copied, and tensor hooks catch the upstream gradient (on the
output) and the gate's own backward (on a view of the input that only the gate reads). Counted in
float64 from those copies, per module: elements, closed (< 1e-3), saturated (σ, softmax: 0 or 1;
softplus: 0), exactly-zero gradients under a non-zero upstream, the mean. The monitor must give the
same counts exactly (they are counts of the same tensors) and the same mean up to float64 summation
order (n values of at most 1: n·2⁻⁵² relative).

The gate weights are scaled up so that every kind of count is non-zero: lfm3's sigmoid output gate in
bfloat16 (and under bf16 autocast from a float32 model), laguna's softplus head gate (float32, as its
code computes it) and sigmoid router, mixtral's softmax router (float32).
"""

import math
import warnings

import pytest
import torch

pytest.importorskip("transformers")

from softcapgrad.models import audit  # noqa: E402
from softcapgrad.stacks.watch import GateMonitor, gate_first_zero  # noqa: E402
from softcapgrad.training import gatehealth  # noqa: E402

F = torch.nn.functional
SCALED = {"lfm3": ("g_proj", 200.0), "laguna": ("g_proj", 3000.0), "mixtral": ("mlp.gate", 3000.0)}
GATES = {"lfm3": {"sigmoid"}, "laguna": {"softplus", "sigmoid"}, "mixtral": {"softmax"}}


def tiny(model_type: str, dtype=torch.bfloat16):
    config = audit.model_type_config(model_type, {})
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = audit.build(audit.Source(config, None, False), config, "eager", dtype)
    name, factor = SCALED[model_type]
    with torch.no_grad():
        for n, p in model.named_parameters():
            if f"{name}.weight" in n:
                p.mul_(factor)
    model.train()
    return model


class BruteForce:
    """Every call of the wrapped gate functions, with the module it ran in, its output, upstream and own gradient."""

    def __init__(self, model, monkeypatch):
        self.records: list[dict] = []
        self.stack: list[str] = []
        for name, m in model.named_modules():
            m.register_forward_pre_hook(lambda mod, args, name=name: self.stack.append(name))
            m.register_forward_hook(self._leave)
        for owner, attr, fn in ((torch, "sigmoid", "sigmoid"), (F, "softplus", "softplus"), (F, "softmax", "softmax")):
            monkeypatch.setattr(owner, attr, self._wrap(getattr(owner, attr), fn))

    def _leave(self, module, args, out) -> None:  # None: a forward hook's result would replace the output
        self.stack.pop()

    def _wrap(self, original, fn):
        def gate(x, *args, **kwargs):
            xi = x.view_as(x) if x.requires_grad else x  # read by the gate only: its gradient is the gate's backward
            y = original(xi, *args, **kwargs)
            record = {"module": self.stack[-1] if self.stack else "", "fn": fn, "y": y.detach().clone()}
            if y.requires_grad:
                y.register_hook(lambda g: record.__setitem__("up", g.detach().clone()))
                xi.register_hook(lambda g: record.__setitem__("gx", g.detach().clone()))
            self.records.append(record)
            return y
        return gate

    def counts(self, routers_in: str = "mlp") -> dict:
        """(module, fn) -> [count, closed, saturated, backward count, zero grad, sum, each call's lower median of
        |upstream| over its elements neither 0 nor NaN]; softmax only in routers."""
        out: dict = {}
        for r in self.records:
            if r["fn"] == "softmax" and routers_in not in r["module"]:
                continue  # attention's softmax: not a gate
            y = r["y"].double()
            saturated = (y == 0) if r["fn"] == "softplus" else (y == 0) | (y == 1)
            c = out.setdefault((r["module"], r["fn"]), [0, 0, 0, 0, 0, 0.0, []])
            c[0] += y.numel()
            c[1] += int((y < 1e-3).sum())
            c[2] += int(saturated.sum())
            c[5] += float(y.sum())
            if "gx" in r:
                c[3] += r["gx"].numel()
                c[4] += int(((r["gx"] == 0) & (r["up"] != 0)).sum())
                up = sorted(abs(v) for v in r["up"].double().flatten().tolist() if v == v and v != 0)
                c[6] += [up[(len(up) - 1) // 2]] if up else []
        return out


def _step(model, autocast: bool = False):
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()


def _check(monitor, brute, fns: set[str], dtypes: set[str]):
    expected = brute.counts()
    rows = {(r.module, r.fn): r for r in monitor.rows()}
    assert set(rows) == set(expected)
    assert {fn for _, fn in rows} == fns
    assert {r.dtype for r in rows.values()} == dtypes
    totals = [0, 0, 0, 0]
    for key, (count, closed, saturated, backward, zero, total, upstream) in expected.items():
        r = rows[key]
        upstream = sorted(upstream)
        assert r.upstream == upstream[(len(upstream) - 1) // 2] and r.upstream != 1.0  # what the gate received
        if r.fn != "softmax":  # the stuck columns for that upstream
            zone = gate_first_zero(r.fn, r.dtype, "cpu", r.upstream)
            assert (r.stuck_open_from, r.stuck_shut_from) == (zone.open_from, zone.shut_from)
            assert "--upstream" in r.source
        assert r.count == count
        assert r.closed_share * count == pytest.approx(closed, abs=1e-6)
        assert r.saturated_share * count == pytest.approx(saturated, abs=1e-6)
        assert r.zero_grad_share * backward == pytest.approx(zero, abs=1e-6)
        assert r.mean_gate == pytest.approx(total / count, rel=count * 2.0**-52, abs=0)
        totals = [a + b for a, b in zip(totals, (closed, saturated, zero, count - closed))]
    assert all(totals), f"every kind of count should be non-zero here: {totals}"


@pytest.mark.slow
@pytest.mark.parametrize("model_type,dtypes", [("lfm3", {"bfloat16"}), ("laguna", {"float32"}),
                                               ("mixtral", {"float32"})])
def test_monitor_matches_the_brute_force_eager(model_type, dtypes, monkeypatch):
    model = tiny(model_type)
    brute = BruteForce(model, monkeypatch)
    monitor = GateMonitor()
    with monitor:
        _step(model)
    _check(monitor, brute, GATES[model_type], dtypes)


@pytest.mark.slow
@pytest.mark.parametrize("model_type,autocast", [("lfm3", False), ("laguna", False), ("mixtral", False),
                                                 ("lfm3", True), ("mixtral", True)])
def test_later_steps_watch_only_the_gate_modules_with_the_same_counts(model_type, autocast):
    """After the first watched step the mode is on only in the gate modules' own code and the backward is counted
    through the gates' autograd nodes; the second step asks whether the torch calls of that code show every gate
    (softmax(dtype=) and autocast included), and from the third on only those calls are watched: the same weights
    and batch give the same counts, step after step, whichever watch counted them."""
    model = tiny(model_type, torch.float32 if autocast else torch.bfloat16)
    monitor = GateMonitor()
    for i in range(4):
        with monitor.step():
            _step(model, autocast)
        assert monitor.sites_only
        assert monitor._calls_ok is (None if i == 0 else True)
        # lfm3's gate is σ(g_proj(h)), laguna's softplus(g_proj(h).float()) and σ of its router's own output (the
        # logits it returns): from the third step on each is read from its own autograd node, with no mode
        # (mixtral's softmax router keeps the calls watch)
        assert (monitor._feeds is not None) is (i > 0 and model_type != "mixtral")
        if i > 0 and model_type == "laguna":  # the two head gates through a cast of g_proj's output to float32;
            # the router's σ from the router's own output 0 (its logits), no cast
            feeds = [(child is None, index, cast) for _, (child, index, cast), _ in monitor._feeds.values()]
            assert sorted(feeds, key=str) == [(False, None, torch.float32)] * 2 + [(True, 0, None)]
    rows = monitor.rows()
    assert rows and all(len(set(r.per_step)) == 1 and r.steps == 4 for r in rows)
    assert any(r.zero_grad_share for r in rows)  # the sited backward counted zeros, as the full mode did
    assert monitor.unfound == 0


class Fed(torch.nn.Module):
    """A gate fed straight by a child (σ(proj(x))), until ``scaled`` sends another code path: σ(3·proj(x))."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        self.scaled = False

    def forward(self, x):
        g = self.proj(x)
        return x * torch.sigmoid(g * 3.0 if self.scaled else g)


def _fed_step(model, x, monitor, grad: bool = True) -> None:
    with monitor.step(), torch.set_grad_enabled(grad):
        y = model(x)
        if grad:
            (y * torch.arange(y.numel()).view_as(y)).sum().backward()  # a zero upstream at element 0


def _brute(model, x) -> tuple:
    """The step's entry as the monitor keeps it, from the gate's own output and gradient."""
    g = model.proj(x).detach()
    u = (g * 3.0 if model.scaled else g).requires_grad_(True)  # the sigmoid's own input
    y = torch.sigmoid(u)
    up = x * torch.arange(x.numel()).view_as(x)
    (gx,) = torch.autograd.grad(y, u, up)
    yd = y.detach().double()
    return (y.numel(), int((yd < 1e-3).sum()), int(((yd == 0) | (yd == 1)).sum()), y.numel(),
            int(((gx == 0) & (up != 0)).sum()), float(yd.sum()) / y.numel())


def test_a_gate_read_from_its_node_counts_as_the_modes_do_and_a_changed_path_is_said():
    """σ(proj(x)) is found by its autograd node from the third watched step on, with the same entries the modes
    gave; a step whose code takes another path (the gate's input is no longer proj's output) is not counted from
    a guess: the report says how many gate calls went uncounted, and the next step is watched by the calls again
    (and counts the new path). A forward without autograd is watched by the calls too."""
    torch.manual_seed(0)
    model, x = Fed(), torch.randn(3, 4) * 4.0
    with torch.no_grad():
        model.proj.weight.mul_(8.0)  # some gates closed and saturated
    monitor = GateMonitor()
    for _ in range(4):
        _fed_step(model, x, monitor)
    assert monitor._feeds is not None and monitor.unfound == 0 and monitor.hidden() is None
    plain = _brute(model, x)
    model.scaled = True
    _fed_step(model, x, monitor)  # the watch with no mode misses the new path
    assert monitor.unfound == 1 and monitor._feeds is None
    assert monitor.hidden() == ("1 gate call of a watched step went uncounted (another code path than the one learnt "
                                "ran, or the gate's input changed in place before the step ended); later steps watch "
                                "the calls")
    _fed_step(model, x, monitor)  # the calls watch counts it
    _fed_step(model, x, monitor, grad=False)  # a forward alone
    (row,) = monitor.rows()
    steps = tuple(s[:6] for s in row.per_step)  # the seventh, the zeros cast back, is the fifth here: no cast
    assert all(s[6] == s[4] for s in row.per_step) and row.zero_grad_cast_share is None
    assert row.steps == 6 and steps[:4] == (plain,) * 4 and plain[1] and plain[2] and plain[4]
    scaled = _brute(model, x)
    assert steps[4][:3] == scaled[:3] and steps[4][4] == scaled[4]
    assert steps[4][5] == pytest.approx(scaled[5], rel=12 * 2.0**-52, abs=0)
    assert steps[5][:3] == scaled[:3] and steps[5][3:5] == (0, 0)  # no backward in a forward alone


def test_an_outer_mode_sees_no_op_of_the_watch_with_no_mode():
    """A dispatch mode around a step that the watch with no mode counts (a profiler, another monitor) sees the
    same aten ops as around the step unwatched: the gate's recomputation and counting, in the hook and at the
    close, run with every mode disabled."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    model, x = Fed(), torch.randn(3, 4)
    monitor = GateMonitor()
    for _ in range(4):
        _fed_step(model, x, monitor)
    assert monitor._feeds is not None
    with Ops() as plain:
        y = model(x)
        (y * torch.arange(y.numel()).view_as(y)).sum().backward()
    with Ops() as watched:
        _fed_step(model, x, monitor)
    assert watched.ops == plain.ops and "aten.sigmoid.default" in plain.ops
    assert monitor.rows()[0].steps == 5 and monitor.unfound == 0


class Handed(torch.nn.Module):
    """σ(proj(x)) that hands proj's output back to its caller."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        self.scaled = False  # as Fed's, for _brute

    def forward(self, x):
        g = self.proj(x)
        return x * torch.sigmoid(g), g


def test_a_small_gate_whose_input_changes_in_place_before_the_step_ends_is_not_counted_from_the_new_values():
    """A small gate's call found by its node is counted when the step closes, from the input it kept. The caller
    that changes that input in place after the gate read it (here: pushes every gate shut) makes the call
    uncounted, forward and backward, and said; the next step is watched by the calls and counts what ran."""
    torch.manual_seed(0)
    model, x = Handed(), torch.randn(3, 4)
    monitor = GateMonitor()

    def step(change: bool) -> None:
        with monitor.step():
            y, g = model(x)
            if change:
                with torch.no_grad():
                    g.sub_(100.0)  # after σ read g: the kept input is no longer the gate's
            (y * torch.arange(y.numel()).view_as(y)).sum().backward()

    for _ in range(4):
        step(False)
    assert monitor._feeds is not None and monitor.unfound == 0
    step(True)
    assert monitor.unfound == 1 and monitor._feeds is None and "changed in place" in monitor.hidden()
    step(True)  # the calls watch counts the gate as σ ran
    (row,) = monitor.rows()
    expected = _brute(model, x)
    per_step = tuple(s[:6] for s in row.per_step)  # the seventh, the zeros cast back: no cast here
    assert row.steps == 5 and per_step[:4] == (expected,) * 4  # the changed step holds no entry at all
    assert per_step[4] == expected and per_step[4][1] == 0  # nothing closed: σ ran before the change


def test_a_gate_the_torch_calls_do_not_show_keeps_the_dispatch_watch():
    """A gate reached through a call the function watch does not map (torch.ops.aten.sigmoid) is seen by the
    dispatch mode only: the probe says so, and later steps keep the dispatch watch with the same counts."""

    class Gate(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)

        def forward(self, x):
            return x * torch.ops.aten.sigmoid.default(self.proj(x) * 8.0)

    torch.manual_seed(0)
    model, x = Gate(), torch.randn(3, 4)
    monitor = GateMonitor()
    for _ in range(4):
        with monitor.step():
            model(x).sum().backward()
    assert monitor.sites_only and monitor._calls_ok is False
    (row,) = monitor.rows()
    assert row.steps == 4 and len(set(row.per_step)) == 1 and row.count == 4 * 12


@pytest.mark.slow
def test_monitor_matches_the_brute_force_under_autocast(monkeypatch):
    """A float32 lfm3 under bf16 autocast: g_proj runs in bf16, and so does its sigmoid, as the monitor records."""
    model = tiny("lfm3", torch.float32)
    brute = BruteForce(model, monkeypatch)
    monitor = GateMonitor()
    with monitor:
        _step(model, autocast=True)
    _check(monitor, brute, {"sigmoid"}, {"bfloat16"})


def test_stuck_open_is_the_measured_first_zero_of_the_format():
    """A bf16 sigmoid gate is stuck open (σ stored as 1.0, gradient exactly 0) from the measured first zero on."""
    zone = gate_first_zero("sigmoid", "bfloat16", "cpu")
    x = torch.tensor([zone.open_from], dtype=torch.bfloat16)
    below = torch.nextafter(x.float(), torch.tensor(0.0)).bfloat16()
    below = below if below != x else x - 2.0**-5
    for value, dead in ((x, True), (below, False)):
        v = value.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(torch.sigmoid(v), v, torch.ones_like(v))
        assert (g.item() == 0.0) is dead
    assert gate_first_zero("softplus", "float32", "cpu").open_from is None  # σ → 1: a softplus never dies open


@pytest.mark.parametrize("fn,dtype", [("sigmoid", torch.bfloat16), ("softplus", torch.float32)])
def test_stuck_shut_under_a_small_upstream_is_where_that_upstream_s_gradient_dies(fn, dtype):
    """Under an upstream g = 2⁻¹⁴ (in the format) the product with σ's derivative underflows before it does under 1:
    from the looked-up input down to the format's end every gradient is exactly 0, and the next value up keeps one."""
    name = str(dtype).removeprefix("torch.")
    g = 2.0**-14
    zone, one = gate_first_zero(fn, name, "cpu", g), gate_first_zero(fn, name, "cpu")
    assert one.shut_from < zone.shut_from < 0 and f"--upstream {g!r}" in zone.source
    ints = {torch.bfloat16: torch.int16, torch.float32: torch.int32}[dtype]
    x = torch.tensor([zone.shut_from], dtype=dtype)
    beyond = torch.linspace(zone.shut_from, -torch.finfo(dtype).max, 4097, dtype=torch.float64).to(dtype)
    up = (x.view(ints) - 1).view(dtype)  # the next value towards 0
    f = torch.sigmoid if fn == "sigmoid" else torch.nn.functional.softplus
    for values, dead in ((beyond, True), (up, False)):
        v = values.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(f(v), v, torch.full_like(v, g))
        assert bool((grad == 0).all()) is dead and bool((grad == 0).any()) is dead


class Gated(torch.nn.Module):
    def __init__(self, kind: str = "gate", bias: float = 0.0):
        super().__init__()
        self.g = torch.nn.Linear(8, 8)
        self.kind = kind
        with torch.no_grad():
            self.g.bias.fill_(bias)

    def forward(self, x):
        if self.kind == "activation":
            return x * torch.sigmoid(1.702 * x)  # QuickGELU: not a gate
        return x * torch.sigmoid(self.g(x))


def test_an_activation_is_not_a_gate_and_no_gate_is_a_row_that_says_so():
    model = Gated("activation")
    monitor = GateMonitor()
    with monitor:
        model(torch.randn(4, 8, requires_grad=True)).sum().backward()
    assert monitor.rows() == []
    report = monitor.report()
    assert report.tables[0].rows[0]["module"] == "(no gate ran)"
    assert report.answer[0].startswith("No gate ran")


def test_rows_asked_inside_the_block_do_not_count_the_lookup():
    """The stuck-open lookup differentiates torch.sigmoid over a format's values: never through the active mode."""
    model = Gated()
    monitor = GateMonitor(learn=False)  # the mode over every op, in the second block too
    with monitor:
        model(torch.randn(4, 8, requires_grad=True)).sum().backward()
    with monitor:
        (inside,) = monitor.rows()  # the first lookup, while the second block watches
        model(torch.randn(4, 8, requires_grad=True)).sum().backward()
    (row,) = monitor.rows()
    assert [step[0] for step in row.per_step] == [32, 32]
    assert inside.stuck_open_from == row.stuck_open_from == gate_first_zero("sigmoid", "float32", "cpu").open_from


def test_only_keeps_the_sites_it_accepts():
    model = Gated()
    kept, dropped = GateMonitor(only=lambda module, fn: fn == "sigmoid"), GateMonitor(only=lambda module, fn: False)
    for monitor in (kept, dropped):
        with monitor:
            model(torch.randn(4, 8, requires_grad=True)).sum().backward()
    assert [r.fn for r in kept.rows()] == ["sigmoid"] and dropped.rows() == []


def test_a_gate_pushed_shut_step_after_step_is_closing():
    model = Gated()
    monitor = GateMonitor(window=2)
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(0))
    for step in range(6):
        with torch.no_grad():
            model.g.bias.fill_(-2.0 * (step // 2))  # one push per window of two steps
        with monitor.step():
            model(x).sum().backward()
    (row,) = monitor.rows()
    assert row.trend == "closing" and row.steps == 6 and len(row.per_step) == 6
    steady = GateMonitor()
    for _ in range(3):
        with steady:
            model(x).sum().backward()
    assert steady.rows()[0].trend == "steady"
    assert GateMonitor(window=4).trend(list(row.per_step)) == "—"  # one window and a half: too few to tell


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*should not be instantiated:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:.*torch.jit.script_method.* is deprecated:DeprecationWarning")
def test_compiled_gates_are_named_in_one_line_not_shown_as_zero():
    model = Gated()
    compiled = torch.compile(model)
    x = torch.randn(4, 8)
    with torch._inductor.config.patch(pre_grad_custom_pass=None):  # compiled as before any monitor existed
        compiled(x).sum().backward()  # its gates run inside generated kernels, with no counters
    monitor = GateMonitor()
    for _ in range(2):  # the second watches nothing at all (no eager gate ran), and still says what it cannot see
        with monitor:
            compiled(x).sum().backward()
    assert monitor.rows() == [] and monitor.sites_only
    assert monitor.hidden().startswith("2 compiled regions ran: no gate")
    assert len(monitor.report().answer) <= 3 and "compiled" in monitor.report().answer[0]


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*should not be instantiated:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:.*torch.jit.script_method.* is deprecated:DeprecationWarning")
@pytest.mark.parametrize("model_type", ["lfm3", "laguna", "mixtral"])
def test_compiled_gates_are_counted_from_their_inputs_as_eager_counts_them(model_type):
    """A model compiled after the monitor exists: its sigmoid and softplus gates and its softmax router are counted
    from inside the compiled code, with the eager monitor's sites, element counts and closed and saturated counts (float32: the
    compiled inputs differ from eager's by reassociation, about 1e-6 relative, and no element here lies that close
    to a threshold), the mean within 1e-5 relative, and no zero-gradient share (their backward is not seen)."""
    eager = GateMonitor()
    model = tiny(model_type, torch.float32)
    with eager:
        _step(model)
    compiled_monitor = GateMonitor()  # before the compile: its graphs carry the counters
    model = tiny(model_type, torch.float32)
    model.forward = torch.compile(model.forward)
    with compiled_monitor:
        _step(model)
    expected = {(r.module, r.fn): r for r in eager.rows()}
    rows = {(r.module, r.fn): r for r in compiled_monitor.rows()}
    assert set(rows) == set(expected) and expected
    for key, r in rows.items():
        e = expected[key]
        assert r.count == e.count
        assert round(r.closed_share * r.count) == round(e.closed_share * e.count)
        assert round(r.saturated_share * r.count) == round(e.saturated_share * e.count)
        assert r.mean_gate == pytest.approx(e.mean_gate, rel=1e-5)
        assert r.zero_grad_share is None and e.zero_grad_share is not None
    assert compiled_monitor.hidden().startswith("1 compiled region ran: their sigmoid and softplus gates and softmax")
    assert "no site's backward was seen" in compiled_monitor.report().answer[0]


class Pointwise(torch.nn.Module):
    """v·σ(3u) and v·softplus(3u): gates whose input compiled code computes with eager's bits (one product)."""

    def forward(self, u, v):
        return v * torch.sigmoid(3.0 * u) + v * torch.nn.functional.softplus(3.0 * u)


@pytest.mark.filterwarnings("ignore:.*should not be instantiated:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:.*torch.jit.script_method.* is deprecated:DeprecationWarning")
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_a_compiled_gate_is_counted_in_the_kernels_own_precision(dtype):
    """Inductor computes a float64 gate in float64 and a bf16 one in float32, rounded (both measured against eager):
    the monitor's counts and mean equal eager's exactly, where a float64 gate recomputed in float32 is off by about
    1e-8 of the mean."""
    g = torch.Generator().manual_seed(0)
    u, v = (torch.randn(64, 33, generator=g, dtype=torch.float64).to(dtype) * 4 for _ in range(2))
    monitor = GateMonitor()  # before the compile: its graph carries the counters
    compiled = torch.compile(Pointwise())
    with monitor:
        compiled(u, v)
    rows = {r.fn: r for r in monitor.rows()}
    for fn, f in (("sigmoid", torch.sigmoid), ("softplus", torch.nn.functional.softplus)):
        a = 3.0 * u  # one rounded product: the same bits compiled or eager, on any CPU
        y = f(a) if dtype == torch.float64 else f(a.float()).to(dtype)  # bf16: by its definition, not eager's kernel
        assert rows[fn].count == y.numel() and rows[fn].dtype == str(dtype).removeprefix("torch.")
        assert rows[fn].mean_gate == torch.sum(y, dtype=torch.float64).item() / y.numel()
        assert rows[fn].closed_share * y.numel() == int((y < 1e-3).sum())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fn", ["sigmoid", "softplus"])
def test_a_compiled_16_bit_gate_is_recomputed_in_float32_rounded_for_every_value(fn, dtype):
    """Whichever form compiled_output picks on this CPU (one op or three), it gives, for every value of the format,
    the bits of the gate computed in float32 and rounded (NaNs aside: their payloads carry no count)."""
    from softcapgrad.training.gatecount import compiled_output

    every = torch.arange(-2 ** 15, 2 ** 15, dtype=torch.int32).to(torch.int16).view(dtype)
    every = every[~torch.isnan(every)]
    f = torch.sigmoid if fn == "sigmoid" else torch.nn.functional.softplus
    bits = compiled_output(fn, dtype)(every).view(torch.int16)
    assert torch.equal(bits, f(every.float()).to(dtype).view(torch.int16))


@pytest.mark.parametrize("fn", ["sigmoid", "softplus"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_small_call_counted_from_python_floats_gives_the_reductions_sums(fn, dtype):
    """count_forward reads a call of at most _LISTED elements out as Python floats: the same closed, saturated and
    range as the reductions give, on values planted at 0, 1, just under 1e-3 and NaN, and a sum within (n − 1)·2⁻⁵³
    of the float64 reduction's, relatively (recursive summation's bound; math.fsum is correctly rounded)."""
    from softcapgrad.training import gatecount
    from softcapgrad.training.gaterows import Step

    f = torch.sigmoid if fn == "sigmoid" else torch.nn.functional.softplus
    g = torch.Generator().manual_seed(0)
    for planted in (False, True):
        x = (torch.randn(gatecount._LISTED, generator=g) * 40).to(dtype)  # σ stored as 0 and 1 in both formats
        if planted:
            x[:3] = torch.tensor([-8.0, -120.0, float("nan")])  # σ(-8) < 1e-3; softplus(-120) stored as 0
        y = f(x)
        listed, reduced = Step(), Step()
        gatecount.count_forward(listed, fn, x, y)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(gatecount, "_LISTED", 0)
            gatecount.count_forward(reduced, fn, x, y)
        for field in ("count", "closed", "saturated", "low", "high"):
            assert getattr(listed, field) == getattr(reduced, field), field
        assert listed.closed and listed.saturated
        if planted:
            assert listed.total != listed.total and reduced.total != reduced.total  # NaN, both
        else:
            bound = (y.numel() - 1) * 2.0**-53 * listed.total
            assert abs(listed.total - reduced.total) <= bound and listed.total == math.fsum(y.double().tolist())


@pytest.mark.parametrize("fn", ["sigmoid", "softmax"])
def test_a_small_backward_counted_from_python_floats_gives_the_definition(fn):
    """Zeros of a small backward read out as Python floats: exactly (grad_input == 0) & (grad_output != 0), with
    -0.0 a zero and NaN in either gradient planted (bf16, the format whose dead zone the gates meet first)."""
    from softcapgrad.training import gatecount
    from softcapgrad.training.gaterows import Step

    g = torch.Generator().manual_seed(1)
    go = torch.randn(gatecount._LISTED, generator=g).bfloat16()
    go[torch.rand(go.numel(), generator=g) < 0.3] = 0
    gi = go * 0.5
    gi[torch.rand(gi.numel(), generator=g) < 0.1] = 0  # 0 from a non-zero upstream: counted
    gi[:4] = torch.tensor([-0.0, float("nan"), 0.0, 0.0])
    go[:4] = torch.tensor([1.0, 0.0, float("nan"), 0.0])  # -0.0 under 1: counted; NaN: counted, not counted
    s = Step()
    gatecount.count_backward(s, fn, go, gi)
    assert s.backward == gi.numel() and s.zero == int(((gi == 0) & (go != 0)).sum()) > 2


def test_bad_options_are_one_line():
    for bad in ({"every": 0}, {"window": 0}, {"window": 1.5}):
        with pytest.raises(ValueError, match="whole number"):
            gatehealth.GateMonitor(**bad)


def _audit(model_type: str):
    src = audit.source(None, model_type, [])
    return audit.audit_model(src, ["eager"], audit.random_ids(src.config, 2, 8, 0), "bfloat16", None, 0, 1.0, "cpu",
                             {"model": model_type, "set": [], "inputs": None})


@pytest.mark.slow
@pytest.mark.parametrize("model_type,expected", [
    ("lfm3", {("model.layers.*.self_attn", "sigmoid", "bfloat16")}),
    ("laguna", {("model.layers.*.self_attn", "softplus", "float32"), ("model.layers.*.mlp.gate", "sigmoid", "float32")}),
])
def test_audit_model_has_a_gate_table_after_the_cap_table(model_type, expected):
    """Every census gate site of the type, in the format it runs in, with that format's measured stuck-open input."""
    report = _audit(model_type)
    keys = [t.key for t in report.tables]
    assert keys.index("gate_health") == keys.index("config") + 1
    rows = next(t.rows for t in report.tables if t.key == "gate_health")
    contracts = next(t.rows for t in report.tables if t.key == "gates")
    assert {(r["module"], r["fn"], r["dtype"]) for r in rows} == expected
    assert {(r["module"], r["fn"]) for r in rows} <= {(c["module"], c["fn"]) for c in contracts if c["kind"] == "gate"}
    for r in rows:
        assert r["stuck_open_from"] == gate_first_zero(r["fn"], r["dtype"], "cpu").open_from
        assert 0 < r["mean_gate"] and r["count"] > 0
    assert len(report.answer) <= 3 and "gate health" in report.answer[-1]


@pytest.mark.slow
def test_audit_model_of_a_model_without_gates_has_a_row_that_says_so():
    report = _audit("llama")
    (row,) = next(t.rows for t in report.tables if t.key == "gate_health")
    assert row["module"] == "(no gate ran)"


@pytest.mark.slow
def test_trainer_callback_logs_gate_health_of_each_watched_step(tmp_path):
    """Every other optimizer step, two micro-batches each (gradient accumulation): one watched step per optimizer
    step in the monitor's history, and its figures in the Trainer's log."""
    pytest.importorskip("accelerate")
    from transformers import Trainer, TrainingArguments

    from softcapgrad.integrations.trainer import DeadZoneCallback

    model = tiny("lfm3", torch.float32)
    rows = torch.randint(0, 256, (16, 12), generator=torch.Generator().manual_seed(2))
    callback = DeadZoneCallback(every=2, gates=True)
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=2,
                             gradient_accumulation_steps=2, logging_steps=1, learning_rate=1e-2, report_to="none",
                             save_strategy="no", use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=[{"input_ids": r, "labels": r} for r in rows],
                      callbacks=[callback])
    trainer.train()
    monitor = callback.gates
    assert monitor.watched == 2
    sites = monitor.rows()
    assert {r.module for r in sites} == {"model.layers.1.self_attn", "model.layers.2.self_attn"}
    for r in sites:
        assert len(r.per_step) == 2 and r.per_step[0][0] == 2 * 2 * 12 * model.config.num_attention_heads
    logged = [(h["step"], h) for h in trainer.state.log_history if any(k.startswith("gates/") for k in h)]
    assert [step for step, _ in logged] == [1, 3]
    last = logged[-1][1]
    for r in sites:
        count, closed, _, backward, zero, mean, _ = r.per_step[-1]
        assert last[f"gates/{r.module}/sigmoid/mean"] == mean
        assert last[f"gates/{r.module}/sigmoid/closed"] == closed / count
    assert last["gates/closing"] == 0.0



def test_the_in_graph_counters_tell_an_activation_from_a_gate():
    """In a compiled graph the pass marks x·σ(αx) (and x·σ(x)) "sigmoid·x", which the gate monitor leaves out, while
    a gate σ(g(x)) multiplying x and a softplus stay gates, and a softmax is a router only when a top-k reads it."""
    from softcapgrad.training import ingraph

    class Both(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.g = torch.nn.Linear(8, 8)

        def forward(self, x):
            routed, _ = torch.topk(F.softmax(self.g(x), dim=-1, dtype=torch.float32), 2, dim=-1)
            weights = F.softmax(self.g(x), dim=-1)  # read by no top-k: attention's kind, not a router
            return x * torch.sigmoid(1.702 * x) + x * torch.sigmoid(x) + x * torch.sigmoid(self.g(x)) \
                + F.softplus(self.g(x)) + weights + routed.sum()

    graph = torch.fx.symbolic_trace(Both()).graph
    for node in graph.nodes:  # as dynamo's graphs carry it, so the pass can tell tensors apart
        node.meta["example_value"] = torch.empty(2, 8)
    assert ingraph.instrument(graph) == 5
    fns = [n.args[1] for n in graph.nodes if n.target is ingraph.OP]
    assert fns == ["router:-1:float32", "sigmoid·x", "sigmoid·x", "sigmoid", "softplus"]


@pytest.mark.slow
@pytest.mark.parametrize("reentrant", [False, True])
def test_a_checkpointed_layer_counts_as_an_unchecked_one(reentrant):
    """Under gradient checkpointing the forward replayed inside the backward is not counted again, and the gates'
    backward (which reads the replayed output) is paired with it: every watched step, whichever watch counted it,
    gives an unchecked model's entries. Non-reentrant, the gate is read by its node from the third step on, its
    output computed again from its input rather than unpacked from the node (unpacking would run the layer's
    recomputation in the middle of the forward and count its gates twice); reentrant, the forward runs without
    autograd, so no node: the calls are watched."""
    plain, checked = tiny("lfm3"), tiny("lfm3")
    checked.activation_checkpointing_enable({"use_reentrant": reentrant})
    monitors = [GateMonitor(), GateMonitor()]
    for _ in range(4):
        for model, monitor in zip((plain, checked), monitors):
            with monitor.step(), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # use_cache turned off by checkpointing
                _step(model)
    assert (monitors[1]._feeds is not None) is (not reentrant) and monitors[1].unfound == 0
    expected = {(r.module, r.fn): r.per_step for r in monitors[0].rows()}
    got = {(r.module, r.fn): r.per_step for r in monitors[1].rows()}
    assert set(got) == set(expected) and got == expected
    assert all(step[3] and step[4] for steps in got.values() for step in steps)  # backward elements, zeros among them


def test_the_probe_walks_the_gate_module_s_own_graph_only(monkeypatch):
    """The probe's walk, which must see every node that could read the gate's input, ends at the module's inputs:
    on tiny lfm3 the attention module's graph is under 100 nodes and the whole step's about 400, so with at most 150
    nodes to visit the gates are still found (a walk past the inputs would run out and find none)."""
    from softcapgrad.training import gategraph

    monkeypatch.setattr(gategraph, "_MOST", 150)
    model, monitor = tiny("lfm3"), GateMonitor()
    for _ in range(2):
        with monitor.step():
            _step(model)
    assert monitor._feeds is not None and len(monitor._feeds) == 2
