"""scan reads any tensor a user saves: transposed, strided, a Parameter; a file cut short is one line.

Each layout is compared with the same values saved contiguous: every count, quantile and histogram
bin must be the same, since the scan is defined on the values, not on how they are laid out.
"""

import json
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from softcapgrad.files import tensorfiles  # noqa: E402


def _scan(cli, path, *extra):
    code, data, _, err = cli("scan", str(path), "--cap", "30", "--path", "all", "--json", *extra)
    assert code == 0, err
    return data


def _same_scan(a: dict, b: dict) -> None:
    for key in ("dead", "quantiles", "histograms"):
        assert a[key] == b[key], key
    strip = lambda rows: [{k: v for k, v in r.items() if k != "name"} for r in rows]  # noqa: E731
    assert strip(a["rows"]) == strip(b["rows"])


@pytest.mark.parametrize("make", [
    lambda base: base.reshape(64, 48).t(),  # a transposed weight
    lambda base: base[::3],  # a strided slice
    lambda base: base.reshape(8, 6, 64).permute(2, 0, 1)[:, ::2],  # permuted and strided in two dimensions
    lambda base: base.reshape(3, 1024).t(),  # many short rows
])
def test_non_contiguous_tensors_scan_like_their_contiguous_copy(cli, tmp_path, make):
    base = torch.linspace(-300, 300, 3072, dtype=torch.float32)
    t = make(base)
    assert not t.is_contiguous()
    torch.save({"t": t}, tmp_path / "strided.pt")
    torch.save({"t": t.contiguous()}, tmp_path / "plain.pt")
    _same_scan(_scan(cli, tmp_path / "strided.pt"), _scan(cli, tmp_path / "plain.pt"))


@pytest.mark.parametrize("make", [
    lambda t: t.reshape(40, 50).t(),  # rows of 40 values > CHUNK
    lambda t: t[::7],  # a long stride
    lambda t: t.reshape(10, 4, 50).permute(2, 0, 1)[::3, 1:, ::2],
])
def test_long_non_contiguous_rows_are_split_below_a_chunk(monkeypatch, tmp_path, make):
    monkeypatch.setattr(tensorfiles, "CHUNK", 16)
    monkeypatch.setattr(tensorfiles, "SPAN", 64)
    base = torch.arange(40 * 50, dtype=torch.float32)
    (tmp_path / "storage").write_bytes(b"pad!" + base.numpy().tobytes())
    t = make(base)
    loads = tensorfiles.strided_chunks(tmp_path / "storage", 4, t.storage_offset(), tuple(t.shape), t.stride(),
                                        np.dtype(np.float32))
    chunks = [load() for load in loads]
    assert max(c.size for c in chunks) <= 16
    assert np.array_equal(np.concatenate(chunks), t.reshape(-1).numpy())


def test_a_saved_parameter_is_scanned_like_its_tensor(cli, tmp_path):
    values = torch.linspace(-200, 200, 1000)
    torch.save({"p": torch.nn.Parameter(values.clone())}, tmp_path / "param.pt")
    torch.save({"p": values.clone()}, tmp_path / "plain.pt")
    _same_scan(_scan(cli, tmp_path / "param.pt"), _scan(cli, tmp_path / "plain.pt"))


KINDS = (".npy", ".safetensors", ".pt")


def test_a_file_cut_short_while_it_is_read_is_one_line_not_a_signal(tmp_path):
    """Each kind of file is opened, then truncated before its data is read, as a writer that rewrites it would do.

    Run in one child process, one line per kind: a memory-mapped read of the lost pages would kill it with SIGBUS."""
    code = f"""
import os, sys
import numpy as np, torch
from softcapgrad.core.checks import InputError
from softcapgrad.files import scan, tensorfiles
from pathlib import Path
for kind in {KINDS!r}:
    path = os.path.join({str(tmp_path)!r}, "big" + kind)
    values = np.linspace(-200, 200, 3 * tensorfiles.CHUNK, dtype=np.float32)
    if path.endswith(".npy"):
        np.save(path, values)
    elif path.endswith(".pt"):
        torch.save({{"x": torch.from_numpy(values)}}, path)
    else:
        from safetensors.numpy import save_file
        save_file({{"x": values}}, path)
    sources = scan.open_sources(Path(path))
    os.truncate(path, os.path.getsize(path) // 2)
    try:
        scan.scan_sources(sources, 30.0, scan.dead_zones(["torch-eager-cpu"], 30.0))
    except InputError as err:
        print(kind, "refused:", err, flush=True)
    else:
        print(kind, "read", flush=True)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr[-500:])
    lines = proc.stdout.splitlines()
    assert [line.split(" ", 1)[0] for line in lines] == list(KINDS), proc.stdout
    for kind, line in zip(KINDS, lines):
        assert line.startswith(f"{kind} refused:") and "cut short" in line, line


def test_infinity_is_the_largest_magnitude_in_the_answer(cli, tmp_path):
    np.save(tmp_path / "inf.npy", np.array([1.0, np.inf, -0.5], dtype=np.float32))
    data = _scan(cli, tmp_path / "inf.npy")
    largest = [s for s in data["answer"] if "largest" in s]
    assert largest and "∞" in largest[0] and "1 value is ±inf" in largest[0]
    assert data["rows"][0]["inf_count"] == 1 and data["rows"][0]["max_abs"] == 1.0
    only_inf = tmp_path / "only.npy"
    np.save(only_inf, np.array([-np.inf, np.inf], dtype=np.float32))
    assert any(s.startswith("The largest |a| is ∞: 2 values are ±inf.") for s in _scan(cli, only_inf)["answer"])


def test_scan_json_of_a_parameter_file_is_valid(tmp_path):
    """The command line in a child process, as a user runs it: exit 0 and one JSON object."""
    torch.save(torch.nn.Parameter(torch.full((5,), 200.0)), tmp_path / "p.pt")
    proc = subprocess.run([sys.executable, "-m", "softcapgrad", "scan", str(tmp_path / "p.pt"), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["rows"][0]["count"] == 5
