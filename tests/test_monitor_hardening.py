"""The monitor's edges: re-entry, nesting, a step that raises, in-place caps in compiled code, one rank missing
from all_reduce(), and the step that watches only the sites found (counts equal to the mode over every op)."""

import os
import socket
import subprocess
import sys
import textwrap

import pytest
import torch

from softcapgrad.stacks import registry
from softcapgrad.stacks.watch import DeadZoneMonitor

pytestmark = [pytest.mark.filterwarnings("ignore:.*should not be instantiated:DeprecationWarning"),
              pytest.mark.filterwarnings("ignore:.*torch.jit.script_method.* is deprecated:DeprecationWarning")]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _values(n: int = 4096) -> torch.Tensor:
    """bf16 pre-cap values on both sides of the bf16 horizons at c = 30."""
    return (torch.randn(n, generator=torch.Generator().manual_seed(0)) * 300).to(torch.bfloat16)


def _line(code) -> str:
    return f"test_monitor_hardening.py:{code.co_firstlineno + 1}"


# --- 1. re-entry and nesting ---------------------------------------------------------------------


def test_reentered_monitor_counts_once_and_compiled_code_survives_it():
    """Entering an active monitor again is a no-op (counted once); dynamo's guard hook never calls itself, so the
    next compiled cache hit after the blocks runs (it aborted the process with a RecursionError before)."""
    code = textwrap.dedent("""
        import torch
        from softcapgrad.stacks.watch import DeadZoneMonitor
        f = torch.compile(lambda a: 30.0 * torch.tanh(a / 30.0))
        a = torch.randn(64)
        m = DeadZoneMonitor(every=2)
        f(a)
        with m:
            with m:
                f(a)
            with m.step():
                f(a)
        print([(r.calls, r.count) for r in m.rows()], m.watched, m.compiled_regions > 0)
        f(a)
        print("survived")
    """)
    env = {**os.environ, "PYTHONPATH": ROOT}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["[(2, 128)] 1 True", "survived"]


def test_reentry_in_eager_code_counts_each_element_once():
    x = torch.linspace(-40, 40, 81)
    monitor = DeadZoneMonitor()
    with monitor:
        with monitor.step():
            with monitor:
                torch.sigmoid(x)
    (row,) = monitor.rows()
    assert (row.calls, row.count, monitor.watched, monitor.steps) == (1, 81, 1, 1)
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    assert _get_current_dispatch_mode_stack() == []


def _sigmoid_here(x):
    return torch.sigmoid(x)


def test_nested_monitors_each_name_the_real_call_site():
    x = torch.linspace(-40, 40, 81)
    with DeadZoneMonitor() as outer:
        with DeadZoneMonitor() as inner:
            _sigmoid_here(x)
    for monitor in (outer, inner):
        (row,) = monitor.rows()
        assert (row.site, row.count) == (_line(_sigmoid_here.__code__), 81)


# --- 3. in-place caps inside compiled code -------------------------------------------------------


def _in_place_cap(a):
    return 30.0 * a.clone().div_(30.0).tanh_()


def _two_caps(a):
    return 30.0 * torch.tanh(a / 30.0) + _in_place_cap(a)


def test_in_place_cap_in_compiled_code_is_counted_on_its_input():
    a = _values().requires_grad_(True)
    first = registry.first_zero("torch-compile-cpu", "bfloat16", 30.0).value
    dead = int((a.detach().abs() >= first).sum())
    DeadZoneMonitor()  # the counting pass, before the compile
    for fn in (_in_place_cap, _two_caps):
        compiled = torch.compile(fn, dynamic=False)
        with DeadZoneMonitor() as monitor:
            compiled(a).sum().backward()
        rows = {r.site: r for r in monitor.rows()}
        in_place = rows[_line(_in_place_cap.__code__)]
        assert (in_place.path, in_place.cap, in_place.count, in_place.dead) == ("torch-compile-cpu", 30.0, a.numel(),
                                                                                 dead) and dead > 0
        assert in_place.max_abs == float(a.detach().abs().max())  # read before the division overwrote it
        assert len(rows) == (2 if fn is _two_caps else 1)


def test_in_place_cap_in_eager_code_equals_the_out_of_place_one():
    a = _values().requires_grad_(True)
    counts = []
    for fn in (_in_place_cap, lambda a: 30.0 * torch.tanh(a / 30.0)):
        with DeadZoneMonitor() as monitor:
            fn(a).sum().backward()
        (row,) = monitor.rows()
        counts.append((row.cap, row.count, row.saturated, row.zero_grad, row.max_abs_input))
    assert counts[0] == counts[1] and counts[0][2] > 0


# --- 4. all_reduce() called on one rank only -----------------------------------------------------


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _one_rank_reduces(rank: int, port: int, out: str) -> None:
    import datetime
    import time

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    with DeadZoneMonitor() as monitor:
        torch.sigmoid(torch.linspace(-40, 40, 81))
    if rank == 0:  # rank 1 never calls all_reduce()
        start = time.monotonic()
        try:
            monitor.all_reduce(timeout=2.0)
            said = "no error"
        except RuntimeError as err:
            said = str(err)
        with open(os.path.join(out, "rank0.txt"), "w") as f:
            f.write(f"{time.monotonic() - start:.1f}\n{said}")


def test_all_reduce_on_one_rank_names_the_missing_rank_instead_of_hanging(tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(_one_rank_reduces, args=(_port(), str(tmp_path)), nprocs=2, join=True)
    seconds, said = (tmp_path / "rank0.txt").read_text().split("\n", 1)
    assert said.startswith("all_reduce(): rank 1 did not call it within 2 s") and "\n" not in said
    assert float(seconds) < 30  # the store's short wait, not the process group's 60 s


# --- 2. a Trainer step that raises ---------------------------------------------------------------


def test_trainer_step_that_raises_leaves_no_monitor_behind(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
    from transformers import Trainer, TrainingArguments

    import softcapgrad
    from monitoring import ids, tiny

    model = tiny("gemma2")
    batch = ids(shape=(4, 12))

    def fail(module, args, out):  # the watched step raises in its forward, after the first layer's cap ran
        raise KeyboardInterrupt

    failing = model.model.layers[1].register_forward_hook(fail)
    callback = softcapgrad.DeadZoneCallback(every=1)
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=2, report_to="none",
                             save_strategy="no", use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=[{"input_ids": r, "labels": r} for r in batch],
                      callbacks=[callback])
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    assert _get_current_dispatch_mode_stack() == []
    watched = callback.monitor
    counted = sum(r.count for r in watched.rows())
    assert counted > 0  # the step's forward was watched
    failing.remove()
    model(input_ids=batch[:2])  # a plain forward after the failed run
    assert sum(r.count for r in watched.rows()) == counted


# --- 5. after the first watched step, only the sites found --------------------------------------


def _counts(monitor):
    return sorted((r.module, r.site, r.fn, r.dtype, r.path, r.cap, r.calls, r.recomputed, r.count, r.saturated, r.dead,
                   r.backward_count, r.zero_grad, r.max_abs_input) for r in monitor.rows())


@pytest.mark.parametrize("checkpointing", [None, True, False])
def test_sites_only_counts_equal_the_mode_over_every_op(checkpointing):
    pytest.importorskip("transformers")
    from monitoring import _step, confident, ids, tiny

    model = confident(tiny("gemma2")).train()
    if checkpointing is not None:
        model.activation_checkpointing_enable({"use_reentrant": checkpointing})
    batch = ids()
    with DeadZoneMonitor(learn=False) as every_op:
        _step(model, batch)
    monitor = DeadZoneMonitor()
    with monitor.step():
        _step(model, batch)
    assert monitor.sites_only
    learnt = DeadZoneMonitor(learnt_from=monitor)
    with learnt:
        _step(model, batch)
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

        assert _get_current_dispatch_mode_stack() == []  # between the sites: no mode at all
    assert _counts(learnt) == _counts(every_op)
    assert sum(r.zero_grad for r in learnt.rows()) > 0 and sum(r.saturated for r in learnt.rows()) > 0
    with monitor.step():  # the same monitor's second step: sites only, the sums of two equal steps
        _step(model, batch)
    twice = {r.module: (r.count, r.saturated, r.zero_grad) for r in monitor.rows()}
    assert twice == {r.module: (2 * r.count, 2 * r.saturated, 2 * r.zero_grad) for r in every_op.rows()}


class _Capped(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(64, 64, dtype=torch.bfloat16)

    def forward(self, a):
        return 30.0 * torch.tanh(self.proj(a) * 40.0 / 30.0)


def test_sites_only_in_compiled_code_needs_no_mode_and_keeps_its_counts():
    """A compiled model's caps run in its graph, and their counters call the monitor: no mode, the same counts."""
    torch.manual_seed(0)
    model = _Capped()
    DeadZoneMonitor()  # the counting pass, before the compile
    compiled = torch.compile(model, dynamic=False)
    a = _values(8 * 64).reshape(8, 64) / 100
    steps = []
    monitor = DeadZoneMonitor()
    for _ in range(2):
        with DeadZoneMonitor(learn=False) as every_op:
            compiled(a).sum().backward()
        with monitor.step():
            compiled(a).sum().backward()
            if monitor.sites_only:
                from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

                assert _get_current_dispatch_mode_stack() == []
        steps.append(_counts(every_op))
    assert monitor.sites_only and steps[0] == steps[1] and steps[0][0][4] == "torch-compile-cpu"
    (row,) = monitor.rows()
    assert (row.calls, row.count, row.dead) == (2, 2 * steps[0][0][8], 2 * steps[0][0][10])


def test_sites_only_counts_a_cap_outside_modules_with_every_op():
    x = torch.linspace(-40, 40, 81, requires_grad=True)
    monitor = DeadZoneMonitor()
    for _ in range(2):
        with monitor.step():
            torch.sigmoid(x).sum().backward()
    assert not monitor.sites_only
    (row,) = monitor.rows()
    assert (row.calls, row.count, row.backward_count) == (2, 162, 162)


# --- a module outside the model's tree (the census's glm5_next) ---------------------------------


class _FreshGate(torch.nn.Module):
    def forward(self, x):
        return x * torch.nn.Sigmoid()(x)  # a new module per call, as transformers' ACT2FN["sigmoid"] gives


def test_module_outside_the_model_tree_is_named_by_its_class():
    x, gate = torch.linspace(-40, 40, 81), _FreshGate()
    monitor = DeadZoneMonitor()
    for _ in range(2):
        with monitor.step():
            gate(x)
    (row,) = monitor.rows()
    assert (row.module, row.fn, row.calls, row.count) == ("Sigmoid", "sigmoid", 2, 162)
