"""scan against a raw numpy (and torch) read of every value, at several sizes, warm and cold page cache, its
memory, and a fresh process's CPU time on 256 MiB (the stacks' dead zones measured, or kept in the cache)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from benchmarks.timing import PY, ROOT, Figure, child_cpu, interleaved


# --- scan --------------------------------------------------------------------------------------


_MEMORY_PROBE = """
import sys, threading, tracemalloc
from pathlib import Path
from softcapgrad.files import scan
path = Path(sys.argv[1])
zones = scan.dead_zones(["eager-bf16"], 30.0)
def anon():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssAnon"))
start, peak, stop = anon(), [0], threading.Event()
def sample():
    while not stop.is_set():
        peak[0] = max(peak[0], anon() - start)
        stop.wait(0.002)
thread = threading.Thread(target=sample, daemon=True)
thread.start()
tracemalloc.start()
scan.scan_sources(scan.select(scan.open_sources(path), None, path), 30.0, zones)
traced = tracemalloc.get_traced_memory()[1]
stop.set(); thread.join()
print(peak[0], traced)
"""


def _scan_memory(path: Path) -> tuple[int, int]:
    """In a fresh process, after the imports: the peak of anonymous resident memory (RssAnon, which
    leaves out the mapped file's pages) above its level before the scan, sampled every 2 ms, and
    tracemalloc's peak (Python and numpy allocations), in bytes."""
    out = subprocess.run([PY, "-c", _MEMORY_PROBE, str(path)], check=True, capture_output=True, text=True, cwd=ROOT).stdout
    anon, traced = out.split()
    return int(anon), int(traced)


def _drop_cache(path: Path) -> None:
    """Evict the file from the page cache (posix_fadvise DONTNEED on this file only)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _write_files(folder: Path, mib: int) -> dict[str, Path]:
    """Logits N(0, 40²): float32 .npy and .pt, bfloat16 .safetensors (a checkpoint's format), ``mib`` MiB each."""
    import numpy as np
    import torch
    from safetensors.torch import save_file

    n32 = (mib << 20) // 4
    rng = np.random.default_rng(0)
    npy = folder / f"logits{mib}.npy"
    data = np.lib.format.open_memmap(npy, mode="w+", dtype=np.float32, shape=(n32,))
    for start in range(0, n32, 1 << 24):
        data[start:start + (1 << 24)] = rng.normal(0, 40, min(1 << 24, n32 - start)).astype(np.float32)
    data.flush()
    t = torch.from_numpy(np.asarray(data))
    torch.save({"logits": t}, folder / f"logits{mib}.pt")
    half = torch.empty(2 * n32, dtype=torch.bfloat16)
    half[:n32], half[n32:] = t.to(torch.bfloat16), (-t).to(torch.bfloat16)
    save_file({"weights": half}, str(folder / f"weights{mib}.safetensors"))
    del data, t, half
    return {".npy float32": npy, ".safetensors bfloat16": folder / f"weights{mib}.safetensors",
            ".pt float32": folder / f"logits{mib}.pt"}


def _raw_numpy(path: Path) -> None:
    """The baseline: every value read through the kind's own reader and summed by numpy, one thread."""
    import numpy as np

    def total(a) -> None:
        a = np.asarray(a)
        np.add.reduce(a.view(f"u{a.dtype.itemsize}"), dtype=np.uint64)

    if path.suffix == ".npy":
        m = np.load(path, mmap_mode="r")
        for i in range(0, m.size, 1 << 20):
            total(m[i:i + (1 << 20)])
    elif path.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(path), framework="numpy") as f:
            for k in f.keys():
                part = f.get_slice(k)
                for i in range(0, part.get_shape()[0], 1 << 20):
                    total(part[i:i + (1 << 20)])
    else:
        import torch

        for t in torch.load(path, mmap=True, weights_only=True).values():
            flat = t.reshape(-1)
            for i in range(0, flat.numel(), 1 << 20):
                total(flat[i:i + (1 << 20)].view({2: torch.int16, 4: torch.int32}[t.element_size()]).numpy())


def _raw_torch(path: Path) -> None:
    """A second reference: torch's multi-threaded sum over the kind's reader (none for .npy)."""
    import torch

    if path.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            for k in f.keys():
                f.get_tensor(k).sum()
    elif path.suffix == ".pt":
        for t in torch.load(path, mmap=True, weights_only=True).values():
            t.sum()


def scan() -> list[Figure]:
    from softcapgrad.files import scan as scanning

    sizes = [int(x) for x in os.environ.get("BENCH_SCAN_MIB", "128,512,1024").split(",")]
    zones = scanning.dead_zones(["eager-bf16"], 30.0)

    def run_scan(path: Path) -> None:
        scanning.scan_sources(scanning.select(scanning.open_sources(path), None, path), 30.0, zones)

    out = []
    for mib in sizes:
        folder = Path(tempfile.mkdtemp(prefix="softcapgrad-bench-"))  # the system temporary folder (TMPDIR)
        try:
            for kind, path in _write_files(folder, mib).items():
                size = path.stat().st_size / 1e9  # GB
                runs = {"raw": lambda: _raw_numpy(path), "scan": lambda: run_scan(path)}
                if path.suffix != ".npy":
                    runs["torch"] = lambda: _raw_torch(path)
                _raw_numpy(path)  # warm the page cache
                warm = interleaved(runs, repeat=3)
                cold = interleaved(runs, repeat=3, before=lambda _: _drop_cache(path))
                for mode, t in (("warm", warm), ("cold", cold)):
                    out.append(Figure(f"scan {mib} MiB {kind}, {mode} cache, GB/s vs numpy raw read",
                                      size / t["scan"], size / t["raw"], ">= 0.33x", 1 / 3, "GB/s", True))
                    if "torch" in t:
                        out.append(Figure("  the same vs torch's multi-threaded sum", size / t["scan"], size / t["torch"],
                                          unit="GB/s"))
                anon, traced = _scan_memory(path)
                out.append(Figure(f"  scan's own memory, fresh process: peak RssAnon above start (traced {traced / 2**20:.1f})",
                                  anon / 2**20, unit="MiB"))
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    return out


_NUMPY_PASS = "import numpy as np, sys; m = np.load(sys.argv[1], mmap_mode='r'); " \
              "[float(np.abs(m[i:i + (1 << 22)]).max()) for i in range(0, m.size, 1 << 22)]"


def scan_imports() -> list[Figure]:
    """CPU time of `scan` on a 256 MiB float32 .npy, a fresh process each: against a recorded stack (numpy alone:
    no torch is imported) and against the default, live torch-eager-cpu, measured by torch (an empty cache) or
    read from the dead-zone cache (numpy alone), beside a numpy pass over the same file and `import torch` alone."""
    import numpy as np

    folder = Path(tempfile.mkdtemp(prefix="softcapgrad-bench-"))
    try:
        path = folder / "logits256.npy"
        n = (256 << 20) // 4
        data = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n,))
        rng = np.random.default_rng(0)
        for start in range(0, n, 1 << 24):
            data[start:start + (1 << 24)] = rng.normal(0, 40, min(1 << 24, n - start)).astype(np.float32)
        data.flush()
        del data
        cli = [PY, "-m", "softcapgrad", "scan", str(path)]
        floor = child_cpu([PY, "-c", _NUMPY_PASS, str(path)])
        kept = {**os.environ, "XDG_CACHE_HOME": str(folder / "kept")}
        subprocess.run(cli, check=True, stdout=subprocess.DEVNULL, env=kept)  # measures once, fills the cache
        return [
            Figure("numpy pass over a 256 MiB .npy (CPU time, baseline)", floor),
            Figure("python -c 'import torch' (CPU time)", child_cpu([PY, "-c", "import torch"])),
            Figure("scan 256 MiB .npy, a recorded stack (no torch), CPU", child_cpu(
                [*cli, "--path", "torch-eager-cuda"]), floor),
            Figure("scan 256 MiB .npy, default torch-eager-cpu measured (torch, empty cache), CPU",
                   child_cpu(cli, env=lambda: {**os.environ, "XDG_CACHE_HOME": tempfile.mkdtemp(dir=folder)}), floor),
            Figure("scan 256 MiB .npy, default torch-eager-cpu from the cache (no torch), CPU",
                   child_cpu(cli, env=lambda: kept), floor,
                   "<= 3x", 3.0),
        ]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
