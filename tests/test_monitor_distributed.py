"""monitor.all_reduce() on two gloo ranks on the CPU, each rank with its own data: the totals on every rank equal
the sum of both ranks' brute forces, plain, under DDP and under FSDP2's fully_shard."""

import os
import socket

import pytest
import torch

pytest.importorskip("transformers")

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from monitoring import _expected, _rows, _step, confident, ids, tiny  # noqa: E402
from softcapgrad.stacks.watch import DeadZoneMonitor  # noqa: E402

WORLD = 2


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _batch(rank: int):
    return ids(shape=(2, 12 + 4 * rank)) if rank else ids()  # different tokens and lengths per rank


def _sum(parts: list[dict]) -> dict:
    out: dict = {}
    for part in parts:
        for module, (n, b, s, z, largest) in part.items():
            n0, b0, s0, z0, m0 = out.get(module, (0, 0, 0, 0, 0.0))
            out[module] = (n0 + n, b0 + b, s0 + s, z0 + z, max(m0, largest))
    return out


def _brute_force(rank: int) -> dict:
    """This rank's counts, found without the monitor or any process group."""
    from monitoring import Capture

    model = confident(tiny("gemma2"))
    with pytest.MonkeyPatch.context() as patch:
        capture = Capture(model, patch)
        _step(model, _batch(rank))
    return _expected(capture)


WRAPS = ("plain", "ddp", "fsdp2")


def _worker(rank: int, port: int, out: str) -> None:
    """Every wrap in turn on one process group: two ranks started once, not once per wrap."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        expected = _sum([_brute_force(r) for r in range(WORLD)])
        own = _brute_force(rank)
        for wrap in WRAPS:
            model = confident(tiny("gemma2"))
            if wrap == "ddp":
                model = torch.nn.parallel.DistributedDataParallel(model)
            elif wrap == "fsdp2":
                from torch.distributed.fsdp import fully_shard

                for layer in model.model.layers:
                    fully_shard(layer)
                fully_shard(model)
            monitor = DeadZoneMonitor()
            with monitor:
                _step(model, _batch(rank))
            mine = _rows(monitor)
            monitor.all_reduce()
            total = _rows(monitor)
            with pytest.raises(RuntimeError, match="already called"):  # a second sum would count the others twice
                monitor.all_reduce()
            result = {"mine": mine, "total": total, "expected": expected, "own": own,
                      "table": monitor.table(width=100), "dtypes": sorted({r.dtype for r in monitor.rows()})}
            torch.save(result, os.path.join(out, f"{wrap}-rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_all_reduce_sums_both_ranks(tmp_path):
    mp.spawn(_worker, args=(_port(), str(tmp_path)), nprocs=WORLD, join=True)
    for wrap in WRAPS:
        results = [torch.load(tmp_path / f"{wrap}-rank{r}.pt") for r in range(WORLD)]
        for result in results:
            assert result["mine"] == result["own"], wrap
            assert result["total"] == result["expected"], wrap
            assert result["dtypes"] == ["bfloat16"], wrap
        assert results[0]["total"] == results[1]["total"] and results[0]["table"] == results[1]["table"], wrap
        assert results[0]["mine"] != results[1]["mine"], wrap  # each rank saw its own data
        zero = sum(z for *_, z, _ in results[0]["total"].values())
        assert zero > 0, wrap
